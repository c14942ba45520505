"""The LLaDA2 family on the Python side (``model_type: "llada2_moe"``, class ``LLaDA2MoeModelLM``:
LLaDA2.0 / 2.1, mini and flash): its ``config.json`` keys, its weight names and shapes (one fused
``attention.query_key_value``, QK-norm, ``mlp.experts.{e}.*`` from ``first_k_dense_replace`` on),
the published LLaDA2.0-mini shape and its random checkpoints. The readable model is
``blockbatch.reference.llada2``; the decoders are the ``block`` policy (docs/ALGORITHMS.md 11) and, with
LLaDA2.1's editing, the ``wavefront`` policy (several blocks in flight, ALGORITHMS.md 15)."""

from __future__ import annotations

from typing import Any

import torch

from ..config import (
    QWEN2_KEYS,
    ConfigCodec,
    KeyReader,
    ModelConfig,
    as_finite,
    is_int,
    register_family,
    show_value,
    with_default_ids,
)
from ..errors import CheckpointError
from ..reference import llada2 as ref

NAME = "llada2"
MODEL_TYPE = ref.MODEL_TYPE  # "llada2_moe"
DISPLAY_NAME = "LLaDA2"
PREFIX = ref.PREFIX
# The ids the authors' generate() defaults to (the published tokenizer's <|mask|> and EOS): taken when
# config.json names none, as the authors' decoder does.
AUTHORS_MASK_ID = 156895
AUTHORS_EOS_ID = 156892
# LLaDA2.0-mini / LLaDA2.1-mini as published (config.json keys read into ModelConfig fields).
LLADA2_MINI = dict(
    d_model=2048,
    n_layers=20,
    n_heads=16,
    n_kv_heads=4,
    head_size=128,
    rope_dims=64,
    mlp_hidden_size=5120,
    vocab_size=157184,
    rope_theta=600000.0,
    rms_norm_eps=1e-6,
    mask_token_id=AUTHORS_MASK_ID,
    eos_token_id=AUTHORS_EOS_ID,
    pad_token_id=156892,
    max_sequence_length=32768,
    qk_norm=True,
    num_experts=256,
    experts_per_token=8,
    expert_groups=8,
    expert_groups_kept=4,
    moe_hidden_size=512,
    shared_experts=1,
    first_dense_layers=1,
    routed_scaling=2.5,
)
PUBLISHED_SHAPES = {"llada2-mini": LLADA2_MINI}  # make-random --preset
# The ids above the tokenizer's are never proposed (Checkpoint.proposal_vocab), as for Dream.
PROPOSALS_WITHIN_TOKENIZER = True

# Decode options a request of this family gets where it sets none: its decoder, and the authors'
# LLaDA2.0 threshold (the options table's threshold default is LLaDA's 0.9, with None meaning the fixed
# schedule, so it cannot hold a per-family value).
DEFAULT_OPTIONS: dict[str, Any] = {"policy": "block", "threshold": 0.95}

# What the front doors ask of a family (never its name; tests/tools/test_registries.py checks each is here):
# the policies it decodes with (the native engine refuses the others: csrc/decode/policies/), ...
POLICIES: tuple[str, ...] = ("block", "wavefront")
# ... those `blockbatch bench` runs without --policies, those `blockbatch tune` sweeps without --policies
# (None: the grid's own) ...
BENCH_POLICIES: tuple[str, ...] = ("block",)
TUNE_POLICIES: tuple[str, ...] | None = ("block",)
TUNE_GRID: dict = {}  # tune.Grid fields of its own (none)
# ... whether Dream's samplers apply (alg, alg_temp, eps, top_p, top_k: FamilyRules::samplers) ...
SAMPLERS = False
# Mixture-of-experts layers (make-random --experts)
MIXTURE_OF_EXPERTS = True
# ... the title of the option group named after it in `generate --help` (None: no group of that name) ...
OPTION_GROUP_HELP: str | None = "block / wavefront (LLaDA2 checkpoints)"
# ... and the policies `python -m blockbatch.toy.evaluate` runs through the float32 reference (none: its
# toy is evaluated with the native engine, `blockbatch bench`).
TOY_EVAL_POLICIES: tuple[str, ...] = ()


