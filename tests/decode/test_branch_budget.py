"""branch_budget="auto": under the batching scheduler a BlockBatch request's branch set is cut to
what a step can carry at the current load, read off a step-time curve (docs/ALGORITHMS.md 9.4).
The choice is a pure function of (sizes, block_length, load, curve); a request that ran with the
cut set equals its decode alone with those block sizes (float32 CPU, exact)."""

from __future__ import annotations

import pytest
import torch

from blockbatch import DecodeOptions, Engine
from blockbatch.scheduler import BatchScheduler

SIZES = [4, 8, 16, 32, 64, 128]
FLAT = ([16, 4096], [0.01, 0.01])  # an idle GPU: tokens are free
LINEAR = ([16, 4096], [16e-5, 4096e-5])  # a compute-bound CPU: time grows with every token
KNEE = ([16, 512, 4096], [0.01, 0.01, 0.08])  # free up to 512 tokens, then linear


def _cut(load, curve, sizes=SIZES, block_length=32):
    return list(torch.ops.blockbatch.budget_branches(sizes, block_length, load, *curve))


def test_the_cut_follows_the_load_and_the_curve():
    assert _cut(1, FLAT) == SIZES and _cut(16, FLAT) == SIZES
    assert _cut(1, LINEAR) == [32]  # every token costs: a dual cache's query alone
    assert _cut(1, KNEE) == SIZES  # 252 tokens fit under the knee
    assert _cut(2, KNEE) == SIZES  # 504 still do
    assert _cut(4, KNEE) == [4, 8, 16, 32, 64]  # 128 per request: the largest goes first
    assert _cut(8, KNEE) == [4, 8, 16, 32]
    assert _cut(16, KNEE) == [32]  # 16 x 32 already fills the knee
    # monotone: more load never keeps more tokens
    kept = [sum(_cut(load, KNEE)) for load in range(1, 33)]
    assert kept == sorted(kept, reverse=True)
    # the anchor is the branch nearest block_length, kept to the end
    assert _cut(64, KNEE, block_length=16) == [16]
    assert _cut(64, KNEE, sizes=[8, 64]) == [8] and _cut(64, KNEE, sizes=[64]) == [64]
    assert _cut(3, ([], [])) == SIZES  # no curve: the full set


def test_a_cut_request_equals_its_decode_alone_with_the_cut_sizes():
    engine = Engine.from_pretrained()
    prompt = engine.encode("72-2=__-3=__-3=__...............?")
    auto = DecodeOptions(policy="blockbatch", gen_length=128, branch_budget="auto")
    for curve, sizes in ((list(zip(*LINEAR)), (32,)), (list(zip(*FLAT)), tuple(SIZES))):
        with BatchScheduler(engine.model.obj, max_batch=4, max_length=256, step_curve=curve) as sched:
            out = sched.submit(prompt, auto).result(timeout=60)
        if len(sizes) > 1:
            assert tuple(b["block_size"] for b in out.stats["branches"]) == sizes
            alone = engine.generate(prompt, auto.replace(block_sizes=sizes, branch_budget="full"))[0]
        else:  # one branch left: a dual cache of that block, with blockbatch's threshold and EOS exit
            assert out.stats["nfe_refresh"] == 0 and out.stats["nfe_init"] == 0
            alone = engine.generate(
                prompt, DecodeOptions(policy="dual", gen_length=128, block_length=sizes[0], stop_on_eos=True)
            )[0]
        assert out.tokens[prompt.numel() :].tolist() == alone.raw_ids and out.stats["nfe"] == alone.stats["nfe"]
    # the op alone has no curve: the full set; Engine.generate alone cuts at load 1 on the model's curve
    from blockbatch.decoding import run_decode

    assert len(run_decode(engine.model.obj, prompt, auto).stats["branches"]) == 6
    curve = engine.step_curve
    at_one = _cut(1, ([t for t, _ in curve], [s for _, s in curve]))
    got = engine.generate(prompt, auto)[0].stats
    if len(at_one) > 1:
        assert [b["block_size"] for b in got["branches"]] == at_one
    else:
        assert (
            got["nfe"]
            == engine.generate(
                prompt, DecodeOptions(policy="dual", gen_length=128, block_length=at_one[0], stop_on_eos=True)
            )[0].stats["nfe"]
        )


def test_the_measured_curve_and_bad_curves():
    engine = Engine.from_pretrained()
    curve = engine.step_curve
    tokens = [t for t, _ in curve]
    assert tokens[0] == 16 and tokens == sorted(tokens) and len(tokens) >= 3
    assert all(b[1] >= a[1] > 0 for a, b in zip(curve, curve[1:]))
    assert engine.step_curve is curve  # measured once
    with pytest.raises(ValueError, match="ascending token counts"):
        BatchScheduler(engine.model.obj, step_curve=[(32, 0.01), (16, 0.02)])
    with pytest.raises(ValueError, match=r"list of \(tokens, seconds\) pairs"):
        BatchScheduler(engine.model.obj, step_curve="fast")
    with pytest.raises(ValueError, match="branch_budget"):
        DecodeOptions(policy="blockbatch", branch_budget="sometimes")
