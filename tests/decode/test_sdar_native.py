"""The native SDAR family (its row in csrc/model/families.cpp, the body csrc/model/transformer.cpp, the SDAR
rules of policy 'block' in csrc/decode/policies/block.cpp) against the float32 reference
(python/blockbatch/reference/sdar.py): logits within 1e-4; tokens and NFE (and its kinds) exactly, for every
unmasking rule over prompt lengths, gen lengths, block lengths, steps and thresholds."""

from __future__ import annotations

import itertools
import json
import pathlib

import pytest
import torch

from blockbatch import DecodeOptions
from blockbatch.config import ModelConfig
from blockbatch.errors import CheckpointError
from blockbatch.families import sdar as fam
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import make_random_checkpoint, random_config, random_weights
from blockbatch.reference import sdar as ref

SHAPES = {
    "gqa": dict(),
    "mha-tied": dict(n_kv_heads=4, weight_tying=True),
    "wide-heads": dict(head_size=24, n_layers=3, n_kv_heads=1),  # head_dim * heads != d_model
}


def _model(shape: str = "gqa", seed: int = 0, logit_scale: float = 4.0, **over):
    fields = dict(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_size=16)
    cfg = random_config("sdar", **{**fields, **SHAPES[shape], **over})
    weights = random_weights(cfg, seed=seed, logit_scale=logit_scale)
    return cfg, NativeModel(cfg, weights), ref.SDARReference(fam.reference_config(cfg), weights)


def _stats(out) -> dict:
    return dict(zip(torch.ops.blockbatch.decode_stat_names(), out[1].tolist()))


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_equals_the_reference(shape):
    """Bidirectional and block-causal (a query row per block over one KV row, dual mode) logits of the
    native forward within 1e-4 of the reference's."""
    cfg, model, reference = _model(shape)
    ids = torch.randint(0, 60, (48,), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(48)
    native = torch.ops.blockbatch.forward(model.obj, ids, pos, torch.tensor([0, 48]))
    assert (native - reference.forward(ids, None)).abs().max() < 1e-4
    for block in (4, 16):
        bounds = list(range(0, 48, block))
        cu, kv_lens = torch.tensor([0] + [b + block for b in bounds]), torch.tensor([b + block for b in bounds])
        kv = model.new_kv(1, 64)
        rows = torch.zeros(len(kv_lens), dtype=torch.long)
        out = torch.ops.blockbatch.forward(model.obj, ids, pos, cu, kv, rows, None, "dual", None, kv_lens)
        assert (out - reference.forward(ids, block)).abs().max() < 1e-4, block


def _decode_both(cfg, model, reference, prompt, **kw):
    kw.setdefault("threshold", 0.85)  # the family's default (DecodeOptions alone holds the table's)
    canvas, st = ref.block_generate(
        reference,
        prompt,
        gen_length=kw["gen_length"],
        block_length=kw["block_length"],
        steps=kw.get("steps"),
        unmasking=kw.get("unmasking") or "dynamic",
        threshold=float("inf") if kw.get("threshold", 0.85) is None else kw.get("threshold", 0.85),
        entropy_bound=kw.get("entropy_bound", 0.35),
        eos_id=cfg.eos_token_id,
        mask_id=cfg.mask_token_id,
    )
    out = torch.ops.blockbatch.decode(model.obj, prompt, DecodeOptions(policy="block", **kw).native)
    return canvas, st, out[0], _stats(out)


GRID = list(
    itertools.product(
        ["gqa", "wide-heads"],  # shape
        [3, 8, 13],  # prompt length: inside the first block, on a block boundary, past it
        [4, 8],  # block_length
        ["dynamic", "static", "sequential", "entropy_bounded"],  # unmasking
    )
)


@pytest.mark.parametrize("shape,prompt_len,block,rule", GRID)
def test_block_decode_equals_the_reference(shape, prompt_len, block, rule):
    """Tokens, the NFE and its kinds (prefill, denoising, store) of the native decoder equal the
    reference's, for each rule, with the default schedule and with fewer / more steps than the block,
    at several thresholds and entropy bounds."""
    cfg, model, reference = _model(shape, seed=prompt_len + block)
    prompt = torch.randint(0, 60, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len))
    settings = [dict(gen_length=21), dict(gen_length=16, threshold=0.5), dict(gen_length=9, threshold=None)]
    if rule == "entropy_bounded":
        settings += [dict(gen_length=20, entropy_bound=2.0), dict(gen_length=12, steps=block + 3, entropy_bound=0.05)]
    else:
        settings += [dict(gen_length=20, steps=block // 2, threshold=0.3), dict(gen_length=14, steps=3)]
        settings += [dict(gen_length=11, steps=block + 2, threshold=0.7)]
    for s in settings:
        kw = dict(block_length=block, unmasking=rule, **s)
        canvas, st, tokens, stats = _decode_both(cfg, model, reference, prompt, **kw)
        assert tokens.tolist() == canvas.tolist(), kw
        kinds = (stats["nfe"], stats["nfe_prefill"], stats["nfe_block"], stats["nfe_store"])
        assert kinds == (st["nfe"], st["nfe_prefill"], st["nfe_denoise"], st["nfe_store"]), kw


def test_nfe_counts_the_authors_forwards():
    """The NFE is prefill (1 if the prompt holds a whole block) + denoising + one store a decoded block:
    sequential with one commit a step runs one denoising forward per mask of a block."""
    cfg, model, reference = _model("gqa", seed=5)
    prompt = torch.arange(1, 7)  # 6 tokens: one whole block of 4 and a tail of 2
    canvas, st, tokens, stats = _decode_both(
        cfg, model, reference, prompt, gen_length=10, block_length=4, unmasking="sequential"
    )
    decoded = len(st["forwards_per_block"])  # canvas 16: blocks 1 (2 masks), 2, 3, unless EOS ends it early
    assert st["forwards_per_block"] == [2, 4, 4][:decoded]
    assert (stats["nfe_prefill"], stats["nfe_block"], stats["nfe_store"]) == (1, sum([2, 4, 4][:decoded]), decoded)
    assert stats["nfe"] == 1 + stats["nfe_block"] + decoded == st["nfe"]
    assert tokens.tolist() == canvas.tolist()
    # no complete prompt block: no prefill
    _, st, _, stats = _decode_both(cfg, model, reference, prompt[:3], gen_length=5, block_length=4)
    assert stats["nfe_prefill"] == st["nfe_prefill"] == 0


def test_eos_ends_the_decode_at_the_block_end():
    """With the EOS id a token the model writes in the second decoded block, the decode ends after that
    block (its store counted), the same canvas and counts as the reference."""
    cfg, model, reference = _model("gqa", seed=4)
    prompt = torch.tensor([5, 6, 7])
    kw = dict(gen_length=40, block_length=4, unmasking="dynamic", threshold=0.5)
    canvas, _, _, _ = _decode_both(cfg, model, reference, prompt, **kw)
    eos = int(canvas[5])  # a token of the second block
    cfg, model, reference = _model("gqa", seed=4, eos_token_id=eos)
    canvas, st, tokens, stats = _decode_both(cfg, model, reference, prompt, **kw)
    assert len(st["forwards_per_block"]) < 11 and st["nfe_store"] == len(st["forwards_per_block"])
    assert tokens.tolist() == canvas.tolist()
    assert (stats["nfe"], stats["nfe_store"]) == (st["nfe"], st["nfe_store"])


def test_the_grid_reaches_the_rules_differences():
    """The grid is not vacuous: the rules decode differently, and a count above the masks left rewrites a
    decided position (the authors' torch.topk over -inf) in some settings."""
    cfg, _, reference = _model("gqa", seed=11)
    prompt = torch.randint(0, 60, (3,), generator=torch.Generator().manual_seed(3))
    outs = {}
    for rule in ref.UNMASKING:
        canvas, _ = ref.block_generate(
            reference, prompt, gen_length=21, block_length=8, unmasking=rule, threshold=0.5,
            entropy_bound=2.0, eos_id=cfg.eos_token_id, mask_id=cfg.mask_token_id,
        )  # fmt: skip
        outs[rule] = canvas.tolist()
    assert len({tuple(v) for v in outs.values()}) >= 3


def test_topk_ties_follow_torchs_cpu_order():
    """The documented tie rule (docs/sdar.md): the ranked rules take torch.topk's CPU order over the block's
    float32 confidences, not the lowest index first. Equal confidences (a block of identical probabilities)
    commit the positions torch.topk returns."""
    masked = torch.ones(16, dtype=torch.bool)
    p = torch.full((16,), 0.25)
    chosen = ref.commit_positions("static", masked, p, 3, 0.9, 0.35)
    expected = torch.zeros(16, dtype=torch.bool)
    expected[torch.topk(torch.where(masked, p, torch.tensor(float("-inf"))), 3).indices] = True
    assert torch.equal(chosen, expected)
    # and -inf ties: a count above the masks left takes decided positions in torch.topk's order
    masked = torch.zeros(8, dtype=torch.bool)
    masked[5] = True
    chosen = ref.commit_positions("static", masked, torch.full((8,), 0.5), 3, 0.9, 0.35)
    order = torch.topk(torch.where(masked, 0.5, float("-inf")), 3).indices
    assert chosen.nonzero().flatten().tolist() == sorted(order.tolist()) and chosen[5]


def test_ties_native_equals_reference_on_a_flat_model():
    """A model whose every position gets the same distribution (zero attention and MLP outputs: identical
    confidences across the block): the native decoder commits the tied positions the reference does."""
    cfg = random_config("sdar", vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_size=16)
    weights = random_weights(cfg, seed=3, logit_scale=4.0)
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name].zero_()
    model, reference = NativeModel(cfg, weights), ref.SDARReference(fam.reference_config(cfg), weights)
    prompt = torch.tensor([3, 3, 3, 3, 3])
    for rule in ("static", "dynamic"):
        kw = dict(gen_length=24, block_length=8, steps=4, unmasking=rule, threshold=0.99)
        canvas, st, tokens, stats = _decode_both(cfg, model, reference, prompt, **kw)
        assert tokens.tolist() == canvas.tolist() and stats["nfe"] == st["nfe"], rule


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(policy="dual"), r"policy 'dual' is not defined on sdar checkpoints \(block-causal"),
        (dict(policy="blockbatch", block_sizes=[4, 8]), r"policy 'blockbatch' is not defined on sdar .*block-causal"),
        (dict(policy="vanilla"), r"block-causal.*use policy='block'"),
        (dict(policy="block", edit_threshold=0.5), "edit_threshold: token editing is not defined on sdar"),
        (dict(policy="block", unmasking="static", entropy_bound=0.2), "entropy_bound is read by unmasking"),
        (dict(policy="block", unmasking="entropy_bounded", steps=2), "steps must be None or >= block_length"),
    ],
)
def test_refusals_on_sdar(options, match):
    _, model, _ = _model()
    with pytest.raises((ValueError, RuntimeError), match=match):
        o = DecodeOptions(gen_length=16, block_length=4, **options)
        torch.ops.blockbatch.decode(model.obj, torch.tensor([1, 2, 3]), o.native)


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(policy="block", unmasking="static"), "unmasking: the unmasking rules are SDAR's; llada2"),
        (dict(policy="block", entropy_bound=0.2), "entropy_bound is read by SDAR's unmasking"),
        (dict(policy="dual", unmasking="static"), "unmasking applies to policy 'block'"),
    ],
)
def test_the_sdar_options_are_refused_elsewhere(options, match):
    family = "llada2" if options["policy"] == "block" else "llada"
    fields = dict(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2)
    cfg = random_config(family, **fields)
    model = NativeModel(cfg, random_weights(cfg, seed=0))
    with pytest.raises((ValueError, RuntimeError), match=match):
        o = DecodeOptions(gen_length=16, block_length=16, **options)
        torch.ops.blockbatch.decode(model.obj, torch.tensor([1, 2, 3]), o.native)


