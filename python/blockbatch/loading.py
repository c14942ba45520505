"""Hugging Face checkpoint folders: strict reading and writing (LLaDA and Dream weight layouts).

The weight layout follows the family that ``config.json``'s ``model_type`` names: LLaDA
(``model.transformer.*``) or Dream (Qwen2 names, ``model.layers.{i}.self_attn.q_proj.bias``, ...).

A folder holds ``config.json``, weights in ``model.safetensors`` or in shards listed by
``model.safetensors.index.json``, and optionally ``tokenizer.json`` (+ ``tokenizer_config.json``
with a chat template). Weights are memory-mapped by the ``safetensors`` package after we have
validated every header ourselves, so a malformed file is refused before any data is touched
and every error names the file and the tensor or key at fault.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from typing import Any

import torch

from . import families
from .config import GENERATION_CONFIG_NAME, ModelConfig, show_value
from .errors import CheckpointError, checked_exists, open_checked, parse_json_bytes, read_file_bytes, read_json_file

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"

# safetensors dtype tag -> (torch dtype, bytes per element)
_ST_DTYPES: dict[str, tuple[torch.dtype | None, int]] = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
    "F8_E4M3": (None, 1),
    "F8_E5M2": (None, 1),
    "U16": (None, 2),
    "U32": (None, 4),
    "U64": (None, 8),
}
WEIGHT_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
_MAX_HEADER_BYTES = 100 * 1024 * 1024
_MAX_INDEX_BYTES = 100 * 1024 * 1024
_MAX_TOKENIZER_BYTES = 1 << 30
_MAX_TOKENIZER_CONFIG_BYTES = 256 * 1024 * 1024


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``config``'s family must hold, with its shape (HF names)."""
    return families.weight_shapes(config)


# --------------------------------------------------------------------------- headers


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets into the data section
    end: int


def read_safetensors_header(path: str) -> dict[str, TensorInfo]:
    """Parse and validate a safetensors header without touching the tensor data.

    Checks: 8-byte length prefix, header size within the file, JSON object, known dtypes,
    shapes of non-negative integers, ``data_offsets`` that match ``numel * itemsize`` and tile
    the data section exactly (no gaps, overlaps or bytes past the end of the file).
    """
    f, file_size = open_checked(path, "safetensors file")
    with f:
        try:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: file is {file_size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", prefix)
            if n > _MAX_HEADER_BYTES or 8 + n > file_size:
                raise CheckpointError(
                    f"{path}: header length {n} does not fit in the {file_size}-byte file "
                    "(truncated or not safetensors)"
                )
            raw = f.read(n)
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read the safetensors header ({e.strerror or e})") from None
    if len(raw) != n:
        raise CheckpointError(f"{path}: the file shrank while its header was read")
    header = parse_json_bytes(raw, path, "header")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header must be a JSON object")
    data_size = file_size - 8 - n
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise CheckpointError(f"{path}: '__metadata__' must be an object of strings")
            continue
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise CheckpointError(f"{path}: tensor '{name}': entry must have exactly dtype, shape, data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in _ST_DTYPES:
            raise CheckpointError(f"{path}: tensor '{name}': unknown dtype {show_value(dtype)}")
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            raise CheckpointError(
                f"{path}: tensor '{name}': shape {show_value(shape)} is not a list of non-negative integers"
            )
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise CheckpointError(f"{path}: tensor '{name}': data_offsets {show_value(offsets)} are not [begin <= end]")
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * _ST_DTYPES[dtype][1]
        if offsets[1] - offsets[0] != nbytes:
            raise CheckpointError(
                f"{path}: tensor '{name}': data_offsets {offsets} span {offsets[1] - offsets[0]} bytes but "
                f"{dtype}{shape} needs {nbytes}"
            )
        if offsets[1] > data_size:
            raise CheckpointError(
                f"{path}: tensor '{name}': data_offsets end {offsets[1]} is past the data section "
                f"({data_size} bytes): file truncated?"
            )
        infos[name] = TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])
    expected_begin = 0
    for info in sorted(infos.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != expected_begin:
            what = "overlaps the previous tensor" if info.begin < expected_begin else "leaves a gap before it"
            raise CheckpointError(f"{path}: tensor '{info.name}': data_offsets begin {info.begin} {what}")
        expected_begin = info.end
    if expected_begin != data_size:
        raise CheckpointError(
            f"{path}: tensors cover {expected_begin} bytes but the data section holds {data_size}: header lies"
        )
    return infos


# --------------------------------------------------------------------------- checkpoint


@dataclasses.dataclass
class Checkpoint:
    """A loaded checkpoint: config, named weights (HF names), tokenizer (or None)."""

    path: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Any = None  # tokenizers.Tokenizer
    chat_template: str | None = None

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.weights.values())).dtype

    @property
    def proposal_vocab(self) -> int | None:
        """Dream family: one past the largest id the tokenizer can produce, when the embedding table
        is larger (Dream-7B: 152064 rows); the decoders never propose the ids above it. None: every
        id (no tokenizer, a tokenizer covering the table, or the LLaDA family)."""
        if self.tokenizer is None or not families.of(self.config).PROPOSALS_WITHIN_TOKENIZER:
            return None
        ids = self.tokenizer.get_vocab(with_added_tokens=True).values()
        bound = max(ids, default=-1) + 1
        if bound >= self.config.vocab_size or bound <= self.config.eos_token_id:
            return None
        return bound


