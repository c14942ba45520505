"""Model configuration read from a Hugging Face ``config.json`` (LLaDA family).

Every id and shape used by the engine comes from here, never from constants in code.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from .errors import CheckpointError

SUPPORTED_MODEL_TYPES = ("llada",)


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
        """Raise ``CheckpointError`` naming the offending key if the config is inconsistent."""

        def bad(key: str, msg: str) -> CheckpointError:
            return CheckpointError(f"{where}: key '{key}' {msg}")

        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise bad("model_type", f"is {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        for key in ("d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size", "vocab_size",
                    "embedding_size", "max_sequence_length"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise bad(key, f"must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise bad("n_heads", f"= {self.n_heads} must divide d_model = {self.d_model}")
        if self.n_heads % self.n_kv_heads:
            raise bad("n_kv_heads", f"= {self.n_kv_heads} must divide n_heads = {self.n_heads}")
        if self.head_dim % 2:
            raise bad("n_heads", f"gives an odd head_dim {self.head_dim}; RoPE needs an even head_dim")
        if self.embedding_size < self.vocab_size:
            raise bad("embedding_size", f"= {self.embedding_size} is smaller than vocab_size = {self.vocab_size}")
        for key in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise bad(key, f"must be a positive number, got {value!r}")
        for key in ("mask_token_id", "eos_token_id"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < self.vocab_size:
                raise bad(key, f"= {value!r} is outside the vocabulary [0, {self.vocab_size})")
        if self.mask_token_id == self.eos_token_id:
            raise bad("eos_token_id", f"= {self.eos_token_id} equals mask_token_id")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise bad("pad_token_id", f"= {self.pad_token_id} is outside the vocabulary [0, {self.vocab_size})")
        return self

    # ------------------------------------------------------------------ json

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config") -> "ModelConfig":
        """Build from a ``config.json`` dict (LLaDA keys). Missing keys raise ``CheckpointError``."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{where}: expected a JSON object at top level")
        model_type = raw.get("model_type")
        if model_type is None:
            raise CheckpointError(f"{where}: key 'model_type' is missing")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"{where}: key 'model_type' is {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")

        def need(key: str) -> Any:
            if key not in raw or raw[key] is None:
                raise CheckpointError(f"{where}: required key '{key}' is missing")
            return raw[key]

        n_heads = need("n_heads")
        vocab_size = need("vocab_size")
        mlp = raw.get("mlp_hidden_size")
        if mlp is None:  # LLaDA/OLMo fall back to mlp_ratio * d_model
            if raw.get("mlp_ratio") is None:
                raise CheckpointError(f"{where}: required key 'mlp_hidden_size' is missing")
            mlp = int(raw["mlp_ratio"] * need("d_model"))
        eos = need("eos_token_id")
        if isinstance(eos, list):
            if not eos:
                raise CheckpointError(f"{where}: key 'eos_token_id' is an empty list")
            eos = eos[0]
        return cls(
            d_model=need("d_model"),
            n_layers=need("n_layers"),
            n_heads=n_heads,
            n_kv_heads=raw.get("n_kv_heads") if raw.get("n_kv_heads") is not None else n_heads,
            mlp_hidden_size=mlp,
            vocab_size=vocab_size,
            embedding_size=raw.get("embedding_size") if raw.get("embedding_size") is not None else vocab_size,
            rope_theta=float(need("rope_theta")),
            rms_norm_eps=float(need("rms_norm_eps")),
            weight_tying=bool(need("weight_tying")),
            mask_token_id=need("mask_token_id"),
            eos_token_id=eos,
            max_sequence_length=need("max_sequence_length"),
            model_type=model_type,
            pad_token_id=raw.get("pad_token_id"),
        ).validate(where)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "ModelConfig":
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: config.json not found") from None
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: not valid JSON ({e})") from None
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
