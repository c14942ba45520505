"""Model configuration read from a Hugging Face ``config.json`` (LLaDA family).

Every id and shape used by the engine comes from here, never from constants in code.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from .errors import CheckpointError, read_json_file

SUPPORTED_MODEL_TYPES = ("llada",)

# Sane upper bounds, checked before anything sized by a config value is allocated. The weight
# files bound the shapes (every tensor's shape is checked against them); these bound what no
# weight does: the RoPE table is [max_sequence_length, head_dim] (float32, plus float64
# temporaries), and the per-layer tensor list is n_layers long.
MAX_SEQUENCE_LENGTH = 1 << 20
MAX_LAYERS = 1 << 16
MAX_DIM = 1 << 24  # d_model, mlp_hidden_size, vocab_size, embedding_size
MAX_ROPE_ELEMENTS = 1 << 28  # max_sequence_length * head_dim
MAX_CONFIG_BYTES = 16 << 20  # config.json is a few hundred bytes

_INT_KEYS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size", "vocab_size", "embedding_size",
             "max_sequence_length")
_FLOAT_KEYS = ("rope_theta", "rms_norm_eps")


def _show(value: Any) -> str:
    """repr of a config value, cut short (a fuzzed file can hold megabyte strings)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, NaN, infinite, or an int beyond float range)."""
    if not _is_number(value):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture and special ids of a LLaDA-style bidirectional transformer.

    Field names follow LLaDA's ``config.json``. ``head_dim = d_model // n_heads``.
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

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def validate(self, where: str = "config") -> "ModelConfig":
        """Raise ``CheckpointError`` naming ``where`` and the offending key if the config is inconsistent.

        Strict types: integer keys must be ints (not bools), float keys finite numbers,
        ``weight_tying`` a bool; sizes are bounded (``MAX_DIM``, ``MAX_LAYERS``,
        ``MAX_SEQUENCE_LENGTH``) so nothing sized by them can ask for absurd memory.
        """

        def bad(key: str, msg: str) -> CheckpointError:
            return CheckpointError(f"{where}: key '{key}' {msg}")

        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise bad("model_type", f"is {_show(self.model_type)}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        limits = {"n_layers": MAX_LAYERS, "max_sequence_length": MAX_SEQUENCE_LENGTH}
        for key in _INT_KEYS:
            value = getattr(self, key)
            if not _is_int(value) or value <= 0:
                raise bad(key, f"must be a positive integer, got {_show(value)}")
            limit = limits.get(key, MAX_DIM)
            if value > limit:
                raise bad(key, f"= {_show(value)} is larger than the supported maximum {limit}")
        if self.d_model % self.n_heads:
            raise bad("n_heads", f"= {self.n_heads} must divide d_model = {self.d_model}")
        if self.n_heads % self.n_kv_heads:
            raise bad("n_kv_heads", f"= {self.n_kv_heads} must divide n_heads = {self.n_heads}")
        if self.head_dim % 2:
            raise bad("n_heads", f"gives an odd head_dim {self.head_dim}; RoPE needs an even head_dim")
        if self.max_sequence_length * self.head_dim > MAX_ROPE_ELEMENTS:
            raise bad("max_sequence_length", f"= {self.max_sequence_length} times head_dim = {self.head_dim} is more "
                                             f"than the {MAX_ROPE_ELEMENTS} entries the RoPE table may hold")
        if self.embedding_size < self.vocab_size:
            raise bad("embedding_size", f"= {self.embedding_size} is smaller than vocab_size = {self.vocab_size}")
        for key in _FLOAT_KEYS:
            value = getattr(self, key)
            if _as_finite(value) is None or not value > 0:
                raise bad(key, f"must be a positive finite number, got {_show(value)}")
        if not isinstance(self.weight_tying, bool):
            raise bad("weight_tying", f"must be true or false, got {_show(self.weight_tying)}")
        for key in ("mask_token_id", "eos_token_id"):
            value = getattr(self, key)
            if not _is_int(value) or not 0 <= value < self.vocab_size:
                raise bad(key, f"= {_show(value)} is outside the vocabulary [0, {self.vocab_size})")
        if self.mask_token_id == self.eos_token_id:
            raise bad("eos_token_id", f"= {self.eos_token_id} equals mask_token_id")
        if self.pad_token_id is not None and (not _is_int(self.pad_token_id)
                                              or not 0 <= self.pad_token_id < self.vocab_size):
            raise bad("pad_token_id", f"= {_show(self.pad_token_id)} is outside the vocabulary [0, {self.vocab_size})")
        return self

    # ------------------------------------------------------------------ json

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config") -> "ModelConfig":
        """Build from a ``config.json`` dict (LLaDA keys).

        Raises ``CheckpointError`` naming ``where`` and the key for a missing key, a value of the
        wrong JSON type (``"false"`` is not a bool, ``2.0`` not an int, NaN / Infinity not a
        float) or an inconsistent config.
        """
        if not isinstance(raw, dict):
            raise CheckpointError(f"{where}: expected a JSON object at top level, got {type(raw).__name__}")

        def bad(key: str, msg: str) -> CheckpointError:
            return CheckpointError(f"{where}: key '{key}' {msg}")

        def present(key: str) -> bool:
            return raw.get(key) is not None

        def need(key: str) -> Any:
            if not present(key):
                raise CheckpointError(f"{where}: required key '{key}' is missing")
            return raw[key]

        def integer(key: str) -> int:
            value = need(key)
            if not _is_int(value):
                raise bad(key, f"must be an integer, got {_show(value)}")
            return value

        def number(key: str) -> float:
            value = need(key)
            if not _is_number(value):
                raise bad(key, f"must be a number, got {_show(value)}")
            finite = _as_finite(value)
            if finite is None:
                raise bad(key, f"must be a finite number, got {_show(value)}")
            return finite

        model_type = need("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise bad("model_type", f"is {_show(model_type)}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        d_model = integer("d_model")
        n_heads = integer("n_heads")
        vocab_size = integer("vocab_size")
        if present("mlp_hidden_size"):
            mlp = integer("mlp_hidden_size")
        elif present("mlp_ratio"):  # LLaDA/OLMo fall back to mlp_ratio * d_model
            ratio = raw["mlp_ratio"]
            if _as_finite(ratio) is None or not ratio > 0:
                raise bad("mlp_ratio", f"must be a positive finite number, got {_show(ratio)}")
            if d_model > MAX_DIM or ratio > MAX_DIM:
                raise bad("mlp_ratio", f"* d_model = {_show(ratio)} * {d_model} is larger than {MAX_DIM}")
            mlp = int(ratio * d_model)
        else:
            raise CheckpointError(f"{where}: required key 'mlp_hidden_size' is missing")
        eos = need("eos_token_id")
        if isinstance(eos, list):
            if not eos or not all(_is_int(e) for e in eos):
                raise bad("eos_token_id", f"must be an integer or a non-empty list of integers, got {_show(eos)}")
            eos = eos[0]
        else:
            eos = integer("eos_token_id")
        weight_tying = need("weight_tying")
        if not isinstance(weight_tying, bool):
            raise bad("weight_tying", f"must be true or false (a JSON boolean), got {_show(weight_tying)}")
        pad = raw.get("pad_token_id")
        if pad is not None:
            pad = integer("pad_token_id")
        return cls(
            d_model=d_model,
            n_layers=integer("n_layers"),
            n_heads=n_heads,
            n_kv_heads=integer("n_kv_heads") if present("n_kv_heads") else n_heads,
            mlp_hidden_size=mlp,
            vocab_size=vocab_size,
            embedding_size=integer("embedding_size") if present("embedding_size") else vocab_size,
            rope_theta=number("rope_theta"),
            rms_norm_eps=number("rms_norm_eps"),
            weight_tying=weight_tying,
            mask_token_id=integer("mask_token_id"),
            eos_token_id=eos,
            max_sequence_length=integer("max_sequence_length"),
            model_type=model_type,
            pad_token_id=pad,
        ).validate(where)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "ModelConfig":
        path = os.fspath(path)
        raw = read_json_file(path, "config.json", MAX_CONFIG_BYTES)
        return cls.from_dict(raw, where=path)

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict LLaDA checkpoints carry (plus our ``head_dim``-free keys)."""
        d = dataclasses.asdict(self)
        d.update({
            "architectures": ["LLaDAModelLM"],
            "activation_type": "silu",
            "block_type": "llama",
            "layer_norm_type": "rms",
            "rope": True,
            "include_bias": False,
        })
        return d

    # ---------------------------------------------------------- for C++

    def int_fields(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in (
            "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size", "vocab_size",
            "embedding_size", "mask_token_id", "eos_token_id", "max_sequence_length")} | {
            "weight_tying": int(self.weight_tying)}

    def float_fields(self) -> dict[str, float]:
        return {"rope_theta": float(self.rope_theta), "rms_norm_eps": float(self.rms_norm_eps)}