def _weight_files(folder: str) -> tuple[dict[str, str], str]:
    """Map tensor name -> file that holds it, and the file that lists them (index or single file)."""
    index_path = os.path.join(folder, INDEX_NAME)
    single = os.path.join(folder, WEIGHTS_NAME)
    if checked_exists(index_path):
        index = read_json_file(index_path, INDEX_NAME, _MAX_INDEX_BYTES)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path}: key 'weight_map' is missing or empty")
        out = {}
        checked: set[str] = set()
        for name, shard in weight_map.items():
            if (
                not isinstance(shard, str)
                or shard in ("", ".", "..")
                or os.path.basename(shard) != shard
                or "\\" in shard
                or "\0" in shard
            ):
                raise CheckpointError(
                    f"{index_path}: tensor '{name}' maps to {show_value(shard)}, not a file name in the folder"
                )
            shard_path = os.path.join(folder, shard)
            if shard not in checked:
                if not checked_exists(shard_path):
                    raise CheckpointError(f"{index_path}: tensor '{name}' lives in missing shard {shard}")
                checked.add(shard)
            out[name] = shard_path
        return out, index_path
    if checked_exists(single):
        return {name: single for name in read_safetensors_header(single)}, single
    raise CheckpointError(f"{folder}: no {WEIGHTS_NAME} and no {INDEX_NAME}")


def tensor_count(config: ModelConfig) -> int:
    """How many tensors a checkpoint with this config holds (without listing them)."""
    return families.tensor_count(config)


def check_finite_default() -> bool:
    """Whether loading checks the weights finite when the caller does not say: BLOCKBATCH_CHECK_FINITE
    (settings.py; default 1, 0 skips the check)."""
    from . import settings

    try:
        return settings.value("BLOCKBATCH_CHECK_FINITE") == "1"
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def check_weights_finite(weights: dict[str, torch.Tensor], files: dict[str, str]) -> None:
    """Raise ``CheckpointError`` naming the file and the first tensor holding a NaN or an Inf.

    One pass over each tensor without a temporary (``torch.aminmax``: a NaN makes both ends NaN, an Inf
    shows at an end): about 0.15 s (float32) to 0.25 s (bfloat16) per GB on one CPU thread, pages in memory.
    """
    for name, t in weights.items():
        if t.numel() == 0:
            continue
        lo_t, hi_t = torch.aminmax(t)
        lo, hi = float(lo_t), float(hi_t)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            what = "NaN" if math.isnan(lo) or math.isnan(hi) else "Inf"
            raise CheckpointError(
                f"{files.get(name, '?')}: tensor '{name}' holds a non-finite value ({what}); a model with NaN / "
                "Inf weights decodes garbage (check_finite=False or BLOCKBATCH_CHECK_FINITE=0 skips this check)"
            )


