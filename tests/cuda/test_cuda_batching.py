"""The batching scheduler on a CUDA model (BLOCKBATCH_CUDA_BATCHING=graphs, the default since the
2026-12-04 GPU runs passed these; =1 eager steps): requests of mixed policies, branch sets,
gen_lengths and prompt lengths decode together in packed forwards on one stream; every request
finishes, in input order, with the
tokens of its decode alone (float32: GEMMs of other row counts may round differently, so a few
requests may differ; the share is asserted and printed), with eager packed steps (=1) and with
padded steps replayed from CUDA graphs (=graphs: graphs captured and replayed); streaming and
cancellation work; with it unset the scheduler takes a CUDA model, with "0" it refuses one by name
(Engine.generate then decodes one by one); and with
BLOCKBATCH_BATCH_INVARIANT=1, bf16 batched results equal batch 1 exactly. Skipped cleanly without a GPU."""

from __future__ import annotations

import random

import pytest
import torch

from blockbatch import DecodeOptions, Engine, settings
from blockbatch.decoding import run_decode_batch
from helpers.batching import COUNTERS, mixed_requests

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
    settings.candidate_mark("BLOCKBATCH_CUDA_BATCHING"),
]


@pytest.fixture(scope="module", params=["llada", "dream"])
def engine(request, tmp_path_factory):
    from blockbatch.random_checkpoint import make_random_checkpoint

    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "llada":
        make_random_checkpoint(folder, seed=3, logit_scale=5.0, d_model=64, n_layers=2, vocab_size=97)
    else:
        make_random_checkpoint(folder, seed=3, logit_scale=5.0, vocab_size=64, family="dream")
    return Engine.from_pretrained(folder, device="cuda")


@pytest.fixture(params=["1", "graphs"])
def batching(request, monkeypatch):
    """Eager packed steps, and padded packed steps replayed from CUDA graphs."""
    monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", request.param)
    return request.param


def test_cuda_batching_is_the_default_and_0_opts_out(engine, monkeypatch):
    monkeypatch.delenv("BLOCKBATCH_CUDA_BATCHING", raising=False)
    assert engine.batches
    engine.generate([[3, 1, 4], [1, 5, 9, 2]], DecodeOptions(gen_length=32), max_batch=2)
    assert engine.last_batch_stats["packed_forwards"] < engine.last_batch_stats["request_forwards"]
    monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", "0")
    assert not engine.batches
    prompt = torch.tensor([3, 1, 4, 1, 5], device="cuda")
    with pytest.raises(ValueError, match="BLOCKBATCH_CUDA_BATCHING=1"):
        run_decode_batch(engine.model.obj, [prompt, prompt], [DecodeOptions(gen_length=32)] * 2, 2)
    with pytest.raises(ValueError, match="BLOCKBATCH_CUDA_BATCHING=1"):
        engine.scheduler(2)
    # Engine.generate falls back to one by one: the same results as each request alone
    got = engine.generate([[3, 1, 4], [1, 5, 9, 2]], DecodeOptions(gen_length=32), max_batch=2)
    assert engine.last_batch_stats is None  # no batch
    assert [g.raw_ids for g in got] == [
        engine.generate([p], DecodeOptions(gen_length=32))[0].raw_ids for p in ([3, 1, 4], [1, 5, 9, 2])
    ]
    monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", "yes")
    with pytest.raises(ValueError, match="BLOCKBATCH_CUDA_BATCHING must be '0', '1' or 'graphs'"):
        engine.batches


