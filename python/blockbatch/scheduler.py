"""Many requests at once, step by step: the Python driver of ``torch.classes.blockbatch.Scheduler``.

The C++ scheduler (``csrc/decode/batch/scheduler.h``) holds every request as a step machine (its
decoder) and, each step, packs the forwards their plans ask for into one per KV mode, all on the
thread that steps it. ``BatchScheduler`` runs its
``step()`` on a background thread (the call releases the GIL) and hands each request's events to
it: ``submit()`` returns a ``Request`` whose ``result()`` waits for the output, whose ``events()``
iterates the stable tokens as they grow (``stream=True``), and whose ``cancel()`` takes it out of
the pack before its next forward. ``Engine.stream`` and the HTTP server are built on it.

A request's tokens and counters never depend on what else runs (docs/ALGORITHMS.md section 9).
"""

from __future__ import annotations

import atexit
import dataclasses
import queue
import signal
import threading
import weakref
from typing import Any, Callable, Iterator, NamedTuple

import torch

from .errors import RequestError, checked_int, typed_error
from .decoding import DecodeOutput, to_output
from .options import DecodeOptions

# Every scheduler not yet closed. Its thread steps inside C++ with the GIL released; were it still
# there when the interpreter finalizes, taking the GIL back would end the thread mid-call and abort
# the process ("terminate called without an active exception", exit 134) after the user's work
# succeeded. So the interpreter's exit closes every one first (atexit runs before finalization).
_OPEN: "weakref.WeakSet[BatchScheduler]" = weakref.WeakSet()


@atexit.register
def _close_open_schedulers() -> None:
    for sched in list(_OPEN):
        try:
            sched.close()
        except Exception:  # noqa: BLE001 - exiting: one scheduler's failure must not keep the others open
            pass


class EventRecord(NamedTuple):
    """One event as ``torch.classes.blockbatch.Scheduler.events()`` hands it over (scheduler_op.cpp)."""

    id: int
    kind: str  # tokens | finished | failed | cancelled
    offset: int
    tokens: torch.Tensor
    error: str
    error_kind: str  # a name of contract.ERROR_KINDS ("" unless failed / cancelled)
    error_param: str
    result: list[torch.Tensor]  # finished: counters, step log, branch stats, logprobs (the decode op's)


class RequestCancelled(RuntimeError):
    """The request was cancelled (``Request.cancel``, or the scheduler closed) before it finished."""


@dataclasses.dataclass
class Event:
    """Something that happened to one request.

    ``kind``: ``"tokens"`` (``tokens`` are newly stable generation ids, following ``offset``
    earlier ones: a diffusion decode commits out of order, so only the prefix that can no longer
    change is reported), ``"finished"`` (``output``), ``"failed"`` or ``"cancelled"`` (``error``,
    and why as ``error_kind``: a name of ``blockbatch.contract.ERROR_KINDS``, e.g. ``timeout``,
    ``cancelled``, ``decode_failed``, or a refusal's kind with the argument in ``error_param``).
    With the ``logprobs`` option a ``"tokens"`` event's ``logprobs`` are its tokens' rows (as
    ``DecodeOutput.logprobs``: final, the tokens being stable).
    """

    request_id: int
    kind: str
    offset: int = 0
    tokens: list[int] = dataclasses.field(default_factory=list)
    output: DecodeOutput | None = None
    error: BaseException | None = None
    error_kind: str = ""
    error_param: str | None = None
    logprobs: torch.Tensor | None = None

    @property
    def final(self) -> bool:
        return self.kind != "tokens"


