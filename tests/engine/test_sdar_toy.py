"""The shipped SDAR-layout toy (toy/checkpoint_sdar, trained by ``tools/train_toy_llada2.py --family sdar``):
its layout, the authors' recorded decoder on it (tests/fixtures/authors_sdar_toy.json, recorded by
tests/tools/record_authors_sdar.py from their modeling_sdar.py and generate.py) decoded natively and by the
reference to the same tokens and NFE, and the task it solves."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from blockbatch import DecodeOptions, Engine, toy
from blockbatch.families import sdar as fam
from blockbatch.loading import load_checkpoint
from blockbatch.reference import sdar as ref
from blockbatch.toy import task as toy_task

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "authors_sdar_toy.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(toy.checkpoint_path("sdar"))


@pytest.fixture(scope="module")
def reference():
    return fam.reference_model(load_checkpoint(toy.checkpoint_path("sdar")))


def test_the_toy_is_an_sdar_checkpoint(engine):
    c = engine.config
    assert c.family == "sdar" and c.qk_norm and c.num_experts == 0 and c.n_kv_heads < c.n_heads
    raw = json.loads((pathlib.Path(toy.checkpoint_path("sdar")) / "config.json").read_text())
    assert raw["model_type"] == "sdar" and raw["architectures"] == ["SDARForCausalLM"]
    assert "model.layers.0.self_attn.q_norm.weight" in engine.checkpoint.weights
    o = engine.default_options()
    assert (o.policy, o.block_length, o.threshold, o.unmasking) == ("block", 4, 0.85, None)


def _options(case: dict) -> DecodeOptions:
    o = case["options"]
    return DecodeOptions(
        policy="block",
        gen_length=case["gen_length"],
        block_length=o["block_length"],
        steps=o["steps"],
        unmasking=o["unmasking"],
        threshold=o.get("threshold", 0.85),
        entropy_bound=o.get("entropy_bound") or 0.35,
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_native_and_reference_equal_the_authors_on_the_trained_toy(engine, reference, case):
    """Their decoder's canvas (prompt + gen_length) and NFE, and the NFE's kinds, on the trained toy."""
    o = _options(case)
    prompt = torch.tensor(case["prompt"])
    out = torch.ops.blockbatch.decode(engine.model.obj, prompt, o.native)
    stats = dict(zip(torch.ops.blockbatch.decode_stat_names(), out[1].tolist()))
    assert out[0].tolist() == case["canvas"]
    kinds = case["nfe_kinds"]
    assert (stats["nfe"], stats["nfe_prefill"], stats["nfe_block"], stats["nfe_store"]) == (
        case["nfe"],
        kinds["prefill"],
        kinds["denoise"],
        kinds["store"],
    )
    canvas, st = ref.block_generate(
        reference,
        prompt,
        gen_length=o.gen_length,
        block_length=o.block_length,
        steps=o.steps,
        unmasking=o.unmasking,
        threshold=o.threshold,
        entropy_bound=o.entropy_bound,
        mask_id=reference.mask_id,
        eos_id=reference.eos_id,
    )
    assert canvas.tolist() == case["canvas"] and st["nfe"] == case["nfe"]
    assert case["max_logit_diff"] < 1e-4


def test_the_fixture_reaches_eos_and_every_rule():
    """The recorded cases are not vacuous: every rule, several block lengths, EOS ending decodes early."""
    assert {c["options"]["unmasking"] for c in CASES} == set(ref.UNMASKING)
    assert {c["options"]["block_length"] for c in CASES} >= {4, 8, 16}

    def blocks(c: dict) -> int:  # the blocks a decode without EOS would decode
        B, P = c["options"]["block_length"], len(c["prompt"])
        return -(-(P + c["gen_length"]) // B) - P // B

    early = [c for c in CASES if c["nfe_kinds"]["store"] < blocks(c)]
    assert len(early) > len(CASES) // 2


def test_the_toy_solves_held_out_problems(engine):
    """64 held-out problems with the family's defaults (blocks of 4, dynamic at 0.85) through the engine: the
    accuracy the learning curve measured at the end of training (the trainer's own native decode)."""
    curve = json.loads((pathlib.Path(toy.checkpoint_path("sdar")) / "learning_curve.json").read_text())
    final = curve["curve"][-1]
    problems = toy_task.make_problems(64, seed=1000, split="test")
    outs = engine.generate([p.prompt for p in problems], engine.default_options(gen_length=64), chat=False)
    accuracy = sum(toy_task.check_answer(p, o.text) for p, o in zip(problems, outs)) / len(problems)
    assert accuracy == pytest.approx(final["heldout_acc_threshold"], abs=1e-4)
    assert accuracy >= 0.8