def test_cuda_batched_requests_agree_with_batch_one(engine, batching):
    rng = random.Random(5)
    reqs = mixed_requests(rng, engine.config.vocab_size, engine.config.mask_token_id, 16, engine.config.family)
    alone = [engine.generate([p], o)[0] for p, o in reqs]  # one by one, with CUDA graphs
    got = engine.generate([p for p, _ in reqs], [o for _, o in reqs], max_batch=16)
    stats = engine.last_batch_stats
    assert stats["packed_forwards"] < stats["request_forwards"]  # the requests shared forwards
    if batching == "graphs":  # every packed forward padded; repeated buckets replayed
        assert stats["padded_forwards"] >= stats["packed_forwards"]
        assert stats["graph_captures"] > 0 and stats["graph_replays"] > 0
        print(
            f"graphs: {stats['graph_captures']} captured, {stats['graph_replays']} of {stats['padded_forwards']} "
            f"padded forwards replayed"
        )
    else:
        assert stats["padded_forwards"] == stats["graph_replays"] == 0
    equal = 0
    same_tokens = 0
    for i, (g, a) in enumerate(zip(got, alone)):
        assert g.prompt_ids == a.prompt_ids and len(g.raw_ids) == len(a.raw_ids), f"request {i}"
        assert g.stats["graph_captures"] == 0  # eager in the scheduler
        same_tokens += sum(x == y for x, y in zip(g.raw_ids, a.raw_ids))
        equal += g.raw_ids == a.raw_ids and all(g.stats[k] == a.stats[k] for k in COUNTERS)
    total = sum(len(a.raw_ids) for a in alone)
    print(
        f"{engine.config.family} float32 CUDA ({batching}), 16 requests at max_batch 16: {equal}/16 equal to batch 1, "
        f"token agreement {same_tokens / total:.4f}"
    )
    assert equal >= 12 and same_tokens / total >= 0.95


def test_cuda_stream_and_cancel(engine, batching):
    o = DecodeOptions(policy="blockbatch", gen_length=64)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7]]
    final = {}
    streamed = {i: [] for i in range(3)}
    for item in engine.stream(prompts, o, max_batch=3, blocks=True):
        assert item.error is None, item.error
        if item.generation is None:
            streamed[item.index] += item.new_ids
        else:
            final[item.index] = item.generation
    assert sorted(final) == [0, 1, 2]
    for i, g in final.items():
        assert g.raw_ids[: len(streamed[i])] == streamed[i]  # every streamed prefix is the result's
    # Closing the stream early cancels the rest; the scheduler is usable again afterwards
    long = DecodeOptions(policy="dual", gen_length=256, block_length=32, threshold=0.999)
    it = engine.stream([[1, 2, 3]] * 4, long, max_batch=4)
    next(it, None)
    it.close()
    again = engine.generate(prompts, o, max_batch=3)  # packs may differ by timing: agreement, not bits
    same = sum(x == y for i, g in enumerate(again) for x, y in zip(g.raw_ids, final[i].raw_ids))
    assert same >= 0.9 * sum(len(g.raw_ids) for g in again)


def test_batch_invariant_mode_bf16_equals_batch_one(tmp_path, monkeypatch):
    """BLOCKBATCH_BATCH_INVARIANT=1 (GEMMs in fixed 256-row chunks, unsplit attention): in bf16, every
    request batched with 15 others has exactly the tokens and counters of its batch-1 run."""
    from blockbatch.random_checkpoint import make_random_checkpoint

    monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", "1")
    monkeypatch.setenv("BLOCKBATCH_BATCH_INVARIANT", "1")
    make_random_checkpoint(tmp_path, seed=3, logit_scale=5.0, d_model=128, n_layers=2, vocab_size=97)
    engine = Engine.from_pretrained(tmp_path, device="cuda", dtype=torch.bfloat16)
    reqs = mixed_requests(random.Random(7), engine.config.vocab_size, engine.config.mask_token_id, 16, "llada")
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    got = engine.generate([p for p, _ in reqs], [o for _, o in reqs], max_batch=16)
    for i, (g, a) in enumerate(zip(got, alone)):
        assert g.raw_ids == a.raw_ids, f"request {i}: bf16 tokens differ from batch 1 in the batch-invariant mode"
        assert all(g.stats[k] == a.stats[k] for k in COUNTERS), f"request {i}: counters differ"
