"""Model configuration read from a Hugging Face ``config.json``.

Every id and shape used by the engine comes from here, never from constants in code. The model
family is a property of the checkpoint (its ``model_type``), never a flag. What a family's
``config.json`` looks like (its keys, its own checks) is the family's ``ConfigCodec``, which the
family's module (``blockbatch.families``) registers here when the package is imported; this module
knows no family by name.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

from .errors import CheckpointError, read_json_file


# Sane upper bounds of the config values live in C++ (csrc/model/config.h, checked by
# ModelConfig::validate, which ModelConfig.validate below calls): MAX_SEQUENCE_LENGTH, MAX_LAYERS,
# MAX_DIM and MAX_ROPE_ELEMENTS are read from there (module attributes, see __getattr__).
MAX_CONFIG_BYTES = 16 << 20  # config.json is a few hundred bytes
GENERATION_CONFIG_NAME = "generation_config.json"
_INT64_MAX = (1 << 63) - 1


def __getattr__(name: str) -> int:
    limits = {
        "MAX_SEQUENCE_LENGTH": "max_sequence_length",
        "MAX_LAYERS": "layers",
        "MAX_DIM": "dim",
        "MAX_ROPE_ELEMENTS": "rope_elements",
    }
    if name in limits:
        from ._C_loader import load_extension
        import torch

        load_extension()
        return int(torch.ops.blockbatch.config_limits()[limits[name]])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_INT_KEYS = (
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "mlp_hidden_size",
    "vocab_size",
    "embedding_size",
    "max_sequence_length",
)
_FLOAT_KEYS = ("rope_theta", "rms_norm_eps")
# The keys Dream and LLaDA2 (Qwen2 names) write the LLaDA-named fields under (C++: config_key).
QWEN2_KEYS = {
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "mlp_hidden_size": "intermediate_size",
    "embedding_size": "vocab_size",
    "max_sequence_length": "max_position_embeddings",
    "weight_tying": "tie_word_embeddings",
}


def show_value(value: Any) -> str:
    """repr of a config value, cut short (a fuzzed file can hold megabyte strings)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, NaN, infinite, or an int beyond float range)."""
    if not _is_number(value):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def with_default_ids(fields: dict[str, Any]) -> dict[str, Any]:
    """``ModelConfig`` fields of a made-up model (random checkpoints) with the ids it leaves unset
    filled in: the last vocabulary id is the mask, the one before it EOS, padding is EOS, and the
    embedding table has one row per vocabulary id."""
    out = dict(fields)
    if out.get("embedding_size") is None:
        out["embedding_size"] = out["vocab_size"]
    if out.get("mask_token_id") is None:
        out["mask_token_id"] = out["vocab_size"] - 1
    if out.get("eos_token_id") is None:
        out["eos_token_id"] = out["vocab_size"] - 2
    out.setdefault("pad_token_id", out["eos_token_id"])
    return out


class KeyReader:
    """A ``config.json`` dict read key by key: each error names the file (``where``) and the key."""

    def __init__(self, raw: dict[str, Any], where: str):
        self.raw, self.where = raw, where

    def bad(self, key: str, msg: str) -> CheckpointError:
        return CheckpointError(f"{self.where}: key '{key}' {msg}")

    def present(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def need(self, key: str) -> Any:
        if not self.present(key):
            raise CheckpointError(f"{self.where}: required key '{key}' is missing")
        return self.raw[key]

    def integer(self, key: str) -> int:
        value = self.need(key)
        if not is_int(value):
            raise self.bad(key, f"must be an integer, got {show_value(value)}")
        return value

    def number(self, key: str) -> float:
        value = self.need(key)
        if not _is_number(value):
            raise self.bad(key, f"must be a number, got {show_value(value)}")
        finite = as_finite(value)
        if finite is None:
            raise self.bad(key, f"must be a finite number, got {show_value(value)}")
        return finite

    def token_id(self, key: str) -> int | None:
        """A special id: an integer, or a non-empty list of them (HF allows several EOS ids; the
        first one is the id), or None when the key is absent."""
        value = self.raw.get(key)
        if isinstance(value, list):
            if not value or not all(is_int(e) for e in value):
                raise self.bad(key, f"must be an integer or a non-empty list of integers, got {show_value(value)}")
            return value[0]
        return None if value is None else self.integer(key)


@dataclasses.dataclass(frozen=True)
class ConfigCodec:
    """How one family's ``config.json`` maps onto ``ModelConfig`` (registered by its module in
    ``blockbatch.families``)."""

    model_type: str  # as written in config.json
    family: str  # ModelConfig.family
    read: Callable[[KeyReader], ModelConfig]  # the fields, from the family's keys (checked after)
    write: Callable[[ModelConfig], dict[str, Any]]  # the config.json dict its checkpoints carry
    check: Callable[[ModelConfig, Callable[[str, str], CheckpointError]], None]  # checks worded with its keys
    cpp_id: int  # the family's number on the C++ side (csrc/model/config.h)
    shifted_logits: bool = False  # position i is read from the output at i - 1 (ALGORITHMS.md section 5)
    generation_config_keys: tuple[str, ...] = ()  # read from generation_config.json when config.json lacks them
    # ModelConfig field -> the config.json key the family writes it under, where the two differ (Dream:
    # n_layers -> num_hidden_layers, ...); every message names the user's key through it (C++: config_key).
    key_names: dict[str, str] = dataclasses.field(default_factory=dict)
    # The sizes its configs always set, of head_size and rope_dims (its reader derives their defaults from
    # its own keys: LLaDA2's head_dim and partial_rotary_factor, SDAR's head_dim); other families leave
    # them unset.
    sizes: tuple[str, ...] = ()

    def key(self, field: str) -> str:
        """The config.json key of ModelConfig field ``field`` in this family."""
        return self.key_names.get(field, field)


_CODECS: dict[str, ConfigCodec] = {}


def register_family(codec: ConfigCodec) -> None:
    """Make ``codec.model_type`` a model_type ``ModelConfig`` reads and writes."""
    _CODECS[codec.model_type] = codec


def supported_model_types() -> tuple[str, ...]:
    return tuple(_CODECS)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture and special ids of a checkpoint of any registered family (``blockbatch.families``:
    LLaDA, Dream, LLaDA2).

    Field names follow LLaDA's ``config.json``; each family's module reads its own ``config.json``
    keys into the same fields (Dream's and LLaDA2's Qwen2-style ``hidden_size``,
    ``num_hidden_layers``, ...; LLaDA2's mixture-of-experts fields below). ``head_dim`` is
    ``d_model // n_heads`` unless the family gives a head size. ``family`` follows from
    ``model_type``; ``attention_bias`` says the q/k/v projections carry biases (Dream's do).
    """

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden_size: int
    vocab_size: int
    embedding_size: int
    rope_theta: float
    rms_norm_eps: float
    weight_tying: bool
    mask_token_id: int
    eos_token_id: int
    max_sequence_length: int
    model_type: str = "llada"
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    attention_bias: bool = False
    # LLaDA2 only (families/llada2.py; the defaults elsewhere): an explicit head size, RoPE on the
    # first rope_dims dims of a head, per-head RMSNorm of q and k, a bias on the attention output,
    # and the mixture of experts of the layers from first_dense_layers on (num_experts 0: none).
    # head_size / rope_dims None: unset (the other families: d_model // n_heads and the whole head); a
    # LLaDA2 config always sets both (its reader resolves config.json's defaults), and 0 is a value that
    # validate() refuses (the reference's rule: rope_dims even and in (0, head_size]), never "unset".
    head_size: int | None = None
    rope_dims: int | None = None
    qk_norm: bool = False
    attn_out_bias: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    expert_groups: int = 1
    expert_groups_kept: int = 1
    moe_hidden_size: int = 0
    shared_experts: int = 0
    first_dense_layers: int = 0
    routed_scaling: float = 1.0

    @property
    def codec(self) -> ConfigCodec:
        codec = _CODECS.get(self.model_type)
        if codec is None:
            raise CheckpointError(
                f"config: key 'model_type' is {show_value(self.model_type)}; supported: "
                f"{', '.join(supported_model_types())}"
            )
        return codec

    @property
    def family(self) -> str:
        """The family's name (``"llada"``, ``"dream"``): decided by ``model_type`` alone."""
        codec = _CODECS.get(self.model_type)
        return codec.family if codec is not None else self.model_type

    @property
    def shifted_logits(self) -> bool:
        """Whether position ``i`` is read from the output at ``i - 1`` (Dream; ALGORITHMS.md section 5)."""
        return self.codec.shifted_logits

    @property
    def head_dim(self) -> int:
        return self.head_size if self.head_size is not None else self.d_model // self.n_heads

    @property
    def rope_dim(self) -> int:
        return self.rope_dims if self.rope_dims is not None else self.head_dim

    def moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer``'s MLP is a mixture of experts (LLaDA2)."""
        return self.num_experts > 0 and layer >= self.first_dense_layers

    def validate(self, where: str = "config") -> "ModelConfig":
        """Raise ``CheckpointError`` naming ``where`` and the offending key if the config is inconsistent.

        Strict types here (integer keys must be ints, not bools; float keys finite numbers;
        ``weight_tying`` a bool); the values are checked by the C++ validator the engine and the
        ``bb_*`` binaries run (``torch.ops.blockbatch.check_config``: ranges, sizes bounded so
        nothing sized by them asks for absurd memory, ids inside the vocabulary, mask != eos).
        """

        def bad(key: str, msg: str) -> CheckpointError:
            return CheckpointError(f"{where}: key '{key}' {msg}")

        if self.model_type not in _CODECS:
            raise bad(
                "model_type", f"is {show_value(self.model_type)}; supported: {', '.join(supported_model_types())}"
            )
        key = self.codec.key  # field -> the key this family's config.json holds it under
        llada2_sizes = ("head_size", "rope_dims")
        for field in llada2_sizes:
            if field in self.codec.sizes and getattr(self, field) is None:
                raise bad(key(field), f"is unset; a {self.family} config sets it (its reader derives the default)")
            if field not in self.codec.sizes and getattr(self, field) is not None:
                what = "an explicit head size" if field == "head_size" else "partial rotary"
                raise bad(field, f"is set, but {self.family} models have no {what}")
        for field in (*_INT_KEYS, "mask_token_id", "eos_token_id", *_LLADA2_INT_KEYS):
            value = getattr(self, field)
            if field in llada2_sizes and value is None:
                continue
            if field in _LLADA2_INT_KEYS and field not in llada2_sizes and isinstance(value, bool):
                value = int(value)  # qk_norm / attn_out_bias: flags
            if not is_int(value):
                raise bad(key(field), f"must be an integer, got {show_value(value)}")
            if not -_INT64_MAX <= value <= _INT64_MAX:
                raise bad(key(field), f"= {show_value(value)} does not fit in 64 bits")
        for field in (*_FLOAT_KEYS, "routed_scaling"):
            value = getattr(self, field)
            if as_finite(value) is None:
                raise bad(key(field), f"must be a positive finite number, got {show_value(value)}")
        if not isinstance(self.weight_tying, bool):
            raise bad("weight_tying", f"must be true or false, got {show_value(self.weight_tying)}")
        if not isinstance(self.attention_bias, bool):
            raise bad("attention_bias", f"must be true or false, got {show_value(self.attention_bias)}")
        self.codec.check(self, bad)
        from ._C_loader import load_extension
        import torch

        load_extension()
        try:
            torch.ops.blockbatch.check_config(self.int_fields(), self.float_fields())
        except (ValueError, RuntimeError) as e:
            message = str(e).split("\n")[0]
            raise CheckpointError(
                where + message[len("config") :] if message.startswith("config:") else f"{where}: {message}"
            ) from None
        if self.pad_token_id is not None and (
            not is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size
        ):
            raise bad(
                "pad_token_id", f"= {show_value(self.pad_token_id)} is outside the vocabulary [0, {self.vocab_size})"
            )
        if self.bos_token_id is not None and (
            not is_int(self.bos_token_id) or not 0 <= self.bos_token_id < self.vocab_size
        ):
            raise bad(
                "bos_token_id", f"= {show_value(self.bos_token_id)} is outside the vocabulary [0, {self.vocab_size})"
            )
        return self

    # ------------------------------------------------------------------ json

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config") -> ModelConfig:
        """Build from a ``config.json`` dict, in the keys of the family its ``model_type`` names.

        Raises ``CheckpointError`` naming ``where`` and the key for a missing key, a value of the
        wrong JSON type (``"false"`` is not a bool, ``2.0`` not an int, NaN / Infinity not a
        float) or an inconsistent config.
        """
        if not isinstance(raw, dict):
            raise CheckpointError(f"{where}: expected a JSON object at top level, got {type(raw).__name__}")
        keys = KeyReader(raw, where)
        model_type = keys.need("model_type")
        codec = _CODECS.get(model_type) if isinstance(model_type, str) else None
        if codec is None:
            raise keys.bad(
                "model_type", f"is {show_value(model_type)}; supported: {', '.join(supported_model_types())}"
            )
        return codec.read(keys).validate(where)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "ModelConfig":
        path = os.fspath(path)
        raw = read_json_file(path, "config.json", MAX_CONFIG_BYTES)
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        codec = _CODECS.get(model_type) if isinstance(model_type, str) else None
        if codec is not None and codec.generation_config_keys:
            # Some families (Dream) keep their special ids in generation_config.json too; config.json wins.
            gen_path = os.path.join(os.path.dirname(path), GENERATION_CONFIG_NAME)
            if os.path.isfile(gen_path):
                gen = read_json_file(gen_path, GENERATION_CONFIG_NAME, MAX_CONFIG_BYTES)
                if isinstance(gen, dict):
                    raw = dict(raw)
                    for key in codec.generation_config_keys:
                        if raw.get(key) is None and gen.get(key) is not None:
                            raw[key] = gen[key]
        return cls.from_dict(raw, where=path)

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict the checkpoints of this family carry."""
        return self.codec.write(self)

    # ---------------------------------------------------------- for C++

    def int_fields(self) -> dict[str, int]:
        return (
            {
                k: int(getattr(self, k))
                for k in (
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
                )
            }
            | {
                "weight_tying": int(self.weight_tying),
                "attention_bias": int(bool(self.attention_bias)),
                "family": self.codec.cpp_id,
            }
            # unset head_size / rope_dims (the other families) as 0, the only value C++ allows them there
            | {k: int(getattr(self, k) or 0) for k in _LLADA2_INT_KEYS}
        )

    def float_fields(self) -> dict[str, float]:
        return {
            "rope_theta": float(self.rope_theta),
            "rms_norm_eps": float(self.rms_norm_eps),
            "routed_scaling": float(self.routed_scaling),
        }


# The LLaDA2 fields as C++ reads them (csrc/torch/model_handle.cpp; bools as 0 / 1).
_LLADA2_INT_KEYS = (
    "head_size",
    "rope_dims",
    "qk_norm",
    "attn_out_bias",
    "num_experts",
    "experts_per_token",
    "expert_groups",
    "expert_groups_kept",
    "moe_hidden_size",
    "shared_experts",
    "first_dense_layers",
)
