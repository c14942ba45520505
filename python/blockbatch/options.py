"""Decoding options (ALGORITHMS.md sections 2-4) and the typed call of ``torch.ops.blockbatch.decode``."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

POLICIES = ("vanilla", "prefix", "dual", "blockbatch")
REFRESH_MODES = ("periodic", "divergence")
DEFAULT_BLOCK_SIZES = (4, 8, 16, 32, 64, 128)


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How to decode one request.

    Commit rule: ``factor`` when ``factor`` is set, else ``threshold`` when ``threshold`` is set,
    else LLaDA's fixed schedule with ``steps`` total steps (``threshold=None, steps=gen_length``
    is vanilla one-token-per-step decoding).

    Single-branch policies (vanilla / prefix / dual) use ``block_length``; ``blockbatch`` runs one
    branch per entry of ``block_sizes`` with the merge / sync / refresh settings below.

    ``stop_on_eos`` None means the policy's own default: off for the single-branch policies (as
    in Fast-dLLM: the whole canvas is decoded, the text is cut at the first EOS afterwards) and
    on for ``blockbatch``, whose EOS early exit is part of the algorithm (ALGORITHMS.md 4).
    """

    policy: str = "dual"
    gen_length: int = 128
    block_length: int = 32
    steps: int | None = None
    threshold: float | None = 0.9
    factor: float | None = None
    temperature: float = 0.0
    seed: int = 0
    stop_on_eos: bool | None = None
    block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES
    merge_gate: float = 0.5
    sync_gap: int = 8
    refresh_tokens: int = 32
    refresh_mode: str = "periodic"
    prob_floor: float = 0.1
    merge: bool = True
    sync: bool = True
    cuda_graphs: bool = True   # CUDA: replay recorded decode steps (tokens equal eager); no effect on CPU

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"{name} must be {allowed}, got {getattr(self, name)!r}")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if self.policy not in POLICIES:
            raise bad("policy", f"one of {', '.join(POLICIES)}")
        if not is_int(self.gen_length) or self.gen_length <= 0:
            raise bad("gen_length", "a positive integer")
        if self.steps is not None and (not is_int(self.steps) or self.steps < 0):
            raise bad("steps", "None or an integer >= 0")
        if self.threshold is not None and not (0 < self.threshold <= 1):
            raise bad("threshold", "in (0, 1] (or None for the fixed schedule)")
        if self.factor is not None and not self.factor > 0:
            raise bad("factor", "> 0 (or None)")
        if not self.temperature >= 0:
            raise bad("temperature", ">= 0")
        if self.policy != "blockbatch":
            if not is_int(self.block_length) or not 0 < self.block_length <= self.gen_length:
                raise bad("block_length", f"an integer in [1, gen_length = {self.gen_length}]")
            if self.gen_length % self.block_length:
                raise ValueError(f"block_length = {self.block_length} must divide gen_length = {self.gen_length}")
            if self.commit == "fixed":
                blocks = self.gen_length // self.block_length
                if not self.steps or self.steps % blocks:
                    raise ValueError(f"steps must be a positive multiple of the number of blocks ({blocks} = "
                                     f"gen_length / block_length) for the fixed schedule, got {self.steps!r}")
            return
        sizes = tuple(self.block_sizes)
        if not sizes:
            raise bad("block_sizes", "a non-empty list of block sizes")
        if len(sizes) > 16:
            raise ValueError(f"block_sizes may hold at most 16 branches, got {len(sizes)}")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"block_sizes must not repeat a size, got {list(sizes)}")
        for b in sizes:
            if not is_int(b) or b <= 0 or self.gen_length % b:
                raise ValueError(f"block size {b!r} in block_sizes must be a positive divisor of gen_length = "
                                 f"{self.gen_length}")
        if self.commit != "threshold":
            raise ValueError("policy 'blockbatch' commits by threshold: set threshold and leave factor None")
        if not 0 < self.merge_gate <= 1:
            raise bad("merge_gate", "in (0, 1]")
        if not is_int(self.sync_gap) or self.sync_gap < 0:
            raise bad("sync_gap", "an integer >= 0")
        if not is_int(self.refresh_tokens) or self.refresh_tokens < 0:
            raise bad("refresh_tokens", "an integer >= 0 (0 disables the refresh)")
        if self.refresh_mode not in REFRESH_MODES:
            raise bad("refresh_mode", f"one of {', '.join(REFRESH_MODES)}")
        if not 0 < self.prob_floor < 1:
            raise bad("prob_floor", "in (0, 1)")

    @property
    def eos_exit(self) -> bool:
        """``stop_on_eos`` resolved against the policy's default."""
        return self.stop_on_eos if self.stop_on_eos is not None else self.policy == "blockbatch"

    @property
    def commit(self) -> str:
        if self.factor is not None:
            return "factor"
        return "threshold" if self.threshold is not None else "fixed"

    def replace(self, **changes) -> "DecodeOptions":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass
class DecodeOutput:
    tokens: torch.Tensor            # [L] int64: prompt + generation
    stats: dict[str, Any]


def run_decode(model_obj, prompt_ids: torch.Tensor, options: DecodeOptions) -> DecodeOutput:
    """Call ``torch.ops.blockbatch.decode`` and turn its outputs into a stats dict."""
    o = options
    tokens, counters, step_log, branch_stats = torch.ops.blockbatch.decode(
        model_obj, prompt_ids, o.policy, o.gen_length, o.block_length, o.steps or 0, o.commit,
        o.threshold if o.threshold is not None else 1.0, o.factor if o.factor is not None else 1.0,
        float(o.temperature), int(o.seed), o.eos_exit, list(o.block_sizes), float(o.merge_gate),
        int(o.sync_gap), int(o.refresh_tokens), o.refresh_mode, float(o.prob_floor), bool(o.merge), bool(o.sync),
        bool(o.cuda_graphs))
    names = torch.ops.blockbatch.decode_stat_names()
    stats: dict[str, Any] = {}
    for name, value in zip(names, counters.tolist()):
        stats[name] = value if name == "wall_ms" else int(value)
    stats["early_exit"] = bool(stats["early_exit"])
    stats["committed_per_step"] = step_log[:, 0].tolist()
    stats["query_tokens_per_step"] = step_log[:, 1].tolist()
    stats["branches"] = [dict(zip(("block_size", "committed", "merged", "copied", "forwards"), row))
                         for row in branch_stats.tolist()]
    stats["policy"] = o.policy
    return DecodeOutput(tokens, stats)
