"""The Dream family on the Python side: its ``config.json`` (Qwen2 keys, ``model_type: "Dream"``,
special ids also in ``generation_config.json``), its weight names and shapes (the Qwen2 layout of the
Hugging Face Dream checkpoints: ``model.layers.{i}.self_attn.q_proj.bias``, ...), the published
Dream-v0-7B shape and its random checkpoints (``config.json`` with ``model_type: "Dream"``, a
``generation_config.json``, q/k/v biases)."""

from __future__ import annotations

from typing import Any

import torch

from ..config import (
    QWEN2_KEYS,
    ConfigCodec,
    KeyReader,
    ModelConfig,
    is_int,
    register_family,
    show_value,
    with_default_ids,
)
from ..errors import CheckpointError

NAME = "dream"
MODEL_TYPE = "Dream"  # config.json's model_type
DISPLAY_NAME = "Dream"
PREFIX = "model."
# The shape of Dream-v0-Base-7B / Dream-v0-Instruct-7B (config.json as published).
DREAM_7B = dict(
    d_model=3584,
    n_layers=28,
    n_heads=28,
    n_kv_heads=4,
    mlp_hidden_size=18944,
    vocab_size=152064,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    mask_token_id=151666,
    eos_token_id=151643,
    pad_token_id=151643,
    bos_token_id=151643,
    max_sequence_length=131072,
)
PUBLISHED_SHAPES = {"dream-7b": DREAM_7B}  # make-random --preset

TENSORS_PER_LAYER = 12  # LLaDA's nine plus the q/k/v biases
# Dream-7B's embedding table (152064 rows) is larger than its tokenizer: the decoders never propose
# the ids above the tokenizer's (Checkpoint.proposal_vocab).
PROPOSALS_WITHIN_TOKENIZER = True

# Decode options a request of this family gets where it sets none (under the options table's defaults).
DEFAULT_OPTIONS: dict[str, Any] = {}

# What the front doors ask of a family (never its name; tests/tools/test_registries.py checks each is here):
# the policies it decodes with (the native engine refuses the others: csrc/decode/policies/), ...
POLICIES: tuple[str, ...] = ("vanilla", "prefix", "dual", "blockbatch", "window")
# ... those `blockbatch bench` runs without --policies, those `blockbatch tune` sweeps without --policies
# (None: the grid's own) ...
BENCH_POLICIES: tuple[str, ...] = ("vanilla", "dual", "blockbatch")
TUNE_POLICIES: tuple[str, ...] | None = None
TUNE_GRID: dict = {"window_tokens": (64, 127)}  # tune.Grid fields of its own: window around the authors' 127
# ... whether Dream's samplers apply (alg, alg_temp, eps, top_p, top_k: FamilyRules::samplers) ...
SAMPLERS = True
# Mixture-of-experts layers (make-random --experts): dense
MIXTURE_OF_EXPERTS = False
# ... the title of the option group named after it in `generate --help` (None: no group of that name) ...
OPTION_GROUP_HELP: str | None = "Dream-family samplers (alg: vanilla, both families; the others: Dream only)"
# ... and the policies `python -m blockbatch.toy.evaluate` runs through the float32 reference (none: its
# toy is evaluated with the native engine, `blockbatch bench`).
TOY_EVAL_POLICIES: tuple[str, ...] = ("vanilla", "prefix", "dual", "blockbatch")


def missing_tensor_hint(name: str) -> str:
    """Text added to the error of a missing tensor ``name``."""
    return " (Dream's q/k/v projections carry biases)" if name.endswith("_proj.bias") else ""


def generation_config(config: ModelConfig) -> dict | None:
    """The generation_config.json of a Dream checkpoint: its special ids again, and the authors'
    sampler defaults."""
    return {
        "mask_token_id": config.mask_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "alg": "entropy",
        "alg_temp": 0.0,
        "steps": 512,
        "temperature": 0.0,
    }


