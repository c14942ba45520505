"""The shipped toy model through the native engine: equal to the reference, and a real testbed."""

import os
import subprocess
import sys

import pytest
import torch

from blockbatch.engine import Engine
from blockbatch.decoding import run_decode
from blockbatch.options import DecodeOptions
from blockbatch.reference.blockbatch import blockbatch_generate
from blockbatch.reference.model import ReferenceModel
from blockbatch.reference.policies import generate
from blockbatch.toy import task


@pytest.fixture(scope="module")
def toy():
    engine = Engine.from_pretrained()
    return engine, ReferenceModel.from_checkpoint(engine.checkpoint)


PROBLEMS = task.make_problems(6, 123, "test")


@pytest.mark.parametrize(
    "policy,G,B,extra",
    [
        ("vanilla", 64, 32, dict(threshold=None, steps=64)),
        ("prefix", 64, 16, dict(threshold=0.9)),
        ("dual", 64, 32, dict(threshold=0.9)),
        ("dual", 128, 32, dict(threshold=0.7)),
        ("dual", 64, 8, dict(factor=1.0)),
    ],
)
def test_single_branch_equals_reference_on_toy(toy, policy, G, B, extra):
    engine, ref = toy
    options = DecodeOptions(policy=policy, gen_length=G, block_length=B, **extra)
    for p in PROBLEMS[:3]:
        ids = engine.encode(p.prompt, chat=False)
        out = run_decode(engine.model.obj, ids, options)
        expected = generate(
            ref, ids, G, B, policy, steps=options.steps, threshold=options.threshold, factor=options.factor
        )
        assert torch.equal(out.tokens, expected.tokens)
        assert out.stats["nfe"] == expected.nfe


@pytest.mark.parametrize(
    "sizes,G,kw",
    [
        ((4, 8, 16, 32, 64, 128), 128, {}),
        ((4, 8, 16, 32, 64, 128), 256, dict(sync_gap=4)),
        ((8, 32), 64, dict(merge_gate=0.3)),
        ((16,), 64, {}),
        ((4, 64), 128, dict(refresh_mode="divergence", merge_gate=0.9)),
        ((4, 8, 16, 32, 64, 128), 128, dict(stop_on_eos=False, sync_gap=64)),
    ],
)
def test_blockbatch_equals_reference_on_toy(toy, sizes, G, kw):
    engine, ref = toy
    kw = dict(kw)
    stop = kw.pop("stop_on_eos", True)
    for p in PROBLEMS[3:]:
        ids = engine.encode(p.prompt, chat=False)
        expected = blockbatch_generate(ref, ids, G, sizes, stop_on_eos=stop, **kw)
        out = run_decode(
            engine.model.obj,
            ids,
            DecodeOptions(policy="blockbatch", gen_length=G, block_sizes=sizes, stop_on_eos=stop, **kw),
        )
        s = out.stats
        assert torch.equal(out.tokens, expected.tokens)
        assert (
            s["nfe"],
            s["nfe_init"],
            s["nfe_block"],
            s["nfe_refresh"],
            s["nfe_paper"],
            s["winner_block_size"],
            s["early_exit"],
        ) == (
            expected.nfe,
            expected.nfe_init,
            expected.nfe_block,
            expected.nfe_refresh,
            expected.nfe_paper,
            expected.winner_block_size,
            expected.early_exit,
        )
        assert [b["merged"] for b in s["branches"]] == [b.merged for b in expected.branches]
        assert [b["copied"] for b in s["branches"]] == [b.copied for b in expected.branches]


def test_toy_exercises_every_blockbatch_mechanism(toy):
    """Merges, syncs, refreshes and EOS exits all happen on the toy model across a small grid (the
    model is confident enough that with the defaults the EOS exit comes before any refresh)."""
    engine, _ = toy
    totals = {"merged": 0, "copied": 0, "refresh": 0, "early_exit": 0}
    for extra in (dict(), dict(stop_on_eos=False), dict(refresh_tokens=8)):
        for p in task.make_problems(12, 7, "test"):
            [g] = engine.generate(p.prompt, DecodeOptions(policy="blockbatch", gen_length=128, **extra), chat=False)
            totals["merged"] += sum(b["merged"] for b in g.stats["branches"])
            totals["copied"] += sum(b["copied"] for b in g.stats["branches"])
            totals["refresh"] += g.stats["nfe_refresh"]
            totals["early_exit"] += int(g.stats["early_exit"])
    assert all(v > 0 for v in totals.values()), totals


def test_toy_model_solves_held_out_problems(toy):
    engine, _ = toy
    problems = task.make_problems(30, 99, "test")
    gens = engine.generate(
        [p.prompt for p in problems], DecodeOptions(policy="dual", gen_length=64, block_length=32), chat=False
    )
    correct = sum(task.check_answer(p, g.text) for p, g in zip(problems, gens))
    assert correct >= 25, f"{correct}/30"


def test_cli_generate_uses_the_toy_model_by_default():
    p = task.make_problems(1, 5, "test")[0]
    res = subprocess.run(
        [sys.executable, "-m", "blockbatch.cli", "generate", "--policy", "blockbatch", "--gen-length", "128", p.prompt],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr
    text, stats = res.stdout.splitlines()[0], res.stdout.splitlines()[-1]
    assert task.check_answer(p, text), (p.prompt, text)
    assert "[blockbatch 4,8,16,32,64,128] nfe=" in stats