def load_weights(
    folder: str, config: ModelConfig, dtype: torch.dtype | None = None, check_finite: bool | None = None
) -> dict[str, torch.Tensor]:
    """Read and validate every weight tensor; returns HF-named tensors (memory-mapped when no cast).

    ``check_finite``: refuse a tensor holding NaN / Inf (None: BLOCKBATCH_CHECK_FINITE, default on)."""
    if check_finite is None:
        check_finite = check_finite_default()
    from safetensors import safe_open

    files, listing = _weight_files(folder)
    headers = {path: read_safetensors_header(path) for path in sorted(set(files.values()))}
    # The config is checked against the weight files before anything sized by it is built: a
    # 500-byte config.json must not make us list 10^9 tensor names (or allocate anything else).
    # The count is computed without listing (families.tensor_count); it may exceed what the files hold by
    # a few tensors (then each missing one is named below), never by more than what they hold: a config
    # whose list would be larger (num_experts 65536 beside a toy) is refused here, in microseconds.
    needed = tensor_count(config)
    held = len(files)
    if config.n_layers > held or needed > 2 * held:
        codec = config.codec
        keys = [f"'{codec.key('n_layers')}' = {config.n_layers}"]
        if config.num_experts:
            keys.append(f"'num_experts' = {config.num_experts}")
        raise CheckpointError(
            f"{os.path.join(folder, CONFIG_NAME)}: key{'s' if len(keys) > 1 else ''} {' and '.join(keys)} "
            f"need{'' if len(keys) > 1 else 's'} {needed} tensors but {listing} holds {held}"
        )
    expected = expected_weight_shapes(config)
    for name, path in files.items():
        if name not in headers[path]:
            raise CheckpointError(f"{path}: tensor '{name}' is listed in the index but absent from this shard")
        if name not in expected:
            raise CheckpointError(
                f"{path}: unexpected tensor '{name}' (not part of a {_family_name(config)} model with this config)"
            )
    for path, infos in headers.items():
        for name in infos:
            if files.get(name) != path:
                raise CheckpointError(f"{path}: unexpected tensor '{name}' (not listed for this file)")
    for name, shape in expected.items():
        if name not in files:
            hint = families.of(config).missing_tensor_hint(name)
            if listing.endswith(INDEX_NAME):  # sharded: the index decides what exists
                raise CheckpointError(f"{listing}: the index ({INDEX_NAME}) does not list tensor '{name}'{hint}")
            raise CheckpointError(f"{listing}: tensor '{name}' is missing{hint}")
        info = headers[files[name]][name]
        if info.shape != shape:
            raise CheckpointError(
                f"{files[name]}: tensor '{name}' has shape {list(info.shape)}, expected {list(shape)}"
            )
        if info.dtype not in WEIGHT_DTYPES:
            raise CheckpointError(
                f"{files[name]}: tensor '{name}' has dtype {info.dtype}; weights must be F32, BF16 or F16"
            )
    stored = {headers[files[n]][n].dtype for n in expected}
    if dtype is None and len(stored) > 1:
        raise CheckpointError(f"{folder}: tensors mix dtypes {sorted(stored)}; pass dtype= to convert them")
    weights: dict[str, torch.Tensor] = {}
    for path in headers:
        try:
            with safe_open(path, framework="pt") as f:
                for name in headers[path]:
                    t = f.get_tensor(name)
                    weights[name] = t if dtype is None or t.dtype == dtype else t.to(dtype)
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{path}: cannot read tensors ({e})") from None
    out = {name: weights[name] for name in expected}
    if check_finite:  # after any cast: a value float16 cannot hold is Inf there, as the forward would see it
        check_weights_finite(out, files)
    return out


def _family_name(config: ModelConfig) -> str:
    return families.of(config).DISPLAY_NAME


def load_tokenizer(folder: str):
    """``tokenizers.Tokenizer`` from ``tokenizer.json`` (None when absent) and the chat template.

    The chat template (``tokenizer_config.json`` key ``chat_template``) is compiled here, so a
    Jinja syntax error is reported at load time naming the file, key and line.
    """
    path = os.path.join(folder, TOKENIZER_NAME)
    if not checked_exists(path):
        return None, None
    from tokenizers import Tokenizer

    data = read_file_bytes(path, TOKENIZER_NAME, _MAX_TOKENIZER_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    try:
        tokenizer = Tokenizer.from_str(text)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: B036 - tokenizers' Rust panics derive from BaseException
        raise CheckpointError(f"{path}: cannot parse tokenizer ({str(e)[:300]})") from None
    template = None
    cfg_path = os.path.join(folder, TOKENIZER_CONFIG_NAME)
    if checked_exists(cfg_path):
        tok_cfg = read_json_file(cfg_path, TOKENIZER_CONFIG_NAME, _MAX_TOKENIZER_CONFIG_BYTES)
        template = tok_cfg.get("chat_template") if isinstance(tok_cfg, dict) else None
        template = _pick_chat_template(template, cfg_path)
        if template is not None:
            check_chat_template(template, f"{cfg_path}: key 'chat_template'")
    return tokenizer, template


def _pick_chat_template(template: Any, cfg_path: str) -> str | None:
    """A template string; Hugging Face also allows a list of {"name", "template"} (take "default")."""
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        for item in template:
            if not (
                isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str)
            ):
                raise CheckpointError(
                    f'{cfg_path}: key \'chat_template\' must be a string or a list of {{"name", "template"}} '
                    f"objects, got an entry {show_value(item)}"
                )
        named = {item["name"]: item["template"] for item in template}
        return named.get("default")
    raise CheckpointError(f"{cfg_path}: key 'chat_template' must be a string, got {type(template).__name__}")


