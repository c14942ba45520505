"""``Engine``: load a checkpoint once, decode prompts with any policy in the native op."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Iterable, Sequence

import torch

from .loading import load_checkpoint
from .native import NativeModel
from .options import DecodeOptions, run_decode, run_decode_batch
from .tokenization import TextCodec


@dataclasses.dataclass
class Generation:
    """One decoded request."""

    text: str                 # generation trimmed at the first EOS / end-of-turn ("" without tokenizer)
    ids: list[int]            # generated ids, trimmed the same way
    raw_ids: list[int]        # all gen_length generated ids
    prompt_ids: list[int]
    stats: dict[str, Any]     # nfe, nfe_full, nfe_block, ..., committed_per_step, branches, wall_ms


class Engine:
    """A model held by the native engine plus its tokenizer.

    >>> engine = Engine.from_pretrained()                      # the shipped toy model
    >>> engine.generate("72-2=__-3=__-3=__...............?", DecodeOptions(policy="blockbatch", gen_length=128))
    """

    def __init__(self, checkpoint, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but no CUDA device is available")
        self.model = NativeModel.from_checkpoint(checkpoint, dtype=dtype, device=self.device)
        self.last_batch_stats: dict | None = None  # the last batched generate's counters (packed forwards, ...)
        self.codec = TextCodec(checkpoint.tokenizer, self.config, checkpoint.chat_template) \
            if checkpoint.tokenizer is not None else None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike | None = None, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None) -> "Engine":
        """Load a Hugging Face LLaDA folder; ``None`` loads the toy model shipped in the package."""
        if path is None:
            from .toy import checkpoint_path

            path = checkpoint_path()
        return cls(load_checkpoint(path), device, dtype)

    def encode(self, prompt: str | Sequence[int] | torch.Tensor, chat: bool | None = None,
               allow_unknown: bool = False, name: str = "prompt") -> torch.Tensor:
        """Token ids of one prompt: text (through the chat template by default when the checkpoint
        has one), a sequence of ints, or a 1-D int64 tensor. ``name`` is used in error messages.

        Text with characters outside the tokenizer's vocabulary raises ``ValueError`` naming them
        and their positions; ``allow_unknown=True`` encodes them as the unknown token instead.
        """
        if isinstance(prompt, str):
            if self.codec is None:
                raise ValueError(f"{name}: this checkpoint has no tokenizer.json: pass token ids instead of text")
            try:
                ids = torch.tensor(self.codec.encode(prompt, chat, allow_unknown=allow_unknown), dtype=torch.long)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        elif isinstance(prompt, torch.Tensor):
            if prompt.dtype != torch.long:
                raise TypeError(f"{name}: prompt token ids must be int64, got {prompt.dtype}")
            if prompt.dim() != 1:
                raise ValueError(f"{name}: a prompt tensor must be 1-D, got shape {tuple(prompt.shape)}")
            ids = prompt.cpu()
        elif isinstance(prompt, (list, tuple)):
            for i, token in enumerate(prompt):
                if not _is_token_id(token):
                    raise TypeError(f"{name}[{i}] must be an integer token id, got {type(token).__name__} "
                                    f"{_short(token)}")
            ids = torch.tensor([int(i) for i in prompt], dtype=torch.long)
        else:
            raise TypeError(f"{name} must be a str, a list of token ids or a 1-D int64 tensor, got "
                            f"{type(prompt).__name__}")
        if ids.numel() == 0:
            raise ValueError(f"{name}: prompt is empty")
        return ids

    def generate(self, prompts: str | Sequence[int] | torch.Tensor | Iterable[str | Sequence[int] | torch.Tensor],
                 options: DecodeOptions | Sequence[DecodeOptions] | None = None, chat: bool | None = None,
                 progress: bool = False, allow_unknown: bool = False, max_batch: int = 1,
                 kv_budget_bytes: int = 0) -> list[Generation]:
        """Decode each prompt (text, a list of ids, or a 1-D/2-D int64 tensor); results in input order.

        ``prompts`` is one prompt or a list / tuple of prompts; anything else (a dict, a set, a
        generator of characters, bytes) raises ``TypeError`` naming the argument. ``options`` is
        one DecodeOptions for every prompt or a list with one per prompt. ``max_batch`` > 1 (CPU)
        decodes up to that many requests together, their forwards packed into one per step
        (``torch.ops.blockbatch.decode_batch``; ``kv_budget_bytes`` caps their shared KV pool, 0:
        room for ``max_batch`` requests). Either way a request's result never depends on the
        others: batched, its tokens and counters are those of its decode alone.
        """
        if isinstance(options, (list, tuple)):
            per_prompt = list(options)
            for i, o in enumerate(per_prompt):
                if not isinstance(o, DecodeOptions):
                    raise TypeError(f"options[{i}] must be a DecodeOptions, got {type(o).__name__}")
        else:
            options = DecodeOptions() if options is None else options
            if not isinstance(options, DecodeOptions):
                raise TypeError(f"options must be a DecodeOptions or a list of them, got {type(options).__name__}")
            per_prompt = None
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if isinstance(prompts, str) or (isinstance(prompts, torch.Tensor) and prompts.dim() == 1) or (
                isinstance(prompts, (list, tuple)) and prompts and all(_is_token_id(t) for t in prompts)):
            prompts = [prompts]
        elif isinstance(prompts, torch.Tensor):
            if prompts.dim() != 2:
                raise ValueError(f"prompts: a prompt tensor must be 1-D or 2-D, got shape {tuple(prompts.shape)}")
            prompts = list(prompts)
        elif isinstance(prompts, (list, tuple)):
            prompts = list(prompts)
        else:
            raise TypeError(f"prompts must be a str, a list of token ids, an int64 tensor or a list of those, got "
                            f"{type(prompts).__name__}")
        if not prompts:
            raise ValueError("prompts is empty: pass at least one prompt")
        encoded = [self.encode(p, chat, allow_unknown=allow_unknown, name=f"prompts[{i}]" if len(prompts) > 1
                               else "prompt") for i, p in enumerate(prompts)]
        if per_prompt is not None and len(per_prompt) != len(encoded):
            raise ValueError(f"options: {len(per_prompt)} DecodeOptions for {len(encoded)} prompts (give one, or one "
                             f"per prompt)")
        opts = per_prompt if per_prompt is not None else [options] * len(encoded)
        if max_batch > 1 and len(encoded) > 1 and self.device.type == "cpu":
            results, self.last_batch_stats = run_decode_batch(self.model.obj, encoded, opts, max_batch,
                                                              kv_budget_bytes)
        else:
            results = None
        out = []
        bar = _Progress(len(prompts)) if progress and len(prompts) > 1 else None
        for i, ids in enumerate(encoded):
            result = results[i] if results is not None else run_decode(self.model.obj, ids.to(self.device), opts[i])
            raw = result.tokens[ids.numel():].tolist()
            trimmed = self.codec.trim(raw) if self.codec else _trim_eos(raw, self.config.eos_token_id)
            text = self.codec.decode(trimmed) if self.codec else ""
            out.append(Generation(text, trimmed, raw, ids.tolist(), result.stats))
            if bar:
                bar.update(result.stats)
        if bar:
            bar.close()
        return out


def _is_token_id(value: Any) -> bool:
    """An int-like token id (int, numpy integer, 0-d integer tensor), never a bool or float."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.dtype.is_floating_point and value.dtype != torch.bool
    return hasattr(value, "__index__") and type(value).__module__ == "numpy" and "bool" not in type(value).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _trim_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


class _Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int):
        self.total, self.done, self.start, self.nfe = total, 0, time.perf_counter(), 0

    def update(self, stats: dict) -> None:
        self.done += 1
        self.nfe += stats["nfe"]
        elapsed = time.perf_counter() - self.start
        width = 30
        filled = int(width * self.done / self.total)
        eta = elapsed / self.done * (self.total - self.done)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                         f"mean NFE {self.nfe / self.done:.1f}  {elapsed:.1f}s elapsed, ETA {eta:.1f}s")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
