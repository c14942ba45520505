"""Policy 'wavefront' (FlowBlock's gated wavefront, csrc/decode/policies/wavefront.cpp; issue 54):

- max_active_blocks=1 is the block policy with editing: on the authors' recorded LLaDA2.1 runs (the
  toy and random checkpoints, tests/fixtures/authors_llada2_*.json) the same generation and NFE as the
  authors, and the same canvas, NFE and edits as the native block policy;
- with 2, 3 and 4 blocks in flight the native decoder equals its float32 reference
  (reference/wavefront.py): tokens, NFE, edits, re-drafted tokens and blocks in flight, on the LLaDA2 toy
  and a random LLaDA2 checkpoint; the cases reach several blocks in flight and re-drafts;
- the reference with one block is reference/llada2.py block_generate with editing;
- its refusals name the option (edit_threshold unset) or the family (SDAR: no editing; LLaDA: bidirectional).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import torch

from blockbatch import DecodeOptions, Engine, toy
from blockbatch.config import ModelConfig
from blockbatch.decoding import run_decode_batch
from blockbatch.errors import RequestError
from blockbatch.families import llada2 as fam
from blockbatch.loading import load_checkpoint
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import random_config, random_weights
from blockbatch.reference import llada2 as ref
from blockbatch.reference.wavefront import wavefront_generate
from blockbatch.toy import task as toy_task
from helpers.llada2 import case_options

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
# The authors' LLaDA2.1 runs (with editing): the wavefront's one-block case.
EDIT_CASES = [
    (kind, case)
    for kind in ("toy", "random")
    for case in json.loads((FIXTURES / f"authors_llada2_{kind}.json").read_text(encoding="utf-8"))["cases"]
    if case["options"].get("edit_threshold") is not None
]
STATS = ("nfe", "edits", "redrafted_tokens", "blocks_in_flight", "max_blocks_in_flight")


def _decode(model_obj, prompt, o: DecodeOptions):
    """Tokens and counters of one native decode, plus its step log's blocks in flight per forward."""
    out = torch.ops.blockbatch.decode(model_obj, torch.as_tensor(prompt), o.native)
    stats = dict(zip(torch.ops.blockbatch.decode_stat_names(), out[1].tolist()))
    return out[0].tolist(), {**stats, "blocks_per_step": out[2][:, 3].tolist()}


@pytest.fixture(scope="module")
def toy_models():
    engine = Engine.from_pretrained(toy.checkpoint_path("llada2"))
    ckpt = load_checkpoint(toy.checkpoint_path("llada2"))
    c = ckpt.config
    reference = ref.LLaDA2Reference(fam.reference_config(c), ckpt.weights, c.mask_token_id, c.eos_token_id)
    return engine, reference


def _case_model(case):
    raw = {
        **case["config"],
        "model_type": "llada2_moe",
        "mask_token_id": case["mask_id"],
        "eos_token_id": case["eos_id"],
        "max_position_embeddings": 512,
    }
    cfg = ref.LLaDA2Config(**case["config"])
    return NativeModel(
        ModelConfig.from_dict(raw), ref.random_weights(cfg, case["seed"], logit_scale=case["logit_scale"])
    )


@pytest.mark.parametrize("kind,case", EDIT_CASES, ids=[f"{k}-{c['name']}" for k, c in EDIT_CASES])
def test_one_active_block_is_the_block_policy_with_editing(toy_models, kind, case):
    """The authors' recorded LLaDA2.1 runs: max_active_blocks=1 gives their generation and NFE, and the
    native block policy's canvas, NFE and edits."""
    model = toy_models[0].model if kind == "toy" else _case_model(case)
    block = case_options(case)
    wave = dataclasses.replace(block, policy="wavefront", max_active_blocks=1, spawn_threshold=0.0)
    tokens, stats = _decode(model.obj, case["prompt"], wave)
    assert ref.generated_text_ids(torch.tensor(tokens), len(case["prompt"]), case["eos_id"]) == case["generated"]
    assert stats["nfe"] == case["nfe"]
    block_tokens, block_stats = _decode(model.obj, case["prompt"], block)
    assert tokens == block_tokens
    assert (stats["nfe"], stats["edits"]) == (block_stats["nfe"], block_stats["edits"])
    assert stats["max_blocks_in_flight"] == 1 and stats["blocks_in_flight"] == stats["nfe"]
    nfe = int(stats["nfe"])
    assert stats["blocks_per_step"] == [1] * nfe and block_stats["blocks_per_step"] == [0] * nfe
    assert stats["redrafted_tokens"] == 0


def _reference(reference, prompt, o: DecodeOptions, eos_id: int, mask_id: int):
    return wavefront_generate(
        reference,
        torch.as_tensor(prompt),
        gen_length=o.gen_length,
        block_length=o.block_length,
        threshold=o.threshold,
        edit_threshold=o.edit_threshold,
        max_post_steps=o.max_post_steps,
        max_active_blocks=o.max_active_blocks,
        spawn_threshold=o.spawn_threshold,
        stop_on_eos=bool(o.stop_on_eos),
        eos_id=eos_id,
        mask_id=mask_id,
    )


def _same(native, reference, what):
    tokens, stats = native
    canvas, st = reference
    assert tokens == canvas.tolist(), what
    assert {k: stats[k] for k in STATS} == {k: st[k] for k in STATS}, what
    assert stats["blocks_per_step"] == st["window_per_step"], what  # the window of every forward


# (block_length, threshold, edit_threshold, spawn_threshold, max_post_steps, stop_on_eos) per row
SETTINGS = [
    (32, 0.7, 0.5, 0.5, 16, False),
    (16, 0.9, 0.5, 0.25, 16, True),
    (16, 0.95, 0.9, 0.0, 3, False),
    (8, 0.7, 0.5, 1.0, 16, True),
]


def _options(setting, blocks: int, gen_length: int) -> DecodeOptions:
    """A SETTINGS row (block_length, threshold, edit_threshold, spawn_threshold, max_post_steps,
    stop_on_eos) with ``blocks`` in flight."""
    bl, t, e, gate, post, stop = setting
    return DecodeOptions(
        policy="wavefront",
        gen_length=gen_length,
        block_length=bl,
        threshold=t,
        edit_threshold=e,
        max_active_blocks=blocks,
        spawn_threshold=gate,
        max_post_steps=post,
        stop_on_eos=stop,
    )


@pytest.mark.parametrize("blocks", [2, 3, 4])
def test_native_equals_the_reference_on_the_toy(toy_models, blocks):
    """The trained LLaDA2 toy (gen 64; held-out problems and the fixtures' prompts): tokens, NFE, edits,
    re-drafts and blocks in flight of the native decoder equal the float32 reference's."""
    engine, reference = toy_models
    c = engine.config
    prompts = [p.prompt for p in toy_task.make_problems(2, seed=7, split="test")]
    ids = [engine.encode(p, chat=False).tolist() for p in prompts]
    for setting in SETTINGS:
        for prompt in ids:
            o = _options(setting, blocks, gen_length=64)
            native = _decode(engine.model.obj, prompt, o)
            _same(native, _reference(reference, prompt, o, c.eos_token_id, c.mask_token_id), (blocks, *setting))


def _random(seed: int):
    cfg = random_config("llada2", vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_size=16)
    weights = random_weights(cfg, seed=seed, logit_scale=4.0)
    reference = ref.LLaDA2Reference(fam.reference_config(cfg), weights, cfg.mask_token_id, cfg.eos_token_id)
    return cfg, NativeModel(cfg, weights), reference


@pytest.mark.parametrize("blocks", [2, 3, 4])
def test_native_equals_the_reference_on_a_random_checkpoint(blocks):
    """A random LLaDA2 checkpoint (MoE, GQA, partial rotary): prompts inside the first block, on a block
    boundary and past it; every setting row."""
    cfg, model, reference = _random(seed=3)
    for plen in (3, 16, 21):
        prompt = torch.randint(0, 60, (plen,), generator=torch.Generator().manual_seed(plen)).tolist()
        for setting in SETTINGS:
            o = _options(setting, blocks, gen_length=40)
            native = _decode(model.obj, prompt, o)
            what = (blocks, plen, *setting)
            _same(native, _reference(reference, prompt, o, cfg.eos_token_id, cfg.mask_token_id), what)


