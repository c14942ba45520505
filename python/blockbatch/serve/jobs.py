"""The bridge between the HTTP routes and the scheduler: what the routes share (``ServerState``:
the scheduler, the admitted requests, the draining flag, the metrics), one admitted decode
(``Job``, a request's choice): its scheduler request, the events handed over from the scheduler's
thread to the event loop, and the text rules (EOS, max_tokens, stop strings) both response kinds
share; and a request's n choices (``Choices``: their events in one queue, the request's metrics)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import torch

from .. import presets
from . import guard
from ..options import DecodeOptions
from ..scheduler import BatchScheduler, Event, Request
from .metrics import Metrics

DEFAULT_MAX_BATCH = 8
DEFAULT_MAX_QUEUE = 64


@dataclasses.dataclass
class ServeSettings:
    served_model_name: str
    max_batch: int = DEFAULT_MAX_BATCH
    max_queue: int = DEFAULT_MAX_QUEUE
    max_length: int = 512
    api_key: str | None = None
    kv_budget_bytes: int = 0
    preset: presets.Preset | None = None  # the default decode options of every request (request fields win)
    limits: guard.Limits | None = None  # body, header and Host limits (guard.py); None: the defaults for max_length
    kv_page_len: int = -1  # the KV pool's layout (BatchScheduler): -1 automatic, 0 dense rows, N pages of N
    prefix_cache: bool = True  # block-causal requests reuse earlier requests' complete prompt blocks


class ServerState:
    """What the routes share: the scheduler, the admitted requests, the draining flag, metrics."""

    def __init__(self, engine, settings: ServeSettings):
        self.engine = engine
        self.settings = settings
        self.scheduler: BatchScheduler | None = None
        self.jobs: set[Job] = set()  # admitted decodes (submitted, not yet final): n per request of n choices
        self.draining = False
        self.created = int(time.time())
        self.metrics = Metrics(lambda: self.scheduler.counters() if self.scheduler is not None else None)

    def start(self) -> None:
        if self.scheduler is None:
            s = self.settings
            self.scheduler = self.engine.scheduler(
                s.max_batch, s.max_length, s.kv_budget_bytes, kv_page_len=s.kv_page_len, prefix_cache=s.prefix_cache
            )

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()  # cancels whatever is left

    def cancel_all(self) -> None:
        for job in list(self.jobs):
            job.cancel()


class Choices:
    """The n jobs of one request (``n`` choices, choice i decoding with seed + i): their events in
    one queue as (choice index, event), and the request's own metrics, counted once however many
    choices it has: its outcome (200 when every choice finished; else the first choice to end
    otherwise: cancelled, 504 or 500), its time to first token (any choice's), its end-to-end time
    (its last choice's end) and its prompt tokens. Each choice's NFE and step time count as its own."""

    def __init__(self, state: ServerState, arrival: float):
        self.state = state
        self.arrival = arrival
        self.jobs: list[Job] = []
        self.events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.first_token: float | None = None
        self.failed: Event | None = None  # the first choice that ended without finishing

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()

    def _tokens(self, now: float) -> None:
        if self.first_token is None:
            self.first_token = now
            self.state.metrics.ttft.observe(now - self.arrival)

    def _final(self, job: Job, event: Event, now: float) -> None:
        if event.kind != "finished" and self.failed is None:
            self.failed = event
        if any(j.final is None for j in self.jobs):
            return
        m = self.state.metrics
        m.e2e.observe(now - self.arrival)
        if self.failed is None:
            if self.first_token is None:
                m.ttft.observe(now - self.arrival)
            m.prompt_tokens.inc(job.prompt_ids.numel())
            m.requests.labels("200").inc()
        elif self.failed.kind == "cancelled":
            m.requests.labels("cancelled").inc()
        else:
            m.requests.labels("504" if isinstance(self.failed.error, TimeoutError) else "500").inc()


class Job:
    """One admitted decode (a request's choice): its scheduler request, the events handed over from
    the scheduler's thread (to its ``Choices``' queue), and the text rules (EOS, max_tokens, stop
    strings) shared by both response kinds."""

    def __init__(
        self,
        state: ServerState,
        prompt_ids: torch.Tensor,
        options: DecodeOptions,
        max_tokens: int | None,
        stop: list[str],
        arrival: float,
        preset: str | None = None,
        choices: Choices | None = None,
    ):
        self.state = state
        self.preset = preset  # the name of the preset the options came from, if any
        self.codec = state.engine.codec
        self.prompt_ids = prompt_ids
        self.options = options
        self.max_tokens = max_tokens
        self.stop = stop
        self.arrival = arrival
        self.stable: list[int] = []
        self.stable_rows: list[list[float]] = []  # with logprobs: the rows of `stable` (serve/logprobs.py)
        self.choices = Choices(state, arrival) if choices is None else choices
        self.index = len(self.choices.jobs)  # the choice's index in the response
        self.choices.jobs.append(self)
        self.request: Request | None = None
        self.final: Event | None = None

    def submit(self) -> None:
        loop = asyncio.get_running_loop()

        def hand_over(event: Event) -> None:  # on the scheduler's thread
            try:
                loop.call_soon_threadsafe(self._on_event, event)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        assert self.state.scheduler is not None  # started with the app (its lifespan) or the replica
        self.request = self.state.scheduler.submit(self.prompt_ids, self.options, stream=True, callback=hand_over)
        self.state.jobs.add(self)

    def cancel(self) -> None:
        if self.request is not None and self.final is None:
            self.request.cancel()

    def _on_event(self, event: Event) -> None:  # on the loop
        m = self.state.metrics
        now = time.perf_counter()
        if event.kind == "tokens":
            self.stable.extend(event.tokens)
            if event.logprobs is not None:
                self.stable_rows.extend(event.logprobs.tolist())
            if event.tokens:
                self.choices._tokens(now)
        else:
            self.final = event
            self.state.jobs.discard(self)
            if event.kind == "finished":
                assert event.output is not None  # a finished event carries its output
                stats = event.output.stats
                m.nfe.inc(stats["nfe"])
                if stats["nfe"]:
                    m.step.observe(stats["wall_ms"] / 1e3 / stats["nfe"])
            self.choices._final(self, event, now)
        self.choices.events.put_nowait((self.index, event))

    def visible(self, ids: list[int], final: bool) -> tuple[str, int, str | None]:
        """The text the client may see of generation ``ids`` (``final``: the whole generation, else
        its stable prefix), the completion tokens it covers and the finish reason (None while it
        is not decided). The text is cut at the first EOS / end-of-turn token, after max_tokens
        tokens and at the first stop string; a stable prefix keeps back the characters a stop
        string could still start in, so every visible text is a prefix of the final one."""
        kept = self.codec.trim(ids)
        reason = None
        if self.max_tokens is not None and len(kept) >= self.max_tokens:
            kept, reason = kept[: self.max_tokens], "length"
        elif len(kept) < len(ids):
            reason = "stop"  # EOS / end of turn
        elif final:
            reason = "length"  # the canvas (gen_length) is full
        text = self.codec.decode(kept)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            return text[:cut], _tokens_for(self.codec, kept, cut), "stop"
        if reason is None:  # more may come: keep back what a stop string or a split character could still change
            hold = max((len(s) - 1 for s in self.stop), default=0)
            text = text[: max(len(text) - hold, 0)]
            text = text.rstrip("\ufffd")
        return text, len(kept), reason


def _tokens_for(codec, ids: list[int], chars: int) -> int:
    """The fewest leading ``ids`` whose text reaches ``chars`` characters."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(codec.decode(ids[:mid])) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo
