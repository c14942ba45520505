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

# Sane upper bounds of the config values live in C++ (csrc/model/config.h, checked by
# ModelConfig::validate, which ModelConfig.validate below calls): MAX_SEQUENCE_LENGTH, MAX_LAYERS,
# MAX_DIM and MAX_ROPE_ELEMENTS are read from there (module attributes, see __getattr__).
MAX_CONFIG_BYTES = 16 << 20  # config.json is a few hundred bytes
_INT64_MAX = (1 << 63) - 1


def __getattr__(name: str) -> int:
    limits = {"MAX_SEQUENCE_LENGTH": "max_sequence_length", "MAX_LAYERS": "layers", "MAX_DIM": "dim",
              "MAX_ROPE_ELEMENTS": "rope_elements"}
    if name in limits:
        from ._C_loader import load_extension
        import torch

        load_extension()
        return int(torch.ops.blockbatch.config_limits()[limits[name]])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

        Strict types here (integer keys must be ints, not bools; float keys finite numbers;
        ``weight_tying`` a bool); the values are checked by the C++ validator the engine and the
        ``bb_*`` binaries run (``torch.ops.blockbatch.check_config``: ranges, sizes bounded so
        nothing sized by them asks for absurd memory, ids inside the vocabulary, mask != eos).
        """

        def bad(key: str, msg: str) -> CheckpointError:
            return CheckpointError(f"{where}: key '{key}' {msg}")

        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise bad("model_type", f"is {_show(self.model_type)}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        for key in (*_INT_KEYS, "mask_token_id", "eos_token_id"):
            value = getattr(self, key)
            if not _is_int(value):
                raise bad(key, f"must be an integer, got {_show(value)}")
            if not -_INT64_MAX <= value <= _INT64_MAX:
                raise bad(key, f"= {_show(value)} does not fit in 64 bits")
        for key in _FLOAT_KEYS:
            value = getattr(self, key)
            if _as_finite(value) is None:
                raise bad(key, f"must be a positive finite number, got {_show(value)}")
        if not isinstance(self.weight_tying, bool):
            raise bad("weight_tying", f"must be true or false, got {_show(self.weight_tying)}")
        from ._C_loader import load_extension
        import torch

        load_extension()
        try:
            torch.ops.blockbatch.check_config(self.int_fields(), self.float_fields())
        except (ValueError, RuntimeError) as e:
            message = str(e).split("\n")[0]
            raise CheckpointError(where + message[len("config"):] if message.startswith("config:")
                                  else f"{where}: {message}") from None
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
            try:
                mlp = int(ratio * d_model)  # a huge product fails validate() by name (mlp_hidden_size)
            except OverflowError:
                raise bad("mlp_ratio", f"* d_model = {_show(ratio)} * {d_model} overflows") from None
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
