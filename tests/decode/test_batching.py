"""Many requests at once (torch.ops.blockbatch.decode_batch, Engine.generate(max_batch=N)): every
request's tokens and counters equal its batch-1 decode, float32 on the CPU, exactly, whatever
shares its forwards (mixed prompt lengths, policies, branch sets, gen_lengths, families; requests
joining as others finish)."""

from __future__ import annotations

import random

import pytest
import torch

from blockbatch import families
from blockbatch.decoding import run_decode_batch
from helpers.batching import small_engine, COUNTERS, mixed_requests as _mixed_requests, same as _same


def _run(result) -> int:
    """The forwards a request ran: its NFE less the authors' prefill and store forwards that SDAR's count
    holds and the engine folds into its next forward (docs/sdar.md)."""
    return result.stats["nfe"] - result.stats["nfe_prefill"] - result.stats["nfe_store"]


@pytest.fixture(scope="module", params=list(families.REGISTRY))
def engine(request, tmp_path_factory):
    return small_engine(tmp_path_factory.mktemp(request.param), request.param, seed=3)


@pytest.fixture(scope="module")
def requests_and_alone(engine):
    rng = random.Random(5)
    reqs = _mixed_requests(rng, engine.config.vocab_size, engine.config.mask_token_id, 16, engine.config.family)
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    return reqs, alone


@pytest.mark.parametrize("max_batch", [1, 2, 5, 16])
def test_batched_results_equal_batch_one(engine, requests_and_alone, max_batch):
    reqs, alone = requests_and_alone
    if max_batch == 1:  # Engine.generate decodes one by one at max_batch 1; the batched op at 1 too
        outs, stats = run_decode_batch(engine.model.obj, [torch.tensor(p) for p, _ in reqs], [o for _, o in reqs], 1)
        for i, (out, a) in enumerate(zip(outs, alone)):
            assert out.tokens[len(reqs[i][0]) :].tolist() == a.raw_ids
            assert all(out.stats[k] == a.stats[k] for k in COUNTERS if k != "policy")
        assert stats["packed_forwards"] == stats["request_forwards"] == sum(_run(a) for a in alone)
        return
    got = engine.generate([p for p, _ in reqs], [o for _, o in reqs], max_batch=max_batch)
    for i, (g, a) in enumerate(zip(got, alone)):
        _same(g, a, f"{engine.config.family} request {i} at max_batch {max_batch}")
    stats = engine.last_batch_stats
    assert stats["request_forwards"] == sum(_run(a) for a in alone)
    if max_batch > 1:  # forwards were packed: fewer packed forwards than request forwards
        assert stats["packed_forwards"] < stats["request_forwards"]
    engine.generate([p for p, _ in reqs[:2]], [o for _, o in reqs[:2]], max_batch=1)
    assert engine.last_batch_stats is None, "one by one left the previous batch's counters behind"


def test_subsets_and_orders_do_not_change_a_request(engine, requests_and_alone):
    """The same request with other neighbours, in another order, under a KV budget that makes
    requests wait for rows: the same result."""
    reqs, alone = requests_and_alone
    order = [7, 3, 12, 0, 9, 15, 4]
    got = engine.generate([reqs[i][0] for i in order], [reqs[i][1] for i in order], max_batch=4)
    row_bytes = engine.last_batch_stats["kv_row_bytes"]
    for j, i in enumerate(order):
        _same(got[j], alone[i], f"request {i} among {order}")
    # KV rows for the largest request only: the others wait for rows, off the step barrier
    rows = [0 if reqs[i][1].policy == "vanilla" else len(alone[i].stats["branches"]) for i in order]
    tight = engine.last_batch_stats["kv_row_bytes"] * max(rows)
    got = engine.generate([reqs[i][0] for i in order], [reqs[i][1] for i in order], max_batch=4, kv_budget_bytes=tight)
    for j, i in enumerate(order):
        _same(got[j], alone[i], f"request {i} under a {max(rows)}-row KV budget")
    assert engine.last_batch_stats["kv_pool_rows"] == max(rows)
    assert row_bytes > 0 and engine.last_batch_stats["kv_row_bytes"] == row_bytes