def tensor_count(config: ModelConfig) -> int:
    """How many tensors a checkpoint of ``config`` holds (MoE layers hold three per expert)."""
    attention = 4 + int(config.attention_bias) + 2 * int(config.qk_norm) + int(config.attn_out_bias)
    mlp = sum(
        2 + 3 * config.num_experts + (3 if config.shared_experts else 0) if config.moe_layer(i) else 3
        for i in range(config.n_layers)
    )
    return attention * config.n_layers + mlp + 2 + (0 if config.weight_tying else 1)


def missing_tensor_hint(name: str) -> str:
    """Text added to the error of a missing tensor ``name``."""
    if ".mlp.experts." in name or ".mlp.gate." in name or ".mlp.shared_experts." in name:
        return " (the layers from first_k_dense_replace on are mixtures of experts)"
    if "layernorm" in name and ".attention." in name:
        return " (use_qk_norm: per-head RMSNorm weights of q and k)"
    return ""


def generation_config(config: ModelConfig) -> dict | None:
    """LLaDA2 checkpoints carry no generation_config.json the decoder reads."""
    return None


def default_kv_heads(heads: int) -> int:
    """make-random's KV heads for ``heads`` query heads when none are given: a quarter, as the mini
    has (16 / 4), when that divides, else half, else as many."""
    for div in (4, 2):
        if heads % div == 0 and heads >= div:
            return heads // div
    return heads


def reference_config(config: ModelConfig) -> ref.LLaDA2Config:
    """The reference model's config of ``config`` (its ``config.json`` keys)."""
    return ref.LLaDA2Config.from_dict(write_config(config))


def reference_model(checkpoint) -> ref.LLaDA2Reference:
    """The float32 reference model of a LLaDA2 checkpoint (``bench --compare-reference``), holding its
    mask and EOS ids for the block decoder."""
    config = checkpoint.config
    return ref.LLaDA2Reference(reference_config(config), checkpoint.weights, config.mask_token_id, config.eos_token_id)


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a LLaDA2 checkpoint must hold, with its shape (HF names)."""
    return ref.weight_shapes(reference_config(config))


def random_config(**overrides) -> ModelConfig:
    """A small valid LLaDA2 config (GQA 4/2 heads of 16 dims, RoPE on half of them, QK-norm, one
    dense layer then mixtures of 8 experts in 4 groups, 2 kept, top-2 plus a shared expert); any
    field can be overridden."""
    fields: dict[str, Any] = dict(
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        mlp_hidden_size=128,
        vocab_size=97,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        weight_tying=False,
        mask_token_id=None,
        eos_token_id=None,
        max_sequence_length=4096,
        qk_norm=True,
        num_experts=8,
        experts_per_token=2,
        expert_groups=4,
        expert_groups_kept=2,
        moe_hidden_size=32,
        shared_experts=1,
        first_dense_layers=1,
        routed_scaling=2.5,
    )
    experts = overrides.get("num_experts")
    if experts is not None and not {"expert_groups", "expert_groups_kept", "experts_per_token"} & set(overrides):
        # groups of at least two experts, half of them kept, two experts a token (fewer when fewer exist)
        groups = next((g for g in (4, 2, 1) if experts % g == 0 and experts // g >= 2), 1)
        fields |= dict(expert_groups=groups, expert_groups_kept=max(1, groups // 2), experts_per_token=min(2, experts))
    fields = with_default_ids({**fields, **overrides})
    # Unset (None), not 0: an explicit 0 is refused by validate() as the reference refuses it.
    if fields.get("head_size") is None:
        d_model, heads = fields["d_model"], fields["n_heads"]
        if not is_int(heads) or heads <= 0:
            raise CheckpointError(f"config: key 'num_attention_heads' must be a positive integer, got {heads!r}")
        fields["head_size"] = d_model // heads if is_int(d_model) else d_model
        if is_int(d_model) and 0 < d_model < heads:
            raise CheckpointError(
                f"config: key 'num_attention_heads' = {heads} is more than hidden_size = {d_model}: the head size "
                f"hidden_size // num_attention_heads would be 0"
            )
    if fields.get("rope_dims") is None:
        fields["rope_dims"] = fields["head_size"] // 2 if fields["head_size"] % 4 == 0 else fields["head_size"]
    return ModelConfig(model_type=MODEL_TYPE, **fields).validate()


def random_weights(
    config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32, logit_scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """The reference's random weights (Gaussian / sqrt(fan_in), norms near 1, spread expert biases),
    with the mask id's LM-head row zero so that a random model never proposes it (as for Dream)."""
    weights = ref.random_weights(reference_config(config), seed=seed, logit_scale=logit_scale)
    head = weights[PREFIX + "word_embeddings.weight"] if config.weight_tying else weights["lm_head.weight"]
    if not config.weight_tying:
        head[config.mask_token_id] = 0.0
    return {name: t.to(dtype) for name, t in weights.items()}