class Request:
    """One submitted request: wait for it, iterate its events, or cancel it."""

    def __init__(
        self,
        scheduler: "BatchScheduler",
        request_id: int,
        prompt_ids: torch.Tensor,
        options: DecodeOptions,
        callback: Callable[[Event], None] | None,
    ):
        self.id = request_id
        self.prompt_ids = prompt_ids
        self.options = options
        self.stable_ids: list[int] = []  # the generation ids reported stable so far
        self._scheduler = scheduler
        self._callback = callback
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._done = threading.Event()
        self._final: Event | None = None

    def _deliver(self, event: Event) -> None:
        if event.kind == "tokens":
            self.stable_ids.extend(event.tokens)
        else:
            self._final = event
        self._queue.put(event)
        if event.final:
            self._done.set()
        if self._callback is not None:
            self._callback(event)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> bool:
        """Stop the request (queued: at once; running: before its next forward). False when it
        already finished."""
        return not self.done and self._scheduler._cancel(self.id)

    def result(self, timeout: float | None = None) -> DecodeOutput:
        """The output; raises the request's error (``RequestCancelled``, ``TimeoutError`` for its
        own ``timeout_s``, ``RuntimeError`` / ``ValueError`` otherwise). ``timeout``: seconds to
        wait (``TimeoutError`` naming the request when they pass)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        final = self._final
        assert final is not None  # set with the final event, before _done
        if final.kind == "finished":
            assert final.output is not None  # a finished event carries its output
            return final.output
        assert final.error is not None  # a failed or cancelled event carries its error
        raise final.error

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Every event of this request in order, ending with its final one (``timeout``: seconds
        to wait for each)."""
        while True:
            try:
                event = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {self.id}: no event within {timeout} s") from None
            yield event
            if event.final:
                return


