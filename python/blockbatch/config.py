"""Model configuration read from a Hugging Face ``config.json`` (LLaDA and Dream families).

Every id and shape used by the engine comes from here, never from constants in code. The model
family is a property of the checkpoint (``model_type``: ``"llada"`` or ``"Dream"``), never a flag.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from .errors import CheckpointError, read_json_file

SUPPORTED_MODEL_TYPES = ("llada", "Dream")
# model_type (as written in config.json) -> family
FAMILIES = {"llada": "llada", "Dream": "dream"}

# Sane upper bounds of the config values live in C++ (csrc/model/config.h, checked by
# ModelConfig::validate, which ModelConfig.validate below calls): MAX_SEQUENCE_LENGTH, MAX_LAYERS,
# MAX_DIM and MAX_ROPE_ELEMENTS are read from there (module attributes, see __getattr__).
MAX_CONFIG_BYTES = 16 << 20  # config.json is a few hundred bytes
GENERATION_CONFIG_NAME = "generation_config.json"
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


def show_value(value: Any) -> str:
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
    """Architecture and special ids of a bidirectional transformer (LLaDA or Dream family).

    Field names follow LLaDA's ``config.json``; a Dream ``config.json`` (Qwen2 names:
    ``hidden_size``, ``num_hidden_layers``, ...) is read into the same fields by ``from_dict``.
    ``head_dim = d_model // n_heads``. ``family`` follows from ``model_type``; ``attention_bias``
    says the q/k/v projections carry biases (always true for Dream, false for LLaDA).
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

    @property
    def family(self) -> str:
        """``"llada"`` or ``"dream"``: decided by ``model_type`` alone."""
        return FAMILIES.get(self.model_type, self.model_type)

    @property
    def shifted_logits(self) -> bool:
        """Dream reads position ``i`` from the output at ``i - 1`` (ALGORITHMS.md section 5)."""
        return self.family == "dream"

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
            raise bad("model_type", f"is {show_value(self.model_type)}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        for key in (*_INT_KEYS, "mask_token_id", "eos_token_id"):
            value = getattr(self, key)
            if not _is_int(value):
                raise bad(key, f"must be an integer, got {show_value(value)}")
            if not -_INT64_MAX <= value <= _INT64_MAX:
                raise bad(key, f"= {show_value(value)} does not fit in 64 bits")
        for key in _FLOAT_KEYS:
            value = getattr(self, key)
            if _as_finite(value) is None:
                raise bad(key, f"must be a positive finite number, got {show_value(value)}")
        if not isinstance(self.weight_tying, bool):
            raise bad("weight_tying", f"must be true or false, got {show_value(self.weight_tying)}")
        if not isinstance(self.attention_bias, bool):
            raise bad("attention_bias", f"must be true or false, got {show_value(self.attention_bias)}")
        if self.family == "dream":
            self._validate_dream(where)
        elif self.attention_bias:
            raise bad("attention_bias", "is only supported for the Dream family")
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
            raise bad("pad_token_id", f"= {show_value(self.pad_token_id)} is outside the vocabulary [0, {self.vocab_size})")
        if self.bos_token_id is not None and (not _is_int(self.bos_token_id)
                                              or not 0 <= self.bos_token_id < self.vocab_size):
            raise bad("bos_token_id", f"= {show_value(self.bos_token_id)} is outside the vocabulary [0, {self.vocab_size})")
        return self

    def _validate_dream(self, where: str) -> None:
        """Dream checks, worded with the Hugging Face keys of a Dream ``config.json``.

        The C++ validator (``torch.ops.blockbatch.check_config``) checks the same shapes under the
        LLaDA key names; these checks live here so that the message names the key the user
        actually wrote. The C++ checkpoint reader (``csrc/io/checkpoint.cpp``, the ``bb_*``
        binaries) gives the same messages; keep the two in step.
        """

        def bad(key: str, msg: str) -> CheckpointError:
            return CheckpointError(f"{where}: key '{key}' {msg}")

        heads, kv_heads = self.n_heads, self.n_kv_heads
        if _is_int(heads) and _is_int(kv_heads):
            if heads <= 0:
                raise bad("num_attention_heads", f"= {heads} must be positive")
            if kv_heads <= 0 or heads % kv_heads:
                raise bad("num_key_value_heads",
                          f"= {kv_heads} must divide num_attention_heads = {heads} (grouped-query attention)")
            if _is_int(self.d_model) and self.d_model % heads:
                raise bad("hidden_size", f"= {self.d_model} is not a multiple of num_attention_heads = {heads}")
        if _is_int(self.vocab_size) and _is_int(self.mask_token_id) and not 0 <= self.mask_token_id < self.vocab_size:
            raise bad("mask_token_id", f"= {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if not self.attention_bias:
            raise bad("attention_bias", "is false, but Dream's q/k/v projections always carry biases")

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
                raise bad(key, f"must be an integer, got {show_value(value)}")
            return value

        def number(key: str) -> float:
            value = need(key)
            if not _is_number(value):
                raise bad(key, f"must be a number, got {show_value(value)}")
            finite = _as_finite(value)
            if finite is None:
                raise bad(key, f"must be a finite number, got {show_value(value)}")
            return finite

        model_type = need("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise bad("model_type", f"is {show_value(model_type)}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        if FAMILIES[model_type] == "dream":
            return cls._dream_from_dict(raw, where, need, integer, number, present, bad)
        d_model = integer("d_model")
        n_heads = integer("n_heads")
        vocab_size = integer("vocab_size")
        if present("mlp_hidden_size"):
            mlp = integer("mlp_hidden_size")
        elif present("mlp_ratio"):  # LLaDA/OLMo fall back to mlp_ratio * d_model
            ratio = raw["mlp_ratio"]
            if _as_finite(ratio) is None or not ratio > 0:
                raise bad("mlp_ratio", f"must be a positive finite number, got {show_value(ratio)}")
            try:
                mlp = int(ratio * d_model)  # a huge product fails validate() by name (mlp_hidden_size)
            except OverflowError:
                raise bad("mlp_ratio", f"* d_model = {show_value(ratio)} * {d_model} overflows") from None
        else:
            raise CheckpointError(f"{where}: required key 'mlp_hidden_size' is missing")
        eos = need("eos_token_id")
        if isinstance(eos, list):
            if not eos or not all(_is_int(e) for e in eos):
                raise bad("eos_token_id", f"must be an integer or a non-empty list of integers, got {show_value(eos)}")
            eos = eos[0]
        else:
            eos = integer("eos_token_id")
        weight_tying = need("weight_tying")
        if not isinstance(weight_tying, bool):
            raise bad("weight_tying", f"must be true or false (a JSON boolean), got {show_value(weight_tying)}")
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
    def _dream_from_dict(cls, raw, where, need, integer, number, present, bad) -> "ModelConfig":
        """A Dream ``config.json`` (``model_type: "Dream"``, Qwen2 key names)."""

        def special(key: str) -> int | None:
            value = raw.get(key)
            if isinstance(value, list):  # HF allows a list of EOS ids; the first one is the EOS id
                if not value or not all(_is_int(e) for e in value):
                    raise bad(key, f"must be an integer or a non-empty list of integers, got {show_value(value)}")
                return value[0]
            return None if value is None else integer(key)

        tie = raw.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            raise bad("tie_word_embeddings", f"must be true or false (a JSON boolean), got {show_value(tie)}")
        n_heads = integer("num_attention_heads")
        vocab = integer("vocab_size")
        if not present("mask_token_id"):
            raise CheckpointError(f"{where}: required key 'mask_token_id' is missing (from config.json and "
                                  "generation_config.json)")
        eos = special("eos_token_id")
        if eos is None:
            raise CheckpointError(f"{where}: required key 'eos_token_id' is missing (from config.json and "
                                  "generation_config.json)")
        return cls(
            d_model=integer("hidden_size"),
            n_layers=integer("num_hidden_layers"),
            n_heads=n_heads,
            n_kv_heads=integer("num_key_value_heads") if present("num_key_value_heads") else n_heads,
            mlp_hidden_size=integer("intermediate_size"),
            vocab_size=vocab,
            embedding_size=vocab,
            rope_theta=number("rope_theta"),
            rms_norm_eps=number("rms_norm_eps"),
            weight_tying=tie,
            mask_token_id=integer("mask_token_id"),
            eos_token_id=eos,
            max_sequence_length=integer("max_position_embeddings"),
            model_type="Dream",
            pad_token_id=special("pad_token_id"),
            bos_token_id=special("bos_token_id"),
            attention_bias=True,
        ).validate(where)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "ModelConfig":
        path = os.fspath(path)
        raw = read_json_file(path, "config.json", MAX_CONFIG_BYTES)
        if isinstance(raw, dict) and raw.get("model_type") == "Dream":
            # Dream keeps its special ids in generation_config.json too; config.json wins.
            gen_path = os.path.join(os.path.dirname(path), GENERATION_CONFIG_NAME)
            if os.path.isfile(gen_path):
                gen = read_json_file(gen_path, GENERATION_CONFIG_NAME, MAX_CONFIG_BYTES)
                if isinstance(gen, dict):
                    raw = dict(raw)
                    for key in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"):
                        if raw.get(key) is None and gen.get(key) is not None:
                            raw[key] = gen[key]
        return cls.from_dict(raw, where=path)

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict the checkpoints of this family carry (LLaDA or Dream layout)."""
        if self.family == "dream":
            return {
                "architectures": ["DreamModel"],
                "model_type": "Dream",
                "hidden_size": self.d_model,
                "num_hidden_layers": self.n_layers,
                "num_attention_heads": self.n_heads,
                "num_key_value_heads": self.n_kv_heads,
                "intermediate_size": self.mlp_hidden_size,
                "vocab_size": self.vocab_size,
                "rope_theta": self.rope_theta,
                "rms_norm_eps": self.rms_norm_eps,
                "tie_word_embeddings": self.weight_tying,
                "mask_token_id": self.mask_token_id,
                "eos_token_id": self.eos_token_id,
                "pad_token_id": self.pad_token_id,
                "bos_token_id": self.bos_token_id,
                "max_position_embeddings": self.max_sequence_length,
                "hidden_act": "silu",
                "torch_dtype": "float32",
            }
        d = dataclasses.asdict(self)
        del d["bos_token_id"], d["attention_bias"]  # not LLaDA keys
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
            "weight_tying": int(self.weight_tying), "attention_bias": int(bool(self.attention_bias)),
            "family": {"llada": 0, "dream": 1}.get(self.family, -1)}

    def float_fields(self) -> dict[str, float]:
        return {"rope_theta": float(self.rope_theta), "rms_norm_eps": float(self.rms_norm_eps)}