# --------------------------------------------------------------------------- config.json


def _flag(keys: KeyReader, key: str, default: bool) -> bool:
    value = keys.raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise keys.bad(key, f"must be true or false (a JSON boolean), got {show_value(value)}")
    return value


def _int_or(keys: KeyReader, key: str, default: int) -> int:
    return keys.integer(key) if keys.present(key) else default


def read_config(keys: KeyReader) -> ModelConfig:
    """A LLaDA2 ``config.json``; a missing optional key takes the default of the authors' config class."""
    for key, allowed in (("score_function", "sigmoid"), ("hidden_act", "silu")):
        if keys.present(key) and keys.raw[key] != allowed:
            raise keys.bad(key, f"is {show_value(keys.raw[key])}; LLaDA2 checkpoints use {allowed!r}")
    if keys.present("norm_topk_prob") and keys.raw["norm_topk_prob"] is not True:
        raise keys.bad("norm_topk_prob", "must be true (the experts' weights are normalised, as published)")
    d_model = keys.integer("hidden_size")
    n_heads = keys.integer("num_attention_heads")
    if not isinstance(n_heads, int) or n_heads <= 0:
        raise keys.bad("num_attention_heads", f"must be a positive integer, got {show_value(n_heads)}")
    # head_dim: explicit (0 is a value, refused by validate() as the reference refuses it), or derived.
    if keys.present("head_dim"):
        head_dim = keys.integer("head_dim")
    else:
        head_dim = d_model // n_heads
        if head_dim <= 0:
            raise keys.bad(
                "num_attention_heads",
                f"= {n_heads} is more than hidden_size = {d_model}: the head size hidden_size // "
                f"num_attention_heads would be {head_dim} (set head_dim, or fewer heads)",
            )
    factor = keys.raw.get("partial_rotary_factor", 0.5)
    finite = as_finite(factor)
    if finite is None or not 0 < finite <= 1:
        raise keys.bad("partial_rotary_factor", f"must be a number in (0, 1], got {show_value(factor)}")
    try:  # the reference's rope_dim; a derived 0 is refused by validate() naming partial_rotary_factor
        rope_dims = int(head_dim * finite)
    except OverflowError:  # a head_dim past float range: validate() refuses it by name first
        rope_dims = 0
    vocab = keys.integer("vocab_size")
    moe = keys.raw.get("num_experts", 16) is not None
    experts = _int_or(keys, "num_experts", 16) if moe else 0
    if moe and is_int(experts) and experts <= 0:  # 0 experts is not "dense" (that is null)
        raise keys.bad("num_experts", f"= {experts} must be in [1, 65536] (or null: every layer dense)")
    moe_width = _int_or(keys, "moe_intermediate_size", 0) if moe else 0
    if moe and not keys.present("moe_intermediate_size"):
        raise CheckpointError(f"{keys.where}: required key 'moe_intermediate_size' is missing (num_experts is set)")
    first_dense = _int_or(keys, "first_k_dense_replace", 0) if moe else 0
    if keys.present("intermediate_size"):
        mlp = keys.integer("intermediate_size")
    elif moe and first_dense == 0:
        mlp = moe_width  # no dense layer reads it
    else:
        raise CheckpointError(f"{keys.where}: required key 'intermediate_size' is missing (dense MLP layers)")
    mask = keys.token_id("mask_token_id")
    eos = keys.token_id("eos_token_id")
    return ModelConfig(
        d_model=d_model,
        n_layers=keys.integer("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=_int_or(keys, "num_key_value_heads", n_heads),
        mlp_hidden_size=mlp,
        vocab_size=vocab,
        embedding_size=vocab,
        rope_theta=keys.number("rope_theta") if keys.present("rope_theta") else 10000.0,
        rms_norm_eps=keys.number("rms_norm_eps") if keys.present("rms_norm_eps") else 1e-5,
        weight_tying=_flag(keys, "tie_word_embeddings", False),
        mask_token_id=AUTHORS_MASK_ID if mask is None else mask,
        eos_token_id=AUTHORS_EOS_ID if eos is None else eos,
        max_sequence_length=_int_or(keys, "max_position_embeddings", 32768),
        model_type=MODEL_TYPE,
        pad_token_id=keys.token_id("pad_token_id"),
        attention_bias=_flag(keys, "use_qkv_bias", False),
        head_size=head_dim,
        rope_dims=rope_dims,
        qk_norm=_flag(keys, "use_qk_norm", True),
        attn_out_bias=_flag(keys, "use_bias", True),
        num_experts=experts,
        experts_per_token=_int_or(keys, "num_experts_per_tok", 2) if moe else 0,
        expert_groups=_int_or(keys, "n_group", 8) if moe else 1,
        expert_groups_kept=_int_or(keys, "topk_group", 4) if moe else 1,
        moe_hidden_size=moe_width,
        shared_experts=(_int_or(keys, "num_shared_experts", 0) or 0) if moe else 0,
        first_dense_layers=first_dense,
        routed_scaling=(keys.number("routed_scaling_factor") if keys.present("routed_scaling_factor") else 2.5)
        if moe
        else 1.0,
    )


def write_config(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` of a LLaDA2 checkpoint (the published key names)."""
    out: dict[str, Any] = {
        "architectures": ["LLaDA2MoeModelLM"],
        "model_type": MODEL_TYPE,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.mlp_hidden_size,
        "partial_rotary_factor": config.rope_dim / config.head_dim,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.weight_tying,
        "use_qkv_bias": config.attention_bias,
        "use_bias": config.attn_out_bias,
        "use_qk_norm": config.qk_norm,
        "mask_token_id": config.mask_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "max_position_embeddings": config.max_sequence_length,
        "hidden_act": "silu",
        "score_function": "sigmoid",
        "norm_topk_prob": True,
        "num_experts": config.num_experts or None,
    }
    if config.num_experts:
        out |= {
            "num_experts_per_tok": config.experts_per_token,
            "n_group": config.expert_groups,
            "topk_group": config.expert_groups_kept,
            "moe_intermediate_size": config.moe_hidden_size,
            "num_shared_experts": config.shared_experts,
            "first_k_dense_replace": config.first_dense_layers,
            "routed_scaling_factor": config.routed_scaling,
        }
    return out


def check_config(config: ModelConfig, bad) -> None:
    """LLaDA2 checks worded with its own keys (the C++ validator checks the rest)."""
    if config.n_kv_heads <= 0 or config.n_heads % config.n_kv_heads:
        raise bad("num_key_value_heads", f"= {config.n_kv_heads} must divide num_attention_heads = {config.n_heads}")
    for key, value in (("mask_token_id", config.mask_token_id), ("eos_token_id", config.eos_token_id)):
        if not 0 <= value < config.vocab_size:
            raise bad(key, f"= {value} is outside the vocabulary [0, {config.vocab_size}) (the authors' default)")


# ModelConfig field -> LLaDA2's config.json key (C++: config_key in csrc/model/config.cpp).
KEY_NAMES = {
    **QWEN2_KEYS,
    "head_size": "head_dim",
    "rope_dims": "partial_rotary_factor",
    "attention_bias": "use_qkv_bias",
    "qk_norm": "use_qk_norm",
    "attn_out_bias": "use_bias",
    "experts_per_token": "num_experts_per_tok",
    "expert_groups": "n_group",
    "expert_groups_kept": "topk_group",
    "moe_hidden_size": "moe_intermediate_size",
    "shared_experts": "num_shared_experts",
    "first_dense_layers": "first_k_dense_replace",
    "routed_scaling": "routed_scaling_factor",
}

register_family(
    ConfigCodec(
        MODEL_TYPE,
        NAME,
        read_config,
        write_config,
        check_config,
        cpp_id=2,
        key_names=KEY_NAMES,
        sizes=("head_size", "rope_dims"),
    )
)
