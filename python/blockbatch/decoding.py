"""Running decodes through the native ops: ``torch.ops.blockbatch.decode`` for one request,
``decode_batch`` for many, their outputs as a stats dict, a decode's errors as Python raises them
(``timeout_s`` as TimeoutError, by the stop reason the op wrote), and Ctrl-C on the main thread
(the op runs on a long-lived decode thread while the main thread waits, so SIGINT stops the decode
within one forward and the model stays usable)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import signal
import threading
from typing import Any, Callable, NoReturn, cast

import torch

from . import contract
from .errors import checked_int, typed_error
from .options import DecodeOptions
from .options_fields import DecodeStats


@dataclasses.dataclass
class DecodeOutput:
    tokens: torch.Tensor  # [L] int64: prompt + generation
    stats: DecodeStats  # one key per row of blockbatch.contract.STATS
    # The ``logprobs`` option: float64 [gen_length, 1 + 2 k] (the token's log-prob, k ids, their
    # log-probs; NaN where no step committed the position); None when off.
    logprobs: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability (the ``logprobs`` option; docs/ALGORITHMS.md "Logprobs").

    ``logprob``: float32 ``log_softmax`` of the raw logits row the decoder read when it committed (or
    last edited) this token, at this token; ``top``: the ``k`` largest entries of the same row as
    (id, log-prob), most probable first. A diffusion decoder commits out of order, so this is the
    model's distribution at commit time (given the canvas of that step), not a left-to-right
    likelihood. ``logprob`` is NaN (and ``top`` empty) for a token no step committed (a filled EOS)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


def token_logprobs(ids: list[int], table: torch.Tensor) -> list[TokenLogprob]:
    """``TokenLogprob`` of the first ``len(ids)`` generated positions from a decode's logprobs table."""
    k = (table.shape[1] - 1) // 2
    rows = table[: len(ids)].tolist()
    return [
        TokenLogprob(int(t), r[0], [(int(i), v) for i, v in zip(r[1 : 1 + k], r[1 + k :]) if i == i])  # NaN: none
        for t, r in zip(ids, rows)
    ]


_STAT_TYPES = {s.name: s.type for s in contract.NATIVE_STATS}
_CAST: dict[str, Callable[[float], Any]] = {"int": int, "bool": bool, "float": float}


def run_decode(
    model_obj, prompt_ids: torch.Tensor, options: DecodeOptions, step_curve: list[tuple[int, float]] | None = None
) -> DecodeOutput:
    """Call ``torch.ops.blockbatch.decode`` and turn its outputs into a stats dict.

    On the main thread the op runs on a worker thread while this thread waits, so Ctrl-C
    (SIGINT) stops the decode within one forward and raises KeyboardInterrupt here; the model
    stays usable. A decode past ``options.timeout_s`` raises TimeoutError. ``step_curve``:
    (query tokens, seconds) points; a ``branch_budget="auto"`` request then keeps the branches the
    scheduler would give it alone (load 1), else all of them.
    """
    op = torch.ops.blockbatch.decode.typed
    tokens, counters, step_log, branch_stats, logprobs = _interruptible(
        lambda cancel: op(
            model_obj,
            prompt_ids,
            options.native,
            cancel,
            [t for t, _ in step_curve or ()],
            [s for _, s in step_curve or ()],
        ),
        prompt_ids.is_cuda,
    )
    return to_output(tokens, counters, step_log, branch_stats, options, logprobs)