def check_chat_template(template: str, where: str) -> None:
    """Compile a chat template (when jinja2 is installed); a syntax error names ``where`` and the line."""
    try:
        import jinja2
    except ImportError:  # rendering will say jinja2 is needed
        return
    from .tokenization import chat_environment

    try:
        chat_environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise CheckpointError(f"{where} has a Jinja syntax error at line {e.lineno}: {e.message}") from None
    except (jinja2.TemplateError, RecursionError, MemoryError) as e:
        raise CheckpointError(f"{where} cannot be compiled ({type(e).__name__}: {e})") from None


def load_checkpoint(
    path: str | os.PathLike, dtype: torch.dtype | None = None, check_finite: bool | None = None
) -> Checkpoint:
    """Load a Hugging Face LLaDA or Dream checkpoint folder (the family comes from ``model_type``).

    Parameters
    ----------
    path: folder with ``config.json``, ``model.safetensors`` (or sharded + index) and
        optionally ``tokenizer.json``.
    dtype: convert weights to this dtype (float32, bfloat16, float16); None keeps the stored one.
    check_finite: refuse a weight holding NaN / Inf, naming it and its file (about 0.15-0.25 s per GB);
        None: the BLOCKBATCH_CHECK_FINITE environment variable (default 1: check; 0: skip).
    """
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: not a checkpoint folder (does not exist or is not a directory)")
    if dtype is not None and dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise CheckpointError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    config = ModelConfig.from_json_file(os.path.join(folder, CONFIG_NAME))
    weights = load_weights(folder, config, dtype, check_finite)
    tokenizer, template = load_tokenizer(folder)
    if tokenizer is not None and tokenizer.get_vocab_size() > config.vocab_size:
        raise CheckpointError(
            f"{os.path.join(folder, TOKENIZER_NAME)}: tokenizer has {tokenizer.get_vocab_size()} tokens, "
            f"more than vocab_size = {config.vocab_size}"
        )
    return Checkpoint(folder, config, weights, tokenizer, template)


# --------------------------------------------------------------------------- writing


def save_checkpoint(
    path: str | os.PathLike,
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    tokenizer=None,
    chat_template: str | None = None,
    max_shard_bytes: int | None = None,
) -> None:
    """Write a checkpoint folder in the exact HF layout of ``config``'s family (LLaDA or Dream).

    ``max_shard_bytes`` splits the weights into ``model-0000i-of-0000n.safetensors`` shards with
    a ``model.safetensors.index.json``, as large HF checkpoints are.
    """
    from safetensors.torch import save_file

    folder = os.fspath(path)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, CONFIG_NAME), "w", encoding="utf-8") as f:
        json.dump(config.to_dict(), f, indent=2)
    tensors = {name: t.detach().contiguous().cpu() for name, t in weights.items()}
    if max_shard_bytes is None:
        save_file(tensors, os.path.join(folder, WEIGHTS_NAME), metadata={"format": "pt"})
    else:
        shards: list[dict[str, torch.Tensor]] = [{}]
        size = 0
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][name] = t
            size += nbytes
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, os.path.join(folder, fname), metadata={"format": "pt"})
            weight_map.update({name: fname for name in shard})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        with open(os.path.join(folder, INDEX_NAME), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if tokenizer is not None:
        tokenizer.save(os.path.join(folder, TOKENIZER_NAME))
    if chat_template is not None:
        with open(os.path.join(folder, TOKENIZER_CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump({"chat_template": chat_template}, f, indent=2)
    gen = families.of(config).generation_config(config)
    if gen is not None:  # Dream checkpoints carry their special ids there as well
        with open(os.path.join(folder, GENERATION_CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(gen, f, indent=2)