def test_blocks_per_step_lists_each_forwards_window(toy_models):
    """Stats ``blocks_per_step``: wavefront's active blocks of each forward (they sum to blocks_in_flight,
    their maximum is max_blocks_in_flight, the window grows and shrinks), empty for the block policy."""
    engine, _ = toy_models
    prompt = engine.encode(toy_task.make_problems(1, seed=7, split="test")[0].prompt, chat=False)
    base = dict(gen_length=64, block_length=16, threshold=0.7, edit_threshold=0.5)
    [wave] = engine.generate(
        prompt, DecodeOptions(policy="wavefront", max_active_blocks=4, spawn_threshold=0.25, **base)
    )
    s = wave.stats
    assert len(s["blocks_per_step"]) == s["nfe"] == len(s["committed_per_step"])
    assert sum(s["blocks_per_step"]) == s["blocks_in_flight"] and max(s["blocks_per_step"]) == s["max_blocks_in_flight"]
    assert len(set(s["blocks_per_step"])) >= 3  # not one window size throughout
    [block] = engine.generate(prompt, DecodeOptions(policy="block", **base))
    assert block.stats["blocks_per_step"] == [] and block.stats["nfe"] > 0


def test_the_cases_reach_several_blocks_and_redrafts(toy_models):
    """Not vacuous: the wavefront runs several blocks in one forward, repairs stale drafts, and takes fewer
    forwards than the block policy on the toy."""
    engine, _ = toy_models
    prompt = engine.encode(toy_task.make_problems(1, seed=7, split="test")[0].prompt, chat=False).tolist()
    base = dict(gen_length=64, block_length=16, threshold=0.7, edit_threshold=0.5)
    _, one = _decode(engine.model.obj, prompt, DecodeOptions(policy="block", **base))
    _, four = _decode(
        engine.model.obj, prompt, DecodeOptions(policy="wavefront", max_active_blocks=4, spawn_threshold=0.25, **base)
    )
    assert four["max_blocks_in_flight"] >= 3 and four["blocks_in_flight"] > four["nfe"]
    assert four["nfe"] < one["nfe"]
    cfg, model, _ = _random(seed=3)
    redrafted = 0
    for plen in (3, 16, 21):
        prompt = torch.randint(0, 60, (plen,), generator=torch.Generator().manual_seed(plen)).tolist()
        o = DecodeOptions(
            policy="wavefront", gen_length=40, block_length=8, threshold=0.7, edit_threshold=0.5, max_active_blocks=4
        )
        redrafted += _decode(model.obj, prompt, o)[1]["redrafted_tokens"]
    assert redrafted > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_the_reference_with_one_block_is_block_generate(seed):
    """The two references agree with one block in flight (reference/wavefront.py vs llada2.py)."""
    cfg, _, reference = _random(seed)
    prompt = torch.tensor([5, 6, 7, 9, 11])
    for bl, t, e, _, post, stop in SETTINGS:
        kw = dict(gen_length=40, block_length=bl, threshold=t, edit_threshold=e, max_post_steps=post, stop_on_eos=stop)
        ids = dict(eos_id=cfg.eos_token_id, mask_id=cfg.mask_token_id)
        canvas, st = ref.block_generate(reference, prompt, steps=bl, cache=True, **kw, **ids)
        wave, wst = wavefront_generate(reference, prompt, max_active_blocks=1, **kw, **ids)
        assert wave.tolist() == canvas.tolist() and (wst["nfe"], wst["edits"]) == (st["nfe"], st["edits"])


def test_refusals_name_the_option_or_the_family(tmp_path, toy_models):
    engine = toy_models[0]
    with pytest.raises(RequestError, match=r"policy 'wavefront' needs edit_threshold") as e:
        engine.generate([[1, 2, 3]], DecodeOptions(policy="wavefront", gen_length=16))
    assert (e.value.kind, e.value.param) == ("unsupported", "edit_threshold")
    from blockbatch.random_checkpoint import make_random_checkpoint

    make_random_checkpoint(tmp_path / "sdar", family="sdar", vocab_size=64)
    sdar = Engine.from_pretrained(tmp_path / "sdar")
    with pytest.raises(
        RequestError, match=r"policy 'wavefront' has no rules for sdar checkpoints.*edit_threshold"
    ) as e:
        sdar.generate([[1, 2, 3]], DecodeOptions(policy="wavefront", gen_length=16, edit_threshold=0.5))
    assert e.value.param == "policy"


