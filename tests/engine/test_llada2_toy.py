"""The shipped LLaDA2-layout toy (toy/checkpoint_llada2, trained by tools/train_toy_llada2.py): its
layout, the authors' recorded runs on it (tests/fixtures/authors_llada2_toy.json, LLaDA2.0 and 2.1)
decoded natively and by the reference to the same tokens and forwards, and the task it solves."""

from __future__ import annotations

import json
import pathlib

import pytest

from blockbatch import Engine, toy
from blockbatch.families import llada2 as fam
from blockbatch.loading import load_checkpoint
from blockbatch.reference import llada2 as ref
from blockbatch.toy import task as toy_task
from helpers.llada2 import native_case_decode, reference_case_decode

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "authors_llada2_toy.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(toy.checkpoint_path("llada2"))


def test_the_toy_is_a_llada2_checkpoint(engine):
    c = engine.config
    assert c.family == "llada2" and c.num_experts == 8 and c.first_dense_layers == 1 and c.qk_norm
    assert c.rope_dim == c.head_dim // 2 and c.n_kv_heads < c.n_heads
    raw = json.loads((pathlib.Path(toy.checkpoint_path("llada2")) / "config.json").read_text())
    assert raw["model_type"] == "llada2_moe" and raw["architectures"] == ["LLaDA2MoeModelLM"]
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in engine.checkpoint.weights
    assert engine.default_options().policy == "block"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_native_and_reference_equal_the_authors_on_the_trained_toy(engine, case):
    tokens, stats = native_case_decode(engine.model.obj, case)
    assert ref.generated_text_ids(tokens, len(case["prompt"]), case["eos_id"]) == case["generated"]
    assert stats["nfe"] == case["nfe"]
    ckpt = load_checkpoint(toy.checkpoint_path("llada2"))
    model = ref.LLaDA2Reference(fam.reference_config(ckpt.config), ckpt.weights)
    canvas, st = reference_case_decode(model, case)
    assert canvas.tolist() == tokens.tolist() and st["nfe"] == case["nfe"]
    assert case["max_logit_diff"] < 1e-4


def test_the_toy_solves_held_out_problems(engine):
    """64 held-out problems with the family's defaults (block 32, threshold 0.95) through the engine:
    the accuracy the learning curve measured at the end of training (the trainer's own native
    decode), and a toy that solves the task."""
    curve = json.loads((pathlib.Path(toy.checkpoint_path("llada2")) / "learning_curve.json").read_text())
    final = curve["curve"][-1]
    problems = toy_task.make_problems(64, seed=1000, split="test")
    outs = engine.generate([p.prompt for p in problems], engine.default_options(gen_length=64), chat=False)
    accuracy = sum(toy_task.check_answer(p, o.text) for p, o in zip(problems, outs)) / len(problems)
    assert accuracy == pytest.approx(final["heldout_acc_threshold"], abs=1e-4)  # the curve keeps 4 digits
    assert accuracy >= 0.9