class BatchScheduler:
    """Continuous batching on the CPU: requests join and leave between steps.

    ``max_batch``: requests decoding at once; ``max_length``: the longest prompt + gen_length
    accepted (the KV pool's row length; longer requests are refused with ``ValueError``);
    ``kv_budget_bytes``: the KV pool (0: ``max_batch`` requests with the family's default
    BlockBatch branches). A request that can never fit the pool is refused at ``submit``; one that
    does not fit now waits in the queue. ``step_curve``: seconds of a packed forward by query
    tokens, for ``branch_budget="auto"`` requests: ``"measure"`` (default: measured now, in at most
    ``calibrate_s`` seconds), a list of ``(tokens, seconds)`` points (e.g. from a GPU run's
    ``benchmarks/bench_batch.py`` JSON), or None (auto requests run their full branch set).
    ``kv_page_len``: the pool's layout: -1 (automatic: pages of 16 positions on the CPU, dense rows
    on CUDA, docs/bench/gpu/NOTES.md "Paged KV"), 0 (dense rows of ``max_length``), or
    pages of that many positions, so that a request holds pages for its own canvas, not for
    ``max_length`` (docs/ALGORITHMS.md section 12). ``prefix_cache``: a block-causal request (policy
    ``block``, LLaDA2) reads the K/V of its prompt's complete blocks from earlier requests with the
    same blocks, and leaves its own once its first forward has written them; least recently used
    blocks are evicted when the pool needs pages (a paged pool; block lengths a multiple of the
    page length; section 12.6).
    Use as a context manager, or call ``close()``.
    """

    def __init__(
        self,
        model_obj,
        max_batch: int = 8,
        max_length: int = 1024,
        kv_budget_bytes: int = 0,
        poll_s: float = 0.05,
        step_curve: str | list[tuple[int, float]] | None = "measure",
        calibrate_s: float = 1.0,
        kv_page_len: int = -1,
        prefix_cache: bool = False,
    ):
        max_batch, max_length, kv_budget_bytes = _pool_arguments(max_batch, max_length, kv_budget_bytes)
        kv_page_len = checked_int("kv_page_len", kv_page_len, -1, max_length)
        if not isinstance(prefix_cache, bool):
            raise TypeError(f"prefix_cache must be True or False, got {prefix_cache!r}")
        self._requests: dict[int, Request] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._poll_s = poll_s
        self._started = threading.Event()
        self._error: BaseException | None = None
        # the torch.classes.blockbatch.Scheduler: set on the scheduler's thread before _started (else
        # __init__ raises), so every method after __init__ finds it
        self._obj: Any = None
        points: list[tuple[int, float]]
        if step_curve == "measure":
            points, calibrate = [], float(calibrate_s)
        elif step_curve is None:
            points, calibrate = [], 0.0
        elif isinstance(step_curve, (list, tuple)):
            try:
                points = [(int(t), float(s)) for t, s in step_curve]
            except (TypeError, ValueError):
                raise ValueError(
                    f"step_curve must be 'measure', None or a list of (tokens, seconds) pairs, got {step_curve!r}"
                ) from None
            calibrate = 0.0
        else:
            raise ValueError(
                f"step_curve must be 'measure', None or a list of (tokens, seconds) pairs, got {step_curve!r}"
            )

        def start() -> None:
            # The C++ workers inherit this thread's signal mask: SIGINT stays with the main thread.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                self._obj = torch.classes.blockbatch.Scheduler(
                    model_obj,
                    max_batch,
                    max_length,
                    kv_budget_bytes,
                    [t for t, _ in points],
                    [s for _, s in points],
                    calibrate,
                    kv_page_len,
                    prefix_cache,
                )
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                self._error = e
                self._started.set()
                return
            self._started.set()
            self._drive()

        self._thread = threading.Thread(target=start, name="blockbatch-scheduler", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error
        _OPEN.add(self)

    # -- public -------------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: torch.Tensor,
        options: DecodeOptions | None = None,
        stream: bool = False,
        callback: Callable[[Event], None] | None = None,
    ) -> Request:
        """Queue one request (a 1-D int64 tensor of prompt ids). Checked now: bad options or ids,
        a prompt + gen_length over ``max_length``, or a request that can never fit the KV pool
        raise ``ValueError``. ``stream``: report its stable tokens as they grow. ``callback``:
        called with every event on the scheduler's thread (keep it short; e.g. hand it to an
        asyncio loop with ``call_soon_threadsafe``)."""
        options = DecodeOptions() if options is None else options
        if not isinstance(options, DecodeOptions):
            raise TypeError(f"options must be a DecodeOptions, got {type(options).__name__}")
        if self._closed.is_set():
            raise RuntimeError("the scheduler is closed: it takes no new requests")
        with self._lock:  # registered before its first event can arrive
            try:
                request_id = self._obj.add(prompt_ids, options.native, stream)
            except ValueError as e:  # refused: RequestError with its kind and the argument to change
                raise typed_error(e) from None
            request = Request(self, request_id, prompt_ids, options, callback)
            self._requests[request_id] = request
        return request

    def counters(self) -> dict[str, int]:
        """queued, running, packed_forwards, request_forwards, kv_pool_rows, kv_rows_in_use,
        kv_row_bytes, max_length, max_batch, padded_forwards, graph_captures, graph_replays, and the
        pool in pages: kv_pages, kv_pages_in_use, kv_page_len, kv_paged (0: dense rows, counted as
        pages of max_length), and the prefix cache: prefix_cache_blocks, prefix_cache_pages,
        prefix_cache_evictions, prefix_cache_hit_tokens."""
        return dict(self._obj.counters())

    @property
    def step_curve(self) -> list[tuple[int, float]]:
        """The step-time curve ``branch_budget="auto"`` reads: (query tokens, seconds) points."""
        tokens, seconds = self._obj.step_curve()
        return list(zip(tokens, seconds))

    def close(self) -> None:
        """Cancel every request still queued or running (each gets its ``cancelled`` event) and
        stop the scheduler's threads. Idempotent."""
        if self._obj is None or self._closed.is_set():
            return
        self._closed.set()
        _OPEN.discard(self)
        self._thread.join()
        self._obj.close()
        self._dispatch()

    def __enter__(self) -> "BatchScheduler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- driver -------------------------------------------------------------------------------
    def _cancel(self, request_id: int) -> bool:
        return bool(self._obj.cancel(request_id))

    def _drive(self) -> None:
        while not self._closed.is_set():
            self._obj.step(self._poll_s)
            self._dispatch()

    def _dispatch(self) -> None:
        for e in map(EventRecord._make, self._obj.events()):
            request_id, kind = e.id, e.kind
            with self._lock:
                request = self._requests.get(request_id)
                if request is not None and kind != "tokens":
                    del self._requests[request_id]
            if request is None:
                continue
            event = Event(request_id, kind, e.offset)
            if kind == "tokens":
                event.tokens = e.tokens.tolist()
                if e.result and request.options.logprobs is not None:
                    event.logprobs = e.result[0]
            elif kind == "finished":
                stats, step_log, branch_stats, logprobs = e.result
                event.output = to_output(e.tokens, stats, step_log, branch_stats, request.options, logprobs)
            else:
                event.error_kind, event.error_param = e.error_kind, e.error_param or None
                event.error = _event_error(kind, e.error_kind, event.error_param, e.error)
            request._deliver(event)


