"""The LLaDA family on the Python side: its ``config.json`` (OLMo-style keys, ``model_type: "llada"``),
its weight names and shapes (``model.transformer.*``, the layout of LLaDA's Hugging Face
checkpoints) and its random checkpoints."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..config import ConfigCodec, KeyReader, ModelConfig, as_finite, register_family, show_value, with_default_ids
from ..errors import CheckpointError

NAME = "llada"
MODEL_TYPE = "llada"  # config.json's model_type
DISPLAY_NAME = "LLaDA"
PREFIX = "model.transformer."
PUBLISHED_SHAPES: dict[str, dict] = {}  # make-random --preset: none published for LLaDA yet

TENSORS_PER_LAYER = 9  # norms, q, k, v, out, ff_proj, up, ff_out: tensor_count() without listing them
PROPOSALS_WITHIN_TOKENIZER = False  # every embedding row is a token the decoders may propose

# Decode options a request of this family gets where it sets none (under the options table's defaults).
DEFAULT_OPTIONS: dict[str, Any] = {}

# What the front doors ask of a family (never its name; tests/tools/test_registries.py checks each is here):
# the policies it decodes with (the native engine refuses the others: csrc/decode/policies/), ...
POLICIES: tuple[str, ...] = ("vanilla", "prefix", "dual", "blockbatch", "window")
# ... those `blockbatch bench` runs without --policies, those `blockbatch tune` sweeps without --policies
# (None: the grid's own) ...
BENCH_POLICIES: tuple[str, ...] = ("vanilla", "dual", "blockbatch")
TUNE_POLICIES: tuple[str, ...] | None = None
TUNE_GRID: dict = {}  # tune.Grid fields of its own (none)
# ... whether Dream's samplers apply (alg, alg_temp, eps, top_p, top_k: FamilyRules::samplers) ...
SAMPLERS = False
# Mixture-of-experts layers (make-random --experts): dense
MIXTURE_OF_EXPERTS = False
# ... the title of the option group named after it in `generate --help` (None: no group of that name) ...
OPTION_GROUP_HELP: str | None = None
# ... and the policies `python -m blockbatch.toy.evaluate` runs through the float32 reference (none: its
# toy is evaluated with the native engine, `blockbatch bench`).
TOY_EVAL_POLICIES: tuple[str, ...] = ("vanilla", "prefix", "dual")


def missing_tensor_hint(name: str) -> str:
    """Text added to the error of a missing tensor ``name`` (none for LLaDA)."""
    return ""


def generation_config(config: ModelConfig) -> dict | None:
    """The generation_config.json a checkpoint of this family carries (LLaDA: none)."""
    return None


def default_kv_heads(heads: int) -> int:
    """make-random's KV heads for ``heads`` query heads when none are given: no GQA."""
    return heads


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a LLaDA checkpoint must hold, with its shape (HF names)."""
    d, hd, m = config.d_model, config.head_dim, config.mlp_hidden_size
    shapes: dict[str, tuple[int, ...]] = {PREFIX + "wte.weight": (config.embedding_size, d)}
    per_layer = {
        "attn_norm": (d,),
        "q_proj": (config.n_heads * hd, d),
        "k_proj": (config.n_kv_heads * hd, d),
        "v_proj": (config.n_kv_heads * hd, d),
        "attn_out": (d, config.n_heads * hd),
        "ff_norm": (d,),
        "ff_proj": (m, d),
        "up_proj": (m, d),
        "ff_out": (d, m),
    }
    for i in range(config.n_layers):
        for name, shape in per_layer.items():
            shapes[f"{PREFIX}blocks.{i}.{name}.weight"] = shape
    shapes[PREFIX + "ln_f.weight"] = (d,)
    if not config.weight_tying:
        shapes[PREFIX + "ff_out.weight"] = (config.embedding_size, d)
    return shapes


def random_config(**overrides) -> ModelConfig:
    """A small valid LLaDA config; any field can be overridden."""
    fields: dict[str, Any] = dict(
        d_model=64,
        n_layers=2,
        n_heads=2,
        n_kv_heads=2,
        mlp_hidden_size=128,
        vocab_size=97,
        embedding_size=None,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        weight_tying=False,
        mask_token_id=None,
        eos_token_id=None,
        max_sequence_length=1024,
    )
    fields = with_default_ids({**fields, **overrides})
    return ModelConfig(**fields).validate()


def random_weights(
    config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32, logit_scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """Gaussian weights scaled by 1/sqrt(fan_in); norms near 1.

    ``logit_scale`` multiplies the LM head so that tests can make the model more or less
    confident (a larger scale gives peaked softmaxes, so threshold rules commit several tokens).
    """
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:  # norm weights
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("wte.weight"):
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / shape[1] ** 0.5
            if name.endswith("transformer.ff_out.weight"):
                t = t * logit_scale
        weights[name] = t.to(dtype)
    return weights


# --------------------------------------------------------------------------- config.json


def read_config(keys: KeyReader) -> ModelConfig:
    """A LLaDA ``config.json`` (OLMo-style keys: ``d_model``, ``n_layers``, ``mlp_hidden_size`` or
    ``mlp_ratio``, ``weight_tying``, ...)."""
    d_model = keys.integer("d_model")
    n_heads = keys.integer("n_heads")
    vocab_size = keys.integer("vocab_size")
    if keys.present("mlp_hidden_size"):
        mlp = keys.integer("mlp_hidden_size")
    elif keys.present("mlp_ratio"):  # LLaDA/OLMo fall back to mlp_ratio * d_model
        ratio = keys.raw["mlp_ratio"]
        if as_finite(ratio) is None or not ratio > 0:
            raise keys.bad("mlp_ratio", f"must be a positive finite number, got {show_value(ratio)}")
        try:
            mlp = int(ratio * d_model)  # a huge product fails validate() by name (mlp_hidden_size)
        except OverflowError:
            raise keys.bad("mlp_ratio", f"* d_model = {show_value(ratio)} * {d_model} overflows") from None
        if mlp <= 0 < d_model:  # a derived 0 is a size, not "unset": name the key that made it
            raise keys.bad("mlp_ratio", f"* d_model = {show_value(ratio)} * {d_model} gives an MLP width of {mlp}")
    else:
        raise CheckpointError(f"{keys.where}: required key 'mlp_hidden_size' is missing")
    eos = keys.token_id("eos_token_id")
    if eos is None:
        raise CheckpointError(f"{keys.where}: required key 'eos_token_id' is missing")
    weight_tying = keys.need("weight_tying")
    if not isinstance(weight_tying, bool):
        raise keys.bad("weight_tying", f"must be true or false (a JSON boolean), got {show_value(weight_tying)}")
    pad = keys.raw.get("pad_token_id")
    if pad is not None:
        pad = keys.integer("pad_token_id")
    return ModelConfig(
        d_model=d_model,
        n_layers=keys.integer("n_layers"),
        n_heads=n_heads,
        n_kv_heads=keys.integer("n_kv_heads") if keys.present("n_kv_heads") else n_heads,
        mlp_hidden_size=mlp,
        vocab_size=vocab_size,
        embedding_size=keys.integer("embedding_size") if keys.present("embedding_size") else vocab_size,
        rope_theta=keys.number("rope_theta"),
        rms_norm_eps=keys.number("rms_norm_eps"),
        weight_tying=weight_tying,
        mask_token_id=keys.integer("mask_token_id"),
        eos_token_id=eos,
        max_sequence_length=keys.integer("max_sequence_length"),
        model_type=MODEL_TYPE,
        pad_token_id=pad,
    )


def write_config(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` of a LLaDA checkpoint."""
    d = {k: v for k, v in dataclasses.asdict(config).items() if k in _LLADA_KEYS}
    d.update(
        {
            "architectures": ["LLaDAModelLM"],
            "activation_type": "silu",
            "block_type": "llama",
            "layer_norm_type": "rms",
            "rope": True,
            "include_bias": False,
        }
    )
    return d


# The ModelConfig fields a LLaDA config.json holds under their own names.
_LLADA_KEYS = (
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "mlp_hidden_size",
    "vocab_size",
    "embedding_size",
    "rope_theta",
    "rms_norm_eps",
    "weight_tying",
    "mask_token_id",
    "eos_token_id",
    "max_sequence_length",
    "model_type",
    "pad_token_id",
)


def check_config(config: ModelConfig, bad) -> None:
    """LLaDA's own check (the shapes are the C++ validator's, under these same key names)."""
    if config.attention_bias:
        raise bad("attention_bias", "is only supported for the Dream family")


register_family(ConfigCodec(MODEL_TYPE, NAME, read_config, write_config, check_config, cpp_id=0))
