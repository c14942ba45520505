"""Decoding options (ALGORITHMS.md sections 2-4) and the typed call of ``torch.ops.blockbatch.decode``."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import signal
import threading
from typing import Any, Callable

import torch

POLICIES = ("vanilla", "prefix", "dual", "blockbatch")
REFRESH_MODES = ("periodic", "divergence")
DEFAULT_BLOCK_SIZES = (4, 8, 16, 32, 64, 128)
# Bounds shared with the C++ validation (csrc/decode/options.{h,cpp}: kMinProbFloor, kMaxGapTokens).
MIN_PROB_FLOOR = 0.01      # the probability maps hold at most 1 / prob_floor + 1 entries per position
MAX_GAP_TOKENS = 1 << 30   # sync_gap, refresh_tokens
MAX_BRANCHES = 16
MAX_SEED = (1 << 63) - 1


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# field -> (check, what it must be); None is allowed where the annotation says so.
_FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], str, bool]] = {
    "policy": (lambda v: isinstance(v, str), "a string", False),
    "gen_length": (_is_int, "an integer", False),
    "block_length": (_is_int, "an integer", False),
    "steps": (_is_int, "an integer or None", True),
    "threshold": (_is_real, "a number or None", True),
    "factor": (_is_real, "a number or None", True),
    "temperature": (_is_real, "a number", False),
    "seed": (_is_int, "an integer", False),
    "stop_on_eos": (lambda v: isinstance(v, bool), "a bool or None", True),
    "block_sizes": (lambda v: isinstance(v, (list, tuple)) and all(_is_int(b) for b in v),
                    "a list or tuple of integers", False),
    "merge_gate": (_is_real, "a number", False),
    "sync_gap": (_is_int, "an integer", False),
    "refresh_tokens": (_is_int, "an integer", False),
    "refresh_mode": (lambda v: isinstance(v, str), "a string", False),
    "prob_floor": (_is_real, "a number", False),
    "merge": (lambda v: isinstance(v, bool), "a bool", False),
    "sync": (lambda v: isinstance(v, bool), "a bool", False),
    "cuda_graphs": (lambda v: isinstance(v, bool), "a bool", False),
    "timeout_s": (_is_real, "a number", False),
}


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

    ``timeout_s`` > 0 ends a decode that runs longer with ``TimeoutError``. Every field is
    checked here: a wrong type raises TypeError, a value out of range ValueError, each naming
    the field.
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
    timeout_s: float = 0.0     # > 0: a decode running longer fails with TimeoutError (0: no deadline)

    def __post_init__(self) -> None:
        self._check_types()

        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"{name} must be {allowed}, got {getattr(self, name)!r}")

        if self.policy not in POLICIES:
            raise bad("policy", f"one of {', '.join(POLICIES)}")
        if self.gen_length <= 0:
            raise bad("gen_length", "a positive integer")
        if self.steps is not None and not 0 <= self.steps <= self.gen_length:
            raise bad("steps", f"None or an integer in [0, gen_length = {self.gen_length}] (a step commits at "
                               "least one token)" if self.steps >= 0 else "None or an integer >= 0")
        if self.threshold is not None and not (0 < self.threshold <= 1):
            raise bad("threshold", "in (0, 1] (or None for the fixed schedule)")
        if self.factor is not None and not (self.factor > 0 and math.isfinite(self.factor)):
            raise bad("factor", "> 0 and finite (or None)")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise bad("temperature", ">= 0 and finite")
        if not 0 <= self.seed <= MAX_SEED:
            raise bad("seed", f"an integer in [0, 2**63 - 1]")
        if not (self.timeout_s >= 0 and math.isfinite(self.timeout_s)):
            raise bad("timeout_s", ">= 0 and finite (0: no deadline)")
        if self.policy != "blockbatch":
            if not 0 < self.block_length <= self.gen_length:
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
        if len(sizes) > MAX_BRANCHES:
            raise ValueError(f"block_sizes may hold at most {MAX_BRANCHES} branches, got {len(sizes)}")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"block_sizes must not repeat a size, got {list(sizes)}")
        for b in sizes:
            if b <= 0 or self.gen_length % b:
                raise ValueError(f"block size {b!r} in block_sizes must be a positive divisor of gen_length = "
                                 f"{self.gen_length}")
        if self.commit != "threshold":
            raise ValueError("policy 'blockbatch' commits by threshold: set threshold and leave factor None")
        if not 0 < self.merge_gate <= 1:
            raise bad("merge_gate", "in (0, 1]")
        if not 0 <= self.sync_gap <= MAX_GAP_TOKENS:
            raise bad("sync_gap", "an integer >= 0" if self.sync_gap < 0 else f"an integer in [0, {MAX_GAP_TOKENS}]")
        if not 0 <= self.refresh_tokens <= MAX_GAP_TOKENS:
            raise bad("refresh_tokens", "an integer >= 0 (0 disables the refresh)" if self.refresh_tokens < 0
                      else f"an integer in [0, {MAX_GAP_TOKENS}]")
        if self.refresh_mode not in REFRESH_MODES:
            raise bad("refresh_mode", f"one of {', '.join(REFRESH_MODES)}")
        if not MIN_PROB_FLOOR <= self.prob_floor < 1:
            raise bad("prob_floor", f"in [{MIN_PROB_FLOOR}, 1)")

    def _check_types(self) -> None:
        for f in dataclasses.fields(self):
            check, what, optional = _FIELD_TYPES[f.name]
            value = getattr(self, f.name)
            if value is None and optional:
                continue
            if not check(value):
                raise TypeError(f"{f.name} must be {what}, got {type(value).__name__} {value!r}")
        if isinstance(self.block_sizes, list):  # frozen: keep it hashable and immutable
            object.__setattr__(self, "block_sizes", tuple(self.block_sizes))

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
    """Call ``torch.ops.blockbatch.decode`` and turn its outputs into a stats dict.

    On the main thread the op runs on a worker thread while this thread waits, so Ctrl-C
    (SIGINT) stops the decode within one forward and raises KeyboardInterrupt here; the model
    stays usable. A decode past ``options.timeout_s`` raises TimeoutError.
    """
    o = options
    kwargs = dict(
        policy=o.policy, gen_length=o.gen_length, block_length=o.block_length, steps=o.steps or 0, commit=o.commit,
        threshold=float(o.threshold) if o.threshold is not None else 1.0,
        factor=float(o.factor) if o.factor is not None else 1.0, temperature=float(o.temperature), seed=o.seed,
        stop_on_eos=o.eos_exit, block_sizes=list(o.block_sizes), merge_gate=float(o.merge_gate),
        sync_gap=o.sync_gap, refresh_tokens=o.refresh_tokens, refresh_mode=o.refresh_mode,
        prob_floor=float(o.prob_floor), merge=o.merge, sync=o.sync, cuda_graphs=o.cuda_graphs,
        timeout_s=float(o.timeout_s))
    tokens, counters, step_log, branch_stats = _interruptible_decode(model_obj, prompt_ids, kwargs)
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


def _raise_translated(error: RuntimeError) -> None:
    if "decode deadline exceeded" in str(error):
        raise TimeoutError(str(error)) from None
    raise error


_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _forget_executor() -> None:
    global _executor
    _executor = None  # a forked child has no worker thread: it starts its own on first use


os.register_at_fork(after_in_child=_forget_executor)


def _block_sigint() -> None:
    # SIGINT must reach the main thread (whose handler sets the cancel flag): block it in the
    # worker, and so in the threads the op starts from it (they inherit the mask).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _worker() -> concurrent.futures.ThreadPoolExecutor:
    """One long-lived decode thread for the main thread's decodes. A new thread per decode grew
    the resident memory by about 10 kB a decode (allocator arenas of short-lived threads; the
    soak benchmark measured +4% over 1,000 decodes), one thread reused keeps it flat."""
    global _executor
    if _executor is None:
        _executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="blockbatch-decode",
                                                          initializer=_block_sigint)
    return _executor


def _interruptible_decode(model_obj, prompt_ids: torch.Tensor, kwargs: dict) -> tuple:
    """The decode op with a cancel flag; on the main thread, interruptible by Ctrl-C."""
    cancel = torch.zeros(1, dtype=torch.long)
    op = torch.ops.blockbatch.decode
    if threading.current_thread() is not threading.main_thread():
        try:  # signals only reach the main thread: nothing to wait for here
            return op(model_obj, prompt_ids, cancel=cancel, **kwargs)
        except RuntimeError as e:
            _raise_translated(e)
    stream = torch.cuda.current_stream() if prompt_ids.is_cuda else None

    def work() -> tuple:
        if stream is not None:
            with torch.cuda.stream(stream):  # the caller's stream, as without the thread
                return op(model_obj, prompt_ids, cancel=cancel, **kwargs)
        return op(model_obj, prompt_ids, cancel=cancel, **kwargs)

    # While the op runs, Ctrl-C only sets the cancel flag (the loop checks it before every
    # forward); once the worker has stopped, KeyboardInterrupt is raised here as Python would.
    interrupted = []

    def on_sigint(signum, frame) -> None:
        interrupted.append(signum)
        cancel[0] = 1

    previous = signal.getsignal(signal.SIGINT)
    ours = previous is signal.default_int_handler
    if ours:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        future = _worker().submit(work)
        try:
            while not future.done():
                concurrent.futures.wait([future], timeout=0.05)
        except BaseException:  # a custom SIGINT handler raised: stop the decode all the same
            cancel[0] = 1
            concurrent.futures.wait([future])
            raise
    finally:
        if ours:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt
    try:
        return future.result()
    except RuntimeError as e:
        _raise_translated(e)
