"""The C++ family table (csrc/model/families.{h,cpp}) and the one body assembled from its rows
(csrc/model/transformer.{h,cpp}): the rows agree with the Python registry, a config is checked against
its row's parts, and a body option combination no family used before runs the reference's numbers."""

from __future__ import annotations

import pytest
import torch

from blockbatch import families
from blockbatch.families import llada2 as fam_llada2
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import random_config, random_weights
from blockbatch.reference import llada2 as ref

LLADA2_SMALL = dict(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_size=16)
# Every family, and LLaDA2 with each optional part switched (the row's Option::kConfig parts).
VARIANTS = {
    "llada": ("llada", {}),
    "dream": ("dream", {}),
    "llada2": ("llada2", LLADA2_SMALL),
    "llada2-dense-biases": ("llada2", {**LLADA2_SMALL, "num_experts": 0, "attention_bias": True}),
    "llada2-no-qk-norm-no-out-bias": ("llada2", {**LLADA2_SMALL, "qk_norm": False, "attn_out_bias": False}),
    "llada2-shared-tied": ("llada2", {**LLADA2_SMALL, "shared_experts": 2, "weight_tying": True}),
    "sdar": ("sdar", {}),
}


def _check(config_fields: dict):
    cfg = random_config(**config_fields)
    return torch.ops.blockbatch.check_config(cfg.int_fields(), cfg.float_fields())


def test_family_id_outside_the_table_is_refused_naming_key_family():
    cfg = random_config("llada")
    ints = cfg.int_fields() | {"family": 4}
    with pytest.raises(
        ValueError, match=r"key 'family' must be 0 \(llada\), 1 \(dream\), 2 \(llada2\) or 3 \(sdar\), got 4"
    ):
        torch.ops.blockbatch.check_config(ints, cfg.float_fields())


@pytest.mark.parametrize(
    "family, field, value, message",
    [
        ("llada", "qk_norm", 1, "key 'qk_norm' is set, but llada models have no QK-norm"),
        ("llada", "num_experts", 4, "key 'num_experts' is set, but llada models have no experts"),
        ("llada", "head_size", 8, "key 'head_size' is set, but llada models have no explicit head size"),
        ("dream", "attention_bias", 0, "key 'attention_bias' is unset, but dream models always have q/k/v biases"),
        ("dream", "attn_out_bias", 1, "key 'attn_out_bias' is set, but dream models have no attention output"),
        ("sdar", "qk_norm", 0, "key 'qk_norm' is unset, but sdar models always have QK-norm"),
        ("sdar", "attention_bias", 1, "key 'attention_bias' is set, but sdar models have no q/k/v biases"),
    ],
)
def test_a_part_the_row_lacks_is_refused_by_its_key(family, field, value, message):
    cfg = random_config(family)
    ints = cfg.int_fields() | {field: value}
    with pytest.raises(ValueError, match=message):
        torch.ops.blockbatch.check_config(ints, cfg.float_fields())


@pytest.mark.parametrize("variant", VARIANTS)
def test_cpp_weight_names_match_the_python_registry(variant):
    """The C++ row's weight-name map accepts exactly the tensors families/<family>.py lists: a name
    the rows spell differently is 'missing' or 'unexpected' here."""
    family, fields = VARIANTS[variant]
    cfg = random_config(family, **fields)
    weights = random_weights(cfg, seed=3)
    assert set(weights) == set(families.weight_shapes(cfg))
    model = NativeModel(cfg, weights)
    assert model.obj.dtype() is not None
    extra = dict(weights, **{"model.extra.weight": torch.zeros(1)})
    with pytest.raises(RuntimeError, match=rf"unexpected tensor 'model.extra.weight' \(not part of a {family} "):
        NativeModel(cfg, extra)


def test_fused_qkv_row_on_the_whole_head_without_qk_norm_equals_the_reference():
    """LLaDA2 without QK-norm and with full rotary takes the body's in-place RoPE + KV-write path (the
    one LLaDA and Dream use): its logits, written K/V and cached re-reads match the reference."""
    cfg = random_config("llada2", **LLADA2_SMALL, qk_norm=False, rope_dims=16)
    weights = random_weights(cfg, seed=5, logit_scale=4.0)
    model = NativeModel(cfg, weights)
    reference = ref.LLaDA2Reference(fam_llada2.reference_config(cfg), weights)
    ids = torch.randint(0, 60, (32,), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(32)
    full = torch.ops.blockbatch.forward(model.obj, ids, pos, torch.tensor([0, 32]))
    assert (full - reference.forward(ids, None)).abs().max() < 1e-4
    kv = model.new_kv(1, 32)
    written = torch.ops.blockbatch.forward(model.obj, ids, pos, torch.tensor([0, 32]), kv)
    assert torch.equal(written, full)
    assert kv.abs().sum() > 0
    # block-causal over the written cache: a row per block of 8, each seeing up to its block's end
    cu, kv_lens = torch.tensor([0, 8, 16, 24, 32]), torch.tensor([8, 16, 24, 32])
    rows = torch.zeros(4, dtype=torch.long)
    dual = torch.ops.blockbatch.forward(model.obj, ids, pos, cu, kv, rows, None, "dual", None, kv_lens)
    assert (dual - reference.forward(ids, 8)).abs().max() < 1e-4
