"""The SDAR family on the Python side (``model_type: "sdar"``, class ``SDARForCausalLM``: SDAR-1.7B/4B/8B-Chat
and their b16 / b32 / b64 variants; TraDo shares the body): its ``config.json`` keys (Qwen3's), its weight
names and shapes (split q/k/v/o without biases, per-head ``q_norm`` / ``k_norm``), the published shapes and
its random checkpoints. The readable model is ``blockbatch.reference.sdar``; the decoder is the ``block``
policy's SDAR rules (docs/sdar.md)."""

from __future__ import annotations

from typing import Any

import torch

from ..config import QWEN2_KEYS, ConfigCodec, KeyReader, ModelConfig, register_family, show_value, with_default_ids
from ..errors import CheckpointError
from ..reference import sdar as ref

NAME = "sdar"
MODEL_TYPE = ref.MODEL_TYPE  # "sdar"
DISPLAY_NAME = "SDAR"
PREFIX = ref.PREFIX
TENSORS_PER_LAYER = 11  # input norm, q/k/v/o, q/k norms, post-attention norm, gate/up/down
# The published SDAR-1.7B-Chat and SDAR-8B-Chat shapes (config.json keys read into ModelConfig fields).
_QWEN3_IDS = dict(mask_token_id=151669, eos_token_id=151643, pad_token_id=151643, bos_token_id=151643)
SDAR_1_7B = dict(
    d_model=2048,
    n_layers=28,
    n_heads=16,
    n_kv_heads=8,
    head_size=128,
    mlp_hidden_size=6144,
    vocab_size=151936,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    max_sequence_length=32768,
    weight_tying=False,
    **_QWEN3_IDS,
)
SDAR_8B = dict(
    d_model=4096,
    n_layers=36,
    n_heads=32,
    n_kv_heads=8,
    head_size=128,
    mlp_hidden_size=12288,
    vocab_size=151936,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    max_sequence_length=32768,
    weight_tying=False,
    **_QWEN3_IDS,
)
PUBLISHED_SHAPES = {"sdar-1.7b": SDAR_1_7B, "sdar-8b": SDAR_8B}  # make-random --preset
PROPOSALS_WITHIN_TOKENIZER = True

# The block policy with the authors' generate.py defaults: low_confidence_dynamic at 0.85, blocks of 4 (the
# published models' training block, config.json's block_size; a request may pick another).
DEFAULT_OPTIONS: dict[str, Any] = {"policy": "block", "threshold": 0.85, "block_length": 4}
POLICIES: tuple[str, ...] = ("block",)
BENCH_POLICIES: tuple[str, ...] = ("block",)
TUNE_POLICIES: tuple[str, ...] | None = ("block",)
TUNE_GRID: dict = {"unmasking": ref.UNMASKING}  # tune.Grid fields of its own: the unmasking rules
SAMPLERS = False
MIXTURE_OF_EXPERTS = False
OPTION_GROUP_HELP: str | None = "block on SDAR checkpoints (unmasking rules)"
TOY_EVAL_POLICIES: tuple[str, ...] = ()


def missing_tensor_hint(name: str) -> str:
    """Text added to the error of a missing tensor ``name``."""
    if "_norm.weight" in name and ".self_attn." in name:
        return " (SDAR: per-head RMSNorm weights of q and k)"
    return ""


def generation_config(config: ModelConfig) -> dict | None:
    """The generation_config.json the authors ship: the special ids the harness stops on."""
    return {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}


def default_kv_heads(heads: int) -> int:
    """make-random's KV heads for ``heads`` query heads: half (the 1.7B's 16 / 8), else as many."""
    return heads // 2 if heads % 2 == 0 and heads >= 2 else heads


def reference_config(config: ModelConfig) -> ref.SDARConfig:
    return ref.SDARConfig.from_dict(write_config(config))