def test_errors_name_the_request_and_the_budget(engine, requests_and_alone):
    reqs, _ = requests_and_alone
    bad = [reqs[0][0], [engine.config.vocab_size + 5], reqs[1][0]]
    with pytest.raises(ValueError, match=r"prompt|vocabulary"):
        engine.generate(bad, [reqs[0][1], reqs[0][1], reqs[1][1]], max_batch=3)
    with pytest.raises(ValueError, match=r"request 1"):
        torch.ops.blockbatch.decode_batch(
            engine.model.obj,
            [torch.tensor(p) for p in bad],
            [engine.default_options(gen_length=32).native] * 3,
            max_batch=3,
        )
    with pytest.raises(ValueError, match=r"kv_budget_bytes = 1 holds 0 KV rows"):
        engine.generate([p for p, _ in reqs[:4]], [o for _, o in reqs[:4]], max_batch=2, kv_budget_bytes=1)
    with pytest.raises(ValueError, match=r"options: 2 DecodeOptions for 3 prompts"):
        engine.generate(bad, [reqs[0][1]] * 2, max_batch=2)
    with pytest.raises(ValueError, match=r"max_batch must be an integer >= 1"):
        engine.generate([reqs[0][0]], reqs[0][1], max_batch=0)
    # the options cross as the typed object DecodeOptions built and checked once, never as text
    with pytest.raises(RuntimeError, match=r"Options"):
        torch.ops.blockbatch.decode_batch(engine.model.obj, [torch.tensor(reqs[0][0])], ["gen_length=16"])


@pytest.mark.parametrize("max_batch", [3, 16])
def test_padded_packs_change_no_result(engine, requests_and_alone, max_batch):
    """pad_packs pads every packed forward as BLOCKBATCH_CUDA_BATCHING=graphs does on a GPU (bucketed
    token / row / logit-row counts; the pad tokens in dummy rows of at most 16 tokens on a scratch KV
    row): every request's tokens and counters stay those of its decode alone, in every KV mode
    (the requests mix vanilla, prefix, dual and BlockBatch of both families)."""
    reqs, alone = requests_and_alone
    outs, stats = run_decode_batch(
        engine.model.obj, [torch.tensor(p) for p, _ in reqs], [o for _, o in reqs], max_batch, pad_packs=True
    )
    for i, (out, a) in enumerate(zip(outs, alone)):
        assert out.tokens[len(reqs[i][0]) :].tolist() == a.raw_ids, f"request {i} at max_batch {max_batch}, padded"
        assert all(out.stats[k] == a.stats[k] for k in COUNTERS if k != "policy"), f"request {i}"
    assert stats["padded_forwards"] >= stats["packed_forwards"] > 0  # every group of every step was padded
    assert stats["graph_captures"] == stats["graph_replays"] == 0  # graphs are CUDA's
    # The scratch row comes out of an explicit budget: a budget of exactly the largest request's rows
    # is refused with padding and accepted without.
    rows = max(len(a.stats["branches"]) if o.policy != "vanilla" else 0 for a, (_, o) in zip(alone, reqs))
    tight = stats["kv_row_bytes"] * rows
    with pytest.raises(
        ValueError,
        match=rf"needs {rows} \(besides the scratch row of padded packs\); raise the "
        rf"budget to at least {tight + stats['kv_row_bytes']} bytes",
    ):
        run_decode_batch(
            engine.model.obj,
            [torch.tensor(p) for p, _ in reqs],
            [o for _, o in reqs],
            4,
            kv_budget_bytes=tight,
            pad_packs=True,
        )
    run_decode_batch(
        engine.model.obj,
        [torch.tensor(p) for p, _ in reqs[:2]],
        [o for _, o in reqs[:2]],
        2,
        kv_budget_bytes=tight,
        pad_packs=False,
    )


def test_padded_packs_of_many_sizes(engine):
    """40 requests of prompt lengths 1..23 padded together: as they finish, the packs shrink through
    many row and token counts (and so many buckets); every result stays that of the request alone."""
    o = engine.default_options()  # the family's default policy (dual, or block)
    o = o.replace(gen_length=16, block_length=16, threshold=0.6)
    prompts = [torch.tensor([1 + (i % 5)] * (1 + i % 23)) for i in range(40)]
    outs, stats = run_decode_batch(engine.model.obj, prompts, [o] * 40, 40, pad_packs=True)
    alone = [engine.generate([p], o)[0] for p in prompts]
    assert [out.tokens[len(p) :].tolist() for out, p in zip(outs, prompts)] == [a.raw_ids for a in alone]
    assert stats["padded_forwards"] >= stats["packed_forwards"]
