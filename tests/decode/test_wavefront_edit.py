"""The LLaDA2 editing toy (toy/checkpoint_llada2_edit: the LLaDA2 toy continued with LLaDA2.1's token-to-token
objective, ``tools/train_toy_llada2.py --edit``) under LLaDA2.1's real edits (edit_threshold 0.9), the setting
FlowBlock's claim needs (issue 54):

- edits are safe and fire: on held-out problems, ``block`` and ``wavefront`` with edits answer as well as
  without them (within one problem), where the LLaDA2 toy (trained on masks only) loses most of its answers to
  the same edits; at blocks of 16 (more wrong commits) edits fire;
- the native wavefront equals its float32 reference (reference/wavefront.py) on it with edits firing, 2 and 3
  blocks in flight: tokens, NFE, edits, re-drafted tokens and the blocks in flight of every forward.

Only these tests decode the editing toy (it is not in ``toy.CHECKPOINT_DIRS``, which family-wide tests iterate).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from blockbatch import DecodeOptions, Engine, toy
from blockbatch.families import llada2 as fam
from blockbatch.loading import load_checkpoint
from blockbatch.reference import llada2 as ref
from blockbatch.reference.wavefront import wavefront_generate
from blockbatch.toy import task as toy_task

EDIT_DIR = pathlib.Path(toy.LLADA2_EDIT_CHECKPOINT_DIR)
HELD_OUT = dict(seed=2000, split="test")  # not the trainer's monitor set (seed 1000) nor the benchmark's


@pytest.fixture(scope="module")
def edit_toy():
    engine = Engine.from_pretrained(str(EDIT_DIR))
    ckpt = load_checkpoint(str(EDIT_DIR))
    c = ckpt.config
    return engine, ref.LLaDA2Reference(fam.reference_config(c), ckpt.weights, c.mask_token_id, c.eos_token_id)


def test_the_editing_toy_is_the_llada2_toy_continued_with_t2t():
    """Same model shape and tokenizer as the LLaDA2 toy, weights moved by the T2T run the curve records."""
    base = pathlib.Path(toy.checkpoint_path("llada2"))
    assert json.loads((EDIT_DIR / "config.json").read_text()) == json.loads((base / "config.json").read_text())
    assert (EDIT_DIR / "tokenizer.json").read_text() == (base / "tokenizer.json").read_text()
    run = json.loads((EDIT_DIR / "learning_curve.json").read_text())
    tc = run["train_config"]
    assert tc["edit_prob"] > 0 and tc["stale_prob"] > 0 and pathlib.Path(tc["init_from"]).name == "checkpoint_llada2"
    assert "heldout_acc_edit" in run["curve"][-1]
    a, b = load_checkpoint(str(EDIT_DIR)).weights, load_checkpoint(str(base)).weights
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    assert toy.LLADA2_EDIT_CHECKPOINT_DIR not in toy.CHECKPOINT_DIRS.values()


def _accuracy(engine, problems, o: DecodeOptions) -> tuple[float, int]:
    prompts = [engine.encode(p.prompt, chat=False) for p in problems]
    outs = engine.generate(prompts, [o] * len(prompts), max_batch=8)
    correct = sum(bool(toy_task.check_answer(p, g.text)) for p, g in zip(problems, outs))
    return correct / len(problems), sum(g.stats["edits"] for g in outs)


@pytest.mark.parametrize("block_length,threshold", [(32, 0.95), (16, 0.7)])
def test_edits_are_safe_and_fire_on_held_out_problems(edit_toy, block_length, threshold):
    """LLaDA2.1's edits (above 0.9) on 48 held-out problems, gen 64: ``block`` and ``wavefront`` (2 blocks) answer
    as well with them as without (block: no edit_threshold; wavefront: 1.0, the rule with no edit), within one
    problem. Blocks of 32 (the trained ones): the toy's commits are right, so edits are (nearly) never taken,
    and the mask-only LLaDA2 toy loses most of its answers to the same edits; blocks of 16 (untrained, more
    wrong commits): edits fire. Measured: 0.958 with and without at 32 / 0.95 (mask-only toy: 0.25), 0.562 with
    17 edits at 16 / 0.7."""
    engine, _ = edit_toy
    problems = toy_task.make_problems(48, **HELD_OUT)
    base = dict(gen_length=64, block_length=block_length, threshold=threshold)
    wave = dict(policy="wavefront", max_active_blocks=2, spawn_threshold=0.5, **base)
    runs = {
        "block": (DecodeOptions(policy="block", **base), DecodeOptions(policy="block", edit_threshold=0.9, **base)),
        "wavefront": (DecodeOptions(edit_threshold=1.0, **wave), DecodeOptions(edit_threshold=0.9, **wave)),
    }
    one = 1 / len(problems)
    for name, (without, with_edits) in runs.items():
        acc, edits_without = _accuracy(engine, problems, without)
        acc_edit, edits = _accuracy(engine, problems, with_edits)
        assert edits_without == 0, name
        assert acc_edit >= acc - one, (name, acc, acc_edit)
        if block_length == 16:
            assert edits > 0, name
    if block_length == 32:
        masks_only = Engine.from_pretrained(toy.checkpoint_path("llada2"))
        acc_masks_only, edits_masks_only = _accuracy(masks_only, problems, runs["wavefront"][1])
        assert edits_masks_only > edits and acc_masks_only <= acc_edit - 0.5, (acc_masks_only, acc_edit)


@pytest.mark.parametrize("blocks", [2, 3])
def test_native_equals_the_reference_with_edits_firing(edit_toy, blocks):
    """Held-out prompts, blocks of 8 and 16 at threshold 0.5 with edits above 0.7 (where the toy's commits are
    wrong often enough for edits to fire) and LLaDA2.1's 0.95 / 0.9 at blocks of 32, gen 96: tokens, NFE, edits,
    re-drafts and the per-forward window of the native decoder equal the float32 reference's; edits fired."""
    engine, reference = edit_toy
    c = engine.config
    fired = 0
    for p in toy_task.make_problems(6, seed=7, split="test"):
        prompt = engine.encode(p.prompt, chat=False)
        for gen_length, block_length, threshold, edit in ((64, 8, 0.5, 0.7), (64, 16, 0.5, 0.7), (96, 32, 0.95, 0.9)):
            o = DecodeOptions(
                policy="wavefront",
                gen_length=gen_length,
                block_length=block_length,
                threshold=threshold,
                edit_threshold=edit,
                max_active_blocks=blocks,
                spawn_threshold=0.5,
            )
            out = torch.ops.blockbatch.decode(engine.model.obj, prompt, o.native)
            stats = dict(zip(torch.ops.blockbatch.decode_stat_names(), out[1].tolist()))
            canvas, st = wavefront_generate(
                reference,
                prompt,
                gen_length=gen_length,
                block_length=block_length,
                threshold=threshold,
                edit_threshold=edit,
                max_active_blocks=blocks,
                spawn_threshold=0.5,
                max_post_steps=o.max_post_steps,
                stop_on_eos=bool(o.stop_on_eos),
                eos_id=c.eos_token_id,
                mask_id=c.mask_token_id,
            )
            what = (p.prompt, gen_length, block_length, threshold, edit)
            assert out[0].tolist() == canvas.tolist(), what
            for k in ("nfe", "edits", "redrafted_tokens", "blocks_in_flight", "max_blocks_in_flight"):
                assert stats[k] == st[k], (k, *what)
            assert out[2][:, 3].tolist() == st["window_per_step"], what
            fired += st["edits"]
    assert fired > 0