def reference_model(checkpoint) -> ref.SDARReference:
    """The float32 reference model of an SDAR checkpoint, holding its mask and EOS ids."""
    config = checkpoint.config
    return ref.SDARReference(reference_config(config), checkpoint.weights, config.mask_token_id, config.eos_token_id)


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor an SDAR checkpoint must hold, with its shape (HF names)."""
    return ref.weight_shapes(reference_config(config))


def random_config(**overrides) -> ModelConfig:
    """A small valid SDAR config (GQA 4/2 heads of 16 dims, QK-norm, untied head); any field can be
    overridden."""
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
    )
    fields = with_default_ids({**fields, "qk_norm": True, **overrides})
    if fields.get("head_size") is None:
        d_model, heads = fields["d_model"], fields["n_heads"]
        if not isinstance(heads, int) or heads <= 0:
            raise CheckpointError(f"config: key 'num_attention_heads' must be a positive integer, got {heads!r}")
        fields["head_size"] = d_model // heads if isinstance(d_model, int) else d_model
    return ModelConfig(model_type=MODEL_TYPE, **fields).validate()


def random_weights(
    config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32, logit_scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """The reference's random weights, with the mask id's LM-head row zero so that a random model never
    proposes it."""
    weights = ref.random_weights(reference_config(config), seed=seed, logit_scale=logit_scale)
    if not config.weight_tying:
        weights["lm_head.weight"][config.mask_token_id] = 0.0
    return {name: t.to(dtype) for name, t in weights.items()}


# --------------------------------------------------------------------------- config.json


def read_config(keys: KeyReader) -> ModelConfig:
    """An SDAR ``config.json``; a missing optional key takes the default of the authors' config class."""
    if keys.present("hidden_act") and keys.raw["hidden_act"] != "silu":
        raise keys.bad("hidden_act", f"is {show_value(keys.raw['hidden_act'])}; SDAR checkpoints use 'silu'")
    for key in ("attention_bias", "use_sliding_window"):
        if keys.raw.get(key) not in (None, False):
            raise keys.bad(
                key, f"must be false: SDAR checkpoints as published have none, got {show_value(keys.raw[key])}"
            )
    if keys.present("rope_scaling"):
        raise keys.bad("rope_scaling", "must be null: the engine's RoPE is unscaled, as the published SDAR models'")
    d_model = keys.integer("hidden_size")
    n_heads = keys.integer("num_attention_heads")
    if n_heads <= 0:
        raise keys.bad("num_attention_heads", f"must be a positive integer, got {n_heads}")
    head_dim = keys.integer("head_dim") if keys.present("head_dim") else d_model // n_heads
    if head_dim <= 0 and not keys.present("head_dim"):
        raise keys.bad(
            "num_attention_heads",
            f"= {n_heads} is more than hidden_size = {d_model}: the head size hidden_size // num_attention_heads "
            f"would be {head_dim} (set head_dim, or fewer heads)",
        )
    tie = keys.raw.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise keys.bad("tie_word_embeddings", f"must be true or false (a JSON boolean), got {show_value(tie)}")
    vocab = keys.integer("vocab_size")
    keys.need("eos_token_id")  # present (a null is refused below)
    eos = keys.token_id("eos_token_id")
    if eos is None:
        raise keys.bad("eos_token_id", "must be an integer or a non-empty list of integers, got null")
    return ModelConfig(
        d_model=d_model,
        n_layers=keys.integer("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=keys.integer("num_key_value_heads") if keys.present("num_key_value_heads") else n_heads,
        mlp_hidden_size=keys.integer("intermediate_size"),
        vocab_size=vocab,
        embedding_size=vocab,
        rope_theta=keys.number("rope_theta") if keys.present("rope_theta") else 10000.0,
        rms_norm_eps=keys.number("rms_norm_eps") if keys.present("rms_norm_eps") else 1e-6,
        weight_tying=tie,
        mask_token_id=keys.integer("mask_token_id"),
        eos_token_id=eos,
        max_sequence_length=keys.integer("max_position_embeddings")
        if keys.present("max_position_embeddings")
        else 32768,
        model_type=MODEL_TYPE,
        pad_token_id=keys.token_id("pad_token_id"),
        bos_token_id=keys.token_id("bos_token_id"),
        head_size=head_dim,
        qk_norm=True,
    )


def write_config(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` of an SDAR checkpoint (the published key names)."""
    return {
        "architectures": ["SDARForCausalLM"],
        "model_type": MODEL_TYPE,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.mlp_hidden_size,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.weight_tying,
        "attention_bias": False,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_sequence_length,
        "use_sliding_window": False,
        "block_size": 4,
        "mask_token_id": config.mask_token_id,
        "eos_token_id": config.eos_token_id,
        "bos_token_id": config.bos_token_id,
        "pad_token_id": config.pad_token_id,
    }


def check_config(config: ModelConfig, bad) -> None:
    """SDAR checks worded with its own keys (the C++ validator checks the rest)."""
    if config.n_kv_heads <= 0 or config.n_heads % config.n_kv_heads:
        raise bad("num_key_value_heads", f"= {config.n_kv_heads} must divide num_attention_heads = {config.n_heads}")
    for key, value in (("mask_token_id", config.mask_token_id), ("eos_token_id", config.eos_token_id)):
        if not 0 <= value < config.vocab_size:
            raise bad(key, f"= {value} is outside the vocabulary [0, {config.vocab_size})")


# ModelConfig field -> SDAR's config.json key (C++: the row's keys in csrc/model/families.cpp).
KEY_NAMES = {**QWEN2_KEYS, "head_size": "head_dim"}

register_family(
    ConfigCodec(
        MODEL_TYPE, NAME, read_config, write_config, check_config, cpp_id=3, key_names=KEY_NAMES, sizes=("head_size",)
    )
)