def _mixed_options() -> list[DecodeOptions]:
    """Two block requests (with and without editing) and eight wavefront ones of 1..4 blocks, several gates,
    block lengths, thresholds and stop rules."""
    return [
        DecodeOptions(policy="block", gen_length=64, threshold=0.95),
        DecodeOptions(policy="block", gen_length=48, block_length=16, threshold=0.7, edit_threshold=0.9),
    ] + [
        DecodeOptions(
            policy="wavefront",
            gen_length=64 + 16 * (k % 2),
            block_length=(16, 32)[k % 2],
            threshold=(0.7, 0.95)[k % 2],
            edit_threshold=(0.5, 1.0)[k % 2],
            max_active_blocks=1 + k % 4,
            spawn_threshold=(0.0, 0.25, 0.5, 1.0)[k % 4],
            stop_on_eos=k % 3 == 0,
        )
        for k in range(8)
    ]


def test_windows_of_every_size_pack_with_block_requests(toy_models):
    """Heterogeneous packing through the scheduler: wavefront requests of 1..4 blocks, several gates and
    block lengths, mixed with block requests (with and without editing), eight at a time: every request's
    tokens and counters equal its decode alone."""
    engine, _ = toy_models
    problems = toy_task.make_problems(10, seed=11, split="test")
    prompts = [engine.encode(p.prompt, chat=False) for p in problems]
    options = _mixed_options()
    alone = [engine.generate(p, o)[0] for p, o in zip(prompts, options)]
    packed = engine.generate(prompts, options, max_batch=8)
    assert max(g.stats["max_blocks_in_flight"] for g in alone) >= 3
    for a, b, o in zip(alone, packed, options):
        assert a.raw_ids == b.raw_ids, o
        for k in ("nfe", "edits", "committed_per_step", "query_tokens_per_step", "blocks_per_step", *STATS):
            assert a.stats[k] == b.stats[k], (k, o)


def test_a_model_that_proposes_the_mask_id_fails_naming_the_block():
    """A step that leaves a block's masks without a token (every logit equal: the argmax is id 0, here the
    mask id) fails with an error naming the block, in the native decoder and in the reference, instead of
    looping."""
    cfg = random_config(
        "llada2", vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_size=16, mask_token_id=0, eos_token_id=1
    )
    weights = random_weights(cfg, seed=1, logit_scale=4.0)
    weights["lm_head.weight"].zero_()
    model = NativeModel(cfg, weights)
    reference = ref.LLaDA2Reference(fam.reference_config(cfg), weights, cfg.mask_token_id, cfg.eos_token_id)
    o = DecodeOptions(policy="wavefront", gen_length=16, block_length=8, edit_threshold=0.5, max_active_blocks=2)
    with pytest.raises(RuntimeError, match="block 0: the model proposes the mask id"):
        _decode(model.obj, [5, 6, 7], o)
    with pytest.raises(RuntimeError, match="block 0: the model proposes the mask id"):
        _reference(reference, [5, 6, 7], o, cfg.eos_token_id, cfg.mask_token_id)


def test_padded_wavefront_packs_change_no_result(toy_models):
    """Shape buckets for heterogeneous wavefront packs: with pad_packs the scheduler pads every packed forward
    to bucketed token / row / logit-row counts (what BLOCKBATCH_CUDA_BATCHING=graphs does on a GPU, so that each
    bucket's CUDA graph replays whatever windows the requests hold); windows of 1..4 blocks at their own stages,
    mixed with block requests, keep every request's tokens, counters and per-forward windows those of its
    decode alone."""
    engine, _ = toy_models
    problems = toy_task.make_problems(10, seed=11, split="test")
    prompts = [engine.encode(p.prompt, chat=False) for p in problems]
    options = _mixed_options()
    alone = [engine.generate(p, o)[0] for p, o in zip(prompts, options)]
    outs, stats = run_decode_batch(engine.model.obj, prompts, options, 8, pad_packs=True)
    assert stats["padded_forwards"] >= stats["packed_forwards"] > 0
    for a, out, p, o in zip(alone, outs, prompts, options):
        assert out.tokens[len(p) :].tolist() == a.raw_ids, o
        for k in ("nfe", "edits", "committed_per_step", "blocks_per_step", *STATS):
            assert out.stats[k] == a.stats[k], (k, o)