def default_kv_heads(heads: int) -> int:
    """make-random's KV heads for ``heads`` query heads when none are given: half as many (GQA, as
    Dream has), when that divides."""
    return heads // 2 if heads % 2 == 0 and heads > 1 else heads


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Dream checkpoint must hold, with its shape (HF names).

    Qwen2 body: q/k/v projections with biases, ``o_proj`` without, SwiGLU MLP, RMSNorms, and an
    untied ``lm_head`` (unless ``tie_word_embeddings``).
    """
    d, hd, m = config.d_model, config.head_dim, config.mlp_hidden_size
    q, kv = config.n_heads * hd, config.n_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {PREFIX + "embed_tokens.weight": (config.embedding_size, d)}
    per_layer = {
        "input_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (q, d),
        "self_attn.q_proj.bias": (q,),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (d, q),
        "post_attention_layernorm.weight": (d,),
        "mlp.gate_proj.weight": (m, d),
        "mlp.up_proj.weight": (m, d),
        "mlp.down_proj.weight": (d, m),
    }
    for i in range(config.n_layers):
        for name, shape in per_layer.items():
            shapes[f"{PREFIX}layers.{i}.{name}"] = shape
    shapes[PREFIX + "norm.weight"] = (d,)
    if not config.weight_tying:
        shapes["lm_head.weight"] = (config.embedding_size, d)
    return shapes


def random_config(**overrides) -> ModelConfig:
    """A small valid Dream config (GQA: 4 query heads over 2 KV heads); any field can be overridden."""
    fields: dict[str, Any] = dict(
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        mlp_hidden_size=128,
        vocab_size=97,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        weight_tying=False,
        mask_token_id=None,
        eos_token_id=None,
        max_sequence_length=131072,
    )
    fields = with_default_ids({**fields, **overrides})
    fields.setdefault("bos_token_id", fields["eos_token_id"])
    return ModelConfig(model_type="Dream", attention_bias=True, **fields).validate()


def random_weights(
    config: ModelConfig,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    logit_scale: float = 1.0,
    bias_scale: float = 0.1,
) -> dict[str, torch.Tensor]:
    """Gaussian weights scaled by 1/sqrt(fan_in), norms near 1, small q/k/v biases.

    ``logit_scale`` multiplies ``lm_head`` (larger: more peaked softmaxes, so threshold rules
    commit several tokens a step).
    """
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith(".bias"):
            t = bias_scale * torch.randn(shape, generator=g)
        elif name.endswith("embed_tokens.weight"):
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / shape[1] ** 0.5
            if name == "lm_head.weight":
                t = t * logit_scale
                # The mask id's row is zero: its logit stays 0 while the largest of the others is
                # well above, so a random model never proposes the mask id (a trained Dream does not
                # either; the authors' vanilla and Fast-dLLM decoders would write it back, and their
                # cached block loop would never end).
                t[config.mask_token_id] = 0.0
        weights[name] = t.to(dtype)
    return weights


# --------------------------------------------------------------------------- config.json


def read_config(keys: KeyReader) -> ModelConfig:
    """A Dream ``config.json`` (``model_type: "Dream"``, Qwen2 key names)."""
    tie = keys.raw.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise keys.bad("tie_word_embeddings", f"must be true or false (a JSON boolean), got {show_value(tie)}")
    n_heads = keys.integer("num_attention_heads")
    vocab = keys.integer("vocab_size")
    if not keys.present("mask_token_id"):
        raise CheckpointError(
            f"{keys.where}: required key 'mask_token_id' is missing (from config.json and generation_config.json)"
        )
    eos = keys.token_id("eos_token_id")
    if eos is None:
        raise CheckpointError(
            f"{keys.where}: required key 'eos_token_id' is missing (from config.json and generation_config.json)"
        )
    return ModelConfig(
        d_model=keys.integer("hidden_size"),
        n_layers=keys.integer("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=keys.integer("num_key_value_heads") if keys.present("num_key_value_heads") else n_heads,
        mlp_hidden_size=keys.integer("intermediate_size"),
        vocab_size=vocab,
        embedding_size=vocab,
        rope_theta=keys.number("rope_theta"),
        rms_norm_eps=keys.number("rms_norm_eps"),
        weight_tying=tie,
        mask_token_id=keys.integer("mask_token_id"),
        eos_token_id=eos,
        max_sequence_length=keys.integer("max_position_embeddings"),
        model_type=MODEL_TYPE,
        pad_token_id=keys.token_id("pad_token_id"),
        bos_token_id=keys.token_id("bos_token_id"),
        attention_bias=True,
    )


def write_config(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` of a Dream checkpoint (Qwen2 key names)."""
    return {
        "architectures": ["DreamModel"],
        "model_type": MODEL_TYPE,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "intermediate_size": config.mlp_hidden_size,
        "vocab_size": config.vocab_size,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.weight_tying,
        "mask_token_id": config.mask_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "max_position_embeddings": config.max_sequence_length,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def check_config(config: ModelConfig, bad) -> None:
    """Dream checks, worded with the Hugging Face keys of a Dream ``config.json``.

    The C++ validator (``torch.ops.blockbatch.check_config``) checks the same shapes under the
    LLaDA key names; these checks live here so that the message names the key the user
    actually wrote. The C++ checkpoint reader (``csrc/io/checkpoint.cpp``, the ``bb_*``
    binaries) gives the same messages; keep the two in step.
    """
    heads, kv_heads = config.n_heads, config.n_kv_heads
    if is_int(heads) and is_int(kv_heads):
        if heads <= 0:
            raise bad("num_attention_heads", f"= {heads} must be positive")
        if kv_heads <= 0 or heads % kv_heads:
            raise bad(
                "num_key_value_heads",
                f"= {kv_heads} must divide num_attention_heads = {heads} (grouped-query attention)",
            )
        if is_int(config.d_model) and config.d_model % heads:
            raise bad("hidden_size", f"= {config.d_model} is not a multiple of num_attention_heads = {heads}")
    if is_int(config.vocab_size) and is_int(config.mask_token_id) and not 0 <= config.mask_token_id < config.vocab_size:
        raise bad("mask_token_id", f"= {config.mask_token_id} is outside the vocabulary [0, {config.vocab_size})")
    if not config.attention_bias:
        raise bad("attention_bias", "is false, but Dream's q/k/v projections always carry biases")


register_family(
    ConfigCodec(
        MODEL_TYPE,
        NAME,
        read_config,
        write_config,
        check_config,
        cpp_id=1,
        shifted_logits=True,
        generation_config_keys=("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"),
        key_names=QWEN2_KEYS,
    )
)