def _event_error(kind: str, error_kind: str, param: str | None, message: str) -> BaseException:
    """The exception a failed or cancelled event carries, by its error kind (never its text)."""
    if kind == "cancelled":
        return RequestCancelled(message)
    if error_kind == "timeout":
        return TimeoutError(message)
    if error_kind != "decode_failed":  # refused when it started (its options at that load)
        return RequestError(message, error_kind, param)
    return RuntimeError(message)


def kv_report(model_obj, options: DecodeOptions, prompt_length: int, kv_budget_bytes: int) -> dict[str, int]:
    """KV memory of one request with ``options`` and a ``prompt_length``-token prompt: its rows
    (one per branch; vanilla none), the bytes of a row (prompt + gen_length positions), the bytes
    of the request, and the largest batch of such requests ``kv_budget_bytes`` holds."""
    # A row's bytes must fit an int64: positions up to the longest sequence any model may have.
    longest = int(torch.ops.blockbatch.config_limits()["max_sequence_length"])
    prompt_length = checked_int("prompt_length", prompt_length, 1, longest)
    kv_budget_bytes = checked_int("kv_budget_bytes", kv_budget_bytes, 0)
    if not isinstance(options, DecodeOptions):
        raise TypeError(f"options must be a DecodeOptions, got {type(options).__name__}")
    # The request's canvas as decode and the scheduler admit it (policy block: whole blocks).
    try:
        length, _ = torch.ops.blockbatch.admit(model_obj, prompt_length, options.native)
    except ValueError as e:
        raise typed_error(e) from None
    if length > longest:
        raise RequestError(
            f"prompt_length ({prompt_length}) plus gen_length ({options.gen_length}) needs {length} "
            f"positions, more than any model holds ({longest})",
            "context_length",
            "gen_length",
        )
    rows, row_bytes = torch.ops.blockbatch.kv_request_rows(model_obj, options.native, length)
    per_request = rows * row_bytes
    return {
        "positions": length,
        "rows": rows,
        "row_bytes": row_bytes,
        "bytes_per_request": per_request,
        "kv_budget_bytes": kv_budget_bytes,
        "largest_batch": kv_budget_bytes // per_request if per_request else -1,
    }  # -1: no KV, no limit


def check_pool(
    model_obj, max_batch: int, max_length: int, kv_budget_bytes: int = 0, kv_page_len: int = -1
) -> dict[str, int]:
    """The KV pool a ``BatchScheduler(model_obj, max_batch, max_length, kv_budget_bytes)`` would
    take, checked without allocating it or starting anything: TypeError / ValueError naming the
    argument when one is not an integer in its range (max_length at most the model's
    max_sequence_length), ValueError naming kv_budget_bytes, max_batch, max_length and the sizes
    in GiB when the budget holds no row or the pool is larger than the device's memory (the
    host's physical memory; a GPU's total memory). A server calls it before it starts, so that a
    pool it can never hold is one clear error rather than a failure inside its startup. Returns
    ``kv_pool_rows``, ``kv_row_bytes`` and ``kv_pool_bytes`` (the requests' rows; padded packs
    take one more, the scratch row; paged, rows of ``max_length`` rounded up to whole pages, held
    as pages)."""
    max_batch, max_length, kv_budget_bytes = _pool_arguments(max_batch, max_length, kv_budget_bytes)
    kv_page_len = checked_int("kv_page_len", kv_page_len, -1, max_length)
    rows, row_bytes = torch.ops.blockbatch.check_kv_pool(model_obj, max_batch, max_length, kv_budget_bytes, kv_page_len)
    return {"kv_pool_rows": rows, "kv_row_bytes": row_bytes, "kv_pool_bytes": rows * row_bytes}


def _pool_arguments(max_batch, max_length, kv_budget_bytes) -> tuple[int, int, int]:
    """The scheduler's int arguments, checked before the C++ constructor takes them (int64)."""
    return (
        checked_int("max_batch", max_batch, 1),
        checked_int("max_length", max_length, 2),
        checked_int("kv_budget_bytes", kv_budget_bytes, 0),
    )
