"""Loading Dream-family checkpoints (Hugging Face layout as published): config, weights, errors."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

from blockbatch.config import ModelConfig
from blockbatch.families.dream import DREAM_7B
from blockbatch.random_checkpoint import make_random_checkpoint, random_config
from blockbatch.errors import CheckpointError
from blockbatch.families.dream import weight_shapes as dream_weight_shapes
from blockbatch.loading import load_checkpoint, tensor_count
from blockbatch.reference.model import ReferenceModel

# config.json of Dream-v0-Instruct-7B as published (keys the loader reads, and some it ignores).
PUBLISHED = {
    "architectures": ["DreamModel"],
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "mask_token_id": 151666,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "Dream",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "pad_token_id": 151643,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.2",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}


def test_published_config_is_read_as_dream():
    c = ModelConfig.from_dict(PUBLISHED)
    assert c.family == "dream" and c.shifted_logits and c.attention_bias
    assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == (3584, 28, 28, 4, 128)
    assert (c.mlp_hidden_size, c.vocab_size, c.mask_token_id, c.eos_token_id) == (18944, 152064, 151666, 151643)
    assert c.max_sequence_length == 131072 and c.rope_theta == 1e6 and not c.weight_tying
    assert {k: getattr(c, k) for k in DREAM_7B} == DREAM_7B
    # the C++ model and validator get the family and the biases with the shapes
    assert c.int_fields()["family"] == 1 and c.int_fields()["attention_bias"] == 1
    assert set(c.int_fields()) == {
        "d_model",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "mlp_hidden_size",
        "vocab_size",
        "embedding_size",
        "mask_token_id",
        "eos_token_id",
        "max_sequence_length",
        "weight_tying",
        "family",
        "attention_bias",
    } | set(LLADA2_DEFAULTS)
    # the LLaDA2 fields (explicit head size, partial rotary, QK-norm, experts) stay at their defaults
    assert {k: c.int_fields()[k] for k in LLADA2_DEFAULTS} == LLADA2_DEFAULTS
    assert set(c.float_fields()) == {"rope_theta", "rms_norm_eps", "routed_scaling"}


LLADA2_DEFAULTS = {
    "head_size": 0,
    "rope_dims": 0,
    "qk_norm": 0,
    "attn_out_bias": 0,
    "num_experts": 0,
    "experts_per_token": 0,
    "expert_groups": 1,
    "expert_groups_kept": 1,
    "moe_hidden_size": 0,
    "shared_experts": 0,
    "first_dense_layers": 0,
}


def test_family_comes_from_model_type_only():
    with pytest.raises(CheckpointError, match="model_type"):
        ModelConfig.from_dict({**PUBLISHED, "model_type": "dream"})  # HF spells it "Dream"
    assert random_config("dream").family == "dream"
    assert random_config().family == "llada" and not random_config().attention_bias


def test_random_checkpoint_round_trip(tmp_path):
    cfg = make_random_checkpoint(tmp_path, seed=3, max_shard_bytes=30_000, family="dream")
    files = os.listdir(tmp_path)
    assert "model.safetensors.index.json" in files and "generation_config.json" in files
    assert sum(f.endswith(".safetensors") for f in files) > 1
    raw = json.load(open(tmp_path / "config.json"))
    assert raw["model_type"] == "Dream" and raw["architectures"] == ["DreamModel"]
    ck = load_checkpoint(tmp_path)
    assert ck.config == cfg and ck.config.family == "dream"
    assert len(ck.weights) == tensor_count(cfg) == 12 * cfg.n_layers + 3
    assert set(ck.weights) == set(dream_weight_shapes(cfg))
    assert "model.layers.1.self_attn.k_proj.bias" in ck.weights and "lm_head.weight" in ck.weights


def _rewrite_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    raw = json.load(open(path))
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    json.dump(raw, open(path, "w"))


def test_special_ids_fall_back_to_generation_config(tmp_path):
    make_random_checkpoint(tmp_path, family="dream")
    _rewrite_config(tmp_path, mask_token_id=None, pad_token_id=None)
    c = load_checkpoint(tmp_path).config
    assert c.mask_token_id == 96 and c.pad_token_id == 95
    os.remove(tmp_path / "generation_config.json")
    with pytest.raises(CheckpointError, match="'mask_token_id' is missing"):
        load_checkpoint(tmp_path)


def test_missing_bias_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    make_random_checkpoint(tmp_path, family="dream")
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.1.self_attn.v_proj.bias"]
    save_file(tensors, path)
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.self_attn\.v_proj\.bias' is missing.*biases"):
        load_checkpoint(tmp_path)


def test_wrong_bias_shape_names_file_and_key(tmp_path):
    from safetensors.torch import load_file, save_file

    make_random_checkpoint(tmp_path, family="dream")
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(7)
    save_file(tensors, path)
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.q_proj\.bias' "
        r"has shape \[7\], expected \[64\]",
    ):
        load_checkpoint(tmp_path)


def test_llada_names_in_a_dream_checkpoint_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    make_random_checkpoint(tmp_path, family="dream")
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    tensors["model.transformer.wte.weight"] = tensors.pop("model.embed_tokens.weight")
    save_file(tensors, path)
    with pytest.raises(CheckpointError, match="not part of a Dream model"):
        load_checkpoint(tmp_path)


def test_heads_not_divisible_by_kv_heads(tmp_path):
    make_random_checkpoint(tmp_path, family="dream")
    _rewrite_config(tmp_path, num_key_value_heads=3)
    with pytest.raises(CheckpointError, match="'num_key_value_heads' = 3 must divide num_attention_heads = 4"):
        load_checkpoint(tmp_path)


def test_mask_id_outside_vocabulary(tmp_path):
    make_random_checkpoint(tmp_path, family="dream")
    _rewrite_config(tmp_path, mask_token_id=97)
    with pytest.raises(CheckpointError, match=r"'mask_token_id' = 97 is outside the vocabulary \[0, 97\)"):
        load_checkpoint(tmp_path)


def test_engine_decodes_with_the_checkpoints_family(tmp_path):
    """The family comes from the checkpoint: the same options decode a Dream folder with Dream's
    semantics (tests/decode/test_dream_native.py holds them to the authors' runs)."""
    from blockbatch import DecodeOptions
    from blockbatch.engine import Engine

    make_random_checkpoint(tmp_path, family="dream")
    engine = Engine.from_pretrained(tmp_path)
    assert engine.config.family == "dream"
    [gen] = engine.generate([[3, 4, 5]], DecodeOptions(policy="blockbatch", gen_length=16))
    assert [b["block_size"] for b in gen.stats["branches"]] == [4, 8, 16]  # Dream's 4..64 that divide 16
    assert gen.stats["nfe"] == gen.stats["nfe_init"] + gen.stats["nfe_block"] + gen.stats["nfe_refresh"]


def test_reference_forward_is_a_qwen2_body(tmp_path):
    """The reference model on Dream weights equals a direct Qwen2 forward (biases, GQA, RoPE theta)."""
    make_random_checkpoint(tmp_path, seed=4, family="dream")
    ck = load_checkpoint(tmp_path)
    c, w = ck.config, ck.weights
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    L, hd = ids.numel(), c.head_dim
    got = ReferenceModel.from_checkpoint(ck).forward([ids], [torch.arange(L)])[0]

    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * weight

    inv = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(L, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos().float(), torch.cat([ang, ang], -1).sin().float()

    def rope(x):  # [heads, L, hd]
        rot = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
        return x * cos + rot * sin

    x = w["model.embed_tokens.weight"][ids]
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = (
            F.linear(h, w[p + "self_attn.q_proj.weight"], w[p + "self_attn.q_proj.bias"])
            .view(L, -1, hd)
            .transpose(0, 1)
        )
        k = (
            F.linear(h, w[p + "self_attn.k_proj.weight"], w[p + "self_attn.k_proj.bias"])
            .view(L, -1, hd)
            .transpose(0, 1)
        )
        v = (
            F.linear(h, w[p + "self_attn.v_proj.weight"], w[p + "self_attn.v_proj.bias"])
            .view(L, -1, hd)
            .transpose(0, 1)
        )
        group = c.n_heads // c.n_kv_heads
        k, v = rope(k).repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        a = torch.softmax(rope(q) @ k.transpose(1, 2) / math.sqrt(hd), -1) @ v
        x = x + F.linear(a.transpose(0, 1).reshape(L, -1), w[p + "self_attn.o_proj.weight"])
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        x = x + F.linear(
            F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"])) * F.linear(h, w[p + "mlp.up_proj.weight"]),
            w[p + "mlp.down_proj.weight"],
        )
    want = F.linear(norm(x, w["model.norm.weight"]), w["lm_head.weight"])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # the biases matter
    zero = {k: (torch.zeros_like(t) if k.endswith(".bias") else t) for k, t in w.items()}
    assert not torch.allclose(ReferenceModel(c, zero).forward([ids], [torch.arange(L)])[0], got, atol=1e-3)