def test_checkpoint_round_trip_and_config_keys(tmp_path):
    """make_random_checkpoint writes the Hugging Face layout; both loaders (Python, and the C++ reader of the
    bb_* binaries) read it back; config.json's refusals name SDAR's keys."""
    from blockbatch import Engine

    path = tmp_path / "sdar"
    make_random_checkpoint(path, family="sdar", seed=1, logit_scale=4.0)
    raw = json.loads((pathlib.Path(path) / "config.json").read_text())
    assert raw["model_type"] == "sdar" and raw["architectures"] == ["SDARForCausalLM"]
    cfg = ModelConfig.from_json_file(pathlib.Path(path) / "config.json")
    assert cfg.family == "sdar" and cfg.qk_norm and cfg.head_size == raw["head_dim"]
    engine = Engine.from_pretrained(str(path))
    options = engine.default_options(gen_length=12, block_length=4)
    assert (options.policy, options.threshold) == ("block", 0.85)
    [res] = engine.generate([[1, 2, 3, 4, 5]], options)
    assert res.stats["nfe"] == res.stats["nfe_prefill"] + res.stats["nfe_block"] + res.stats["nfe_store"]
    for key, value, match in (
        ("attention_bias", True, "attention_bias' must be false"),
        ("rope_scaling", {"type": "yarn"}, "rope_scaling' must be null"),
        ("num_key_value_heads", 3, "num_key_value_heads"),
    ):
        bad = dict(raw, **{key: value})
        (pathlib.Path(path) / "config.json").write_text(json.dumps(bad))
        with pytest.raises(CheckpointError, match=match):
            ModelConfig.from_json_file(pathlib.Path(path) / "config.json")