def run_decode_batch(
    model_obj,
    prompts: list[torch.Tensor],
    options: list[DecodeOptions],
    max_batch: int,
    kv_budget_bytes: int = 0,
    step_curve: list[tuple[int, float]] | None = None,
    pad_packs: bool = False,
    prefix_cache: bool = False,
) -> tuple[list[DecodeOutput], dict]:
    """Many requests through ``torch.ops.blockbatch.decode_batch``: up to ``max_batch`` decode
    together, their forwards packed into one per step; each output equals ``run_decode`` of that
    request alone (tokens and counters). Returns the outputs in input order and the batch's
    counters (packed forwards, request forwards, KV pool rows, bytes per row). ``step_curve``:
    (query tokens, seconds) points for ``branch_budget="auto"`` requests (None: measured).
    ``pad_packs``: pad every packed forward to bucketed sizes as the CUDA graphs of
    ``BLOCKBATCH_CUDA_BATCHING=graphs`` do, also on the CPU (results unchanged; slower); the
    counters then say how many were padded and, on CUDA, replayed from a graph. ``prefix_cache``:
    block-causal requests reuse the K/V of earlier requests' complete prompt blocks."""
    if len(options) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(options)} options (give one, or one per prompt)")
    max_batch = checked_int("max_batch", max_batch, 1)
    kv_budget_bytes = checked_int("kv_budget_bytes", kv_budget_bytes, 0)
    natives = [o.native for o in options]
    op = torch.ops.blockbatch.decode_batch
    tokens, counters, logs, branches, logprobs, batch = _interruptible(
        lambda cancel: op(
            model_obj,
            prompts,
            natives,
            max_batch=max_batch,
            kv_budget_bytes=kv_budget_bytes,
            cancel=cancel,
            curve_tokens=[t for t, _ in step_curve or ()],
            curve_seconds=[s for _, s in step_curve or ()],
            pad_packs=pad_packs,
            prefix_cache=prefix_cache,
        ),
        any(p.is_cuda for p in prompts),
    )
    outs = [
        to_output(t, c, log, br, o, lp)
        for t, c, log, br, o, lp in zip(tokens, counters, logs, branches, options, logprobs)
    ]
    return outs, dict(
        zip(
            (
                "packed_forwards",
                "request_forwards",
                "kv_pool_rows",
                "kv_row_bytes",
                "padded_forwards",
                "graph_captures",
                "graph_replays",
            ),
            batch,
        )
    )


def to_output(tokens, counters, step_log, branch_stats, o, logprobs=None) -> DecodeOutput:
    """A decode op's outputs as a ``DecodeOutput``: the counters by the names the op gives them
    (``decode_stat_names``), typed by the STATS table, then the per-forward log, the branches and
    the policy."""
    stats: dict[str, Any] = {}
    for name, value in zip(torch.ops.blockbatch.decode_stat_names(), counters.tolist()):
        stats[name] = _CAST[_STAT_TYPES[name]](value)
    stats["committed_per_step"] = step_log[:, 0].tolist()
    stats["query_tokens_per_step"] = step_log[:, 1].tolist()
    stats["key_tokens_per_step"] = step_log[:, 2].tolist()
    # The ops log 0 blocks in flight on the forwards of policies without a block window (all but wavefront).
    blocks = step_log[:, 3]
    stats["blocks_per_step"] = blocks.tolist() if bool((blocks > 0).all()) else []
    stats["branches"] = [dict(zip(contract.BRANCH_FIELDS, row)) for row in branch_stats.tolist()]
    stats["policy"] = o.policy
    table = logprobs if logprobs is not None and o.logprobs is not None else None
    return DecodeOutput(tokens, cast(DecodeStats, stats), table)


STOP_DEADLINE = 2  # csrc/decode/stop.h StopReason: the request's timeout_s passed


def translated_error(error: RuntimeError, reason: int) -> BaseException:
    """A decode's error as Python raises it, by the stop reason the op wrote (never by its
    message): its deadline (``timeout_s``) as TimeoutError."""
    return TimeoutError(str(error)) if reason == STOP_DEADLINE else error


def _raise_translated(error: RuntimeError, reason: int) -> NoReturn:
    translated = translated_error(error, reason)
    if translated is error:
        raise error
    raise translated from None


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
        _executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="blockbatch-decode", initializer=_block_sigint
        )
    return _executor


def _typed(call, cancel: torch.Tensor) -> tuple:
    """``call(cancel)`` with a refusal raised as ``RequestError`` (asked on the thread the op ran on)."""
    try:
        return call(cancel)
    except ValueError as e:
        raise typed_error(e) from None


def _interruptible(call, on_cuda: bool) -> tuple:
    """``call(cancel)`` (an op taking a cancel flag); on the main thread it runs on the decode
    thread and Ctrl-C sets the flag (the loops check it before every forward). The flag's second
    element is where the op writes why it stopped early (the error's kind)."""
    cancel = torch.zeros(2, dtype=torch.long)
    if threading.current_thread() is not threading.main_thread():
        try:  # signals only reach the main thread: nothing to wait for here
            return _typed(call, cancel)
        except RuntimeError as e:
            _raise_translated(e, int(cancel[1]))
    stream = torch.cuda.current_stream() if on_cuda else None

    def work() -> tuple:
        if stream is not None:
            with torch.cuda.stream(stream):  # the caller's stream, as without the thread
                return _typed(call, cancel)
        return _typed(call, cancel)

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
        _raise_translated(e, int(cancel[1]))
