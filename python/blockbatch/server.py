"""``blockbatch serve``: an OpenAI-compatible HTTP server on the continuous-batching scheduler.

``create_app(engine, ...)`` builds a FastAPI app whose requests all decode on one
``BatchScheduler`` (``blockbatch.scheduler``): each request joins the packed forwards of the
others between two steps and leaves when it finishes, is cancelled, or its client goes away.
``serve(engine, host, port, ...)`` runs it on uvicorn with a draining shutdown (SIGTERM / Ctrl-C:
running requests finish, new ones get 503, then the process exits with status 0; a second signal
stops at once).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (Prometheus text format). Engine options travel in an extra
body field ``"blockbatch": {"policy": "dual", ...}`` (any decode option; ``DecodeOptions``
validates it), on top of a preset: ``"blockbatch": {"preset": NAME}`` (a built-in one) or else
the server's ``preset`` (``blockbatch serve --preset NAME|FILE``). Streaming sends the generation's *stable prefix* as it grows: a diffusion decode
commits positions out of order, and only the prefix no later step can change is shown, so the
streamed text always ends up equal to the non-streamed one.

The event loop never waits on the model: ``submit`` only validates and queues, the scheduler's
thread hands every event to the loop with ``call_soon_threadsafe``, and each request waits on
its own ``asyncio.Queue``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import math
import os
import re
import signal
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import contract, guard, presets
from .guard import APIError  # noqa: F401 - re-exported: the error shape of the app and of ray_serve
from .options import DecodeOptions
from .scheduler import BatchScheduler, Event

log = logging.getLogger("blockbatch.serve")

DEFAULT_MAX_BATCH = 8
DEFAULT_MAX_QUEUE = 64
DEFAULT_DRAIN_TIMEOUT_S = 60.0
GEN_LENGTH_UNIT = 32  # max_tokens rounds up to a multiple of this for blockbatch without block_sizes
TOY_MODEL_NAME = "blockbatch-toy"

# OpenAI parameters this server does not implement: refused (400 naming the field) unless they
# hold the value that means "off" (null, or the listed value).
_UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
                "best_of": (None, 1), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
                "logit_bias": (None,), "tools": (None,), "tool_choice": (None, "none"), "functions": (None,),
                "function_call": (None, "none"), "response_format": (None,), "prediction": (None,),
                "audio": (None,), "modalities": (None,)}


# ------------------------------------------------------------------------------------ metrics

class Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, scheduler_counters):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("blockbatch_requests", "HTTP generation requests by outcome: the HTTP status of a "
                                "refused or answered request, or cancelled (the client went away)",
                                ["status"], registry=r)
        self.generated_tokens = Counter("blockbatch_generated_tokens", "completion tokens returned", registry=r)
        self.prompt_tokens = Counter("blockbatch_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.nfe = Counter("blockbatch_nfe", "model forwards (NFE) of finished requests", registry=r)
        latency = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
        self.ttft = Histogram("blockbatch_time_to_first_token_seconds", "from a request's arrival to its first stable "
                              "tokens", buckets=latency, registry=r)
        self.e2e = Histogram("blockbatch_e2e_request_seconds", "from a request's arrival to its end (finished, failed "
                             "or cancelled)", buckets=latency, registry=r)
        self.step = Histogram("blockbatch_step_seconds", "a finished request's decode time divided by its NFE: the "
                              "mean time of one of its denoising steps",
                              buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                              registry=r)
        r.register(_SchedulerCollector(scheduler_counters))

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _SchedulerCollector:
    """Gauges and counters read from the scheduler at scrape time."""

    GAUGES = {"running": "requests decoding now", "queued": "requests waiting for a decode slot",
              "kv_rows_in_use": "KV pool rows held by running requests", "kv_pool_rows": "KV pool rows in all"}
    COUNTERS = {"packed_forwards": "packed forwards the scheduler ran (one per step and KV mode)",
                "request_forwards": "forwards of all requests (NFE, cancelled ones included)",
                "padded_forwards": "packed forwards padded to bucketed sizes (CUDA, BLOCKBATCH_CUDA_BATCHING=graphs)",
                "graph_replays": "padded forwards replayed from a CUDA graph (over padded_forwards: the hit rate)"}

    def __init__(self, counters):
        self._counters = counters

    def describe(self):
        return []

    def collect(self):
        c = self._counters()
        if c is None:
            return
        for name, doc in self.GAUGES.items():
            yield GaugeMetricFamily(f"blockbatch_{name}", doc, value=c[name])
        for name, doc in self.COUNTERS.items():
            yield CounterMetricFamily(f"blockbatch_{name}", doc, value=c[name])


# ------------------------------------------------------------------------------------ state

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


class ServerState:
    """What the routes share: the scheduler, the admitted requests, the draining flag, metrics."""

    def __init__(self, engine, settings: ServeSettings):
        self.engine = engine
        self.settings = settings
        self.scheduler: BatchScheduler | None = None
        self.jobs: set[_Job] = set()          # admitted (submitted, not yet final)
        self.draining = False
        self.created = int(time.time())
        self.metrics = Metrics(lambda: self.scheduler.counters() if self.scheduler is not None else None)

    def start(self) -> None:
        if self.scheduler is None:
            s = self.settings
            self.scheduler = self.engine.scheduler(s.max_batch, s.max_length, s.kv_budget_bytes)

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()  # cancels whatever is left

    def cancel_all(self) -> None:
        for job in list(self.jobs):
            job.cancel()


class _Job:
    """One admitted request: its scheduler request, the events handed over from the scheduler's
    thread, and the text rules (EOS, max_tokens, stop strings) shared by both response kinds."""

    def __init__(self, state: ServerState, prompt_ids: torch.Tensor, options: DecodeOptions,
                 max_tokens: int | None, stop: list[str], arrival: float, preset: str | None = None):
        self.state = state
        self.preset = preset  # the name of the preset the options came from, if any
        self.codec = state.engine.codec
        self.prompt_ids = prompt_ids
        self.options = options
        self.max_tokens = max_tokens
        self.stop = stop
        self.arrival = arrival
        self.first_token: float | None = None
        self.stable: list[int] = []
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.request = None
        self.final: Event | None = None

    def submit(self) -> None:
        loop = asyncio.get_running_loop()

        def hand_over(event: Event) -> None:  # on the scheduler's thread
            try:
                loop.call_soon_threadsafe(self._on_event, event)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

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
            if self.first_token is None and event.tokens:
                self.first_token = now
                m.ttft.observe(now - self.arrival)
        else:
            self.final = event
            self.state.jobs.discard(self)
            m.e2e.observe(now - self.arrival)
            if event.kind == "finished":
                stats = event.output.stats
                if self.first_token is None:
                    m.ttft.observe(now - self.arrival)
                m.nfe.inc(stats["nfe"])
                m.prompt_tokens.inc(self.prompt_ids.numel())
                if stats["nfe"]:
                    m.step.observe(stats["wall_ms"] / 1e3 / stats["nfe"])
                m.requests.labels("200").inc()
            elif event.kind == "cancelled":
                m.requests.labels("cancelled").inc()
            else:
                m.requests.labels("504" if isinstance(event.error, TimeoutError) else "500").inc()
        self.events.put_nowait(event)

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


# ------------------------------------------------------------------------------------ parameters

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number")


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param)


@dataclasses.dataclass
class _Params:
    """A generation request's parameters, checked."""

    max_tokens: int | None
    stop: list[str]
    stream: bool
    options: DecodeOptions
    sources: dict[str, str]   # decode option -> the request field it came from (for error messages)
    limit_name: str           # max_tokens or max_completion_tokens
    preset: str | None = None  # the name of the preset under the request's options (its own or the server's)


def _option_param(message: str, sources: dict[str, str]) -> str | None:
    """The request field a DecodeOptions / scheduler message is about: the option named earliest in
    it, as the client sent it (``temperature``, ``max_tokens`` or ``blockbatch.<name>``)."""
    found = [(m.start(), name) for name in contract.NAMES for m in [re.search(rf"\b{name}\b", message)] if m]
    if not found:
        return None
    name = min(found)[1]
    return sources.get(name, f"blockbatch.{name}")


# The request fields each route knows. Any other top-level field is refused (400 naming it, with
# the nearest known name): a typo such as "max_token" must not silently decode the whole canvas.
# The OpenAI fields below that change nothing here are accepted and ignored.
_COMMON_FIELDS = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
                  "user", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "blockbatch",
                  "metadata", "store", "service_tier"}
_FIELDS = {False: _COMMON_FIELDS | {"prompt", "echo", "suffix", "best_of"},
           True: _COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                                   "functions", "function_call", "response_format", "prediction", "audio", "modalities",
                                   "parallel_tool_calls"}}
MAX_TOKENS_LIMIT = 1 << 31  # max_tokens above this is refused before any arithmetic on it
MAX_JSON_DEPTH = 32  # nesting levels of a request body (the deepest valid request has 5)


def _check_fields(body: dict, chat: bool) -> None:
    import difflib

    known = _FIELDS[chat]
    for name in body:
        if name not in known:
            near = difflib.get_close_matches(str(name), sorted(known), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            shown = name if len(name) <= 60 else name[:60] + "..."
            raise _bad(shown, f"unknown field {shown!r} for {'/v1/chat/completions' if chat else '/v1/completions'}"
                              f"{hint} (decode options go in the \"blockbatch\" object)")


def _json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (iterative: a deep value cannot overflow the stack)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_JSON_DEPTH:
                return d
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json_body(raw: bytes) -> dict:
    """A request body as a JSON object, or a 400 whose message says what is wrong without echoing
    internals: not UTF-8, not JSON, too deep, an integer too long, not an object."""
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid JSON: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise APIError(400, f"the request body is not valid JSON for this server: nested deeper than "
                            f"{MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.int_info)
        raise APIError(400, f"the request body is not valid JSON for this server: a number is too long "
                            f"({str(e).split('(')[0].strip()})") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {_type_name(body)}")
    if _json_depth(body) > MAX_JSON_DEPTH:
        raise APIError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    return body


def _check_unsupported(body: dict) -> None:
    if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
        raise _bad("n", f"only n = 1 is supported (one choice per request), got {json.dumps(body['n'])[:60]}")
    for name, off in _UNSUPPORTED.items():
        value = body.get(name)
        if any(value == v and type(value) is type(v) for v in off) or value in ({}, []) or (
                name == "response_format" and value == {"type": "text"}):
            continue
        raise _bad(name, f"not supported by this server (got {json.dumps(value)[:60]})")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad("user", f"must be a string, got {_type_name(user)}")


def _parse_params(body: dict, chat: bool, preset: presets.Preset | None = None) -> _Params:
    """The sampling parameters of either route and the DecodeOptions they make: the preset's options
    (``blockbatch.preset``, a built-in preset's name, else the server's ``preset``), the
    ``blockbatch`` field's other options on top, then ``temperature`` / ``seed`` / ``top_p``, and
    gen_length from max_tokens unless given (``_gen_length``, from the preset's block sizes too).
    Errors are 400s naming the field as the client sent it."""
    _check_fields(body, chat)
    _check_unsupported(body)
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise _bad("stream", f"must be a boolean, got {_type_name(stream)}")
    so = body.get("stream_options")
    if so is not None and not (isinstance(so, dict) and set(so) <= {"include_usage", "continuous_usage_stats"}):
        raise _bad("stream_options", "must be an object with include_usage (usage is always in the last chunk)")

    limit_name, max_tokens = "max_tokens", body.get("max_tokens")
    if chat and body.get("max_completion_tokens") is not None:
        if max_tokens is not None:
            raise _bad("max_completion_tokens", "give max_completion_tokens or max_tokens, not both")
        limit_name, max_tokens = "max_completion_tokens", body["max_completion_tokens"]
    if max_tokens is not None and not (_is_int(max_tokens) and max_tokens >= 1):
        raise _bad(limit_name, f"must be an integer >= 1, got {json.dumps(max_tokens)[:60]}")
    if max_tokens is not None and max_tokens > MAX_TOKENS_LIMIT:  # no canvas is that long; keep the numbers small
        shown = str(max_tokens) if max_tokens < 10**30 else f"{str(max_tokens)[:12]}... ({len(str(max_tokens))} digits)"
        raise APIError(413, f"{limit_name} {shown} is more than the longest generation this server decodes "
                            f"({MAX_TOKENS_LIMIT} tokens at most, and its max length less the prompt)",
                       param=limit_name, code="context_length_exceeded")

    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise _bad("stop", "must be a non-empty string or an array of non-empty strings")
    if len(stop) > 16:
        raise _bad("stop", f"at most 16 stop strings, got {len(stop)}")

    extra = body.get("blockbatch")
    extra = {} if extra is None else extra
    if not isinstance(extra, dict):
        raise _bad("blockbatch", f"must be an object of decode options (e.g. {{\"policy\": \"dual\"}}), got "
                                 f"{_type_name(extra)}")
    extra = dict(extra)
    asked = extra.pop("preset", None)
    if asked is not None:
        preset = _request_preset(asked, preset)
    for name in extra:
        if name not in contract.BY_NAME:
            raise _bad(f"blockbatch.{name}", f"unknown decode option; the options are preset, "
                                             f"{', '.join(contract.NAMES)}")
    values = dict(extra)
    sources = {name: f"blockbatch.{name}" for name in values}
    for name in ("temperature", "seed", "top_p"):
        value = body.get(name)
        if value is None:
            continue
        if name in extra:
            raise _bad(name, f"given both as {name} and as blockbatch.{name}: give one")
        if name == "top_p" and value == 1 and _is_number(value):
            continue  # OpenAI's "off"
        values[name] = value
        sources[name] = name
    if "gen_length" not in values:
        under = {k: tuple(v) if isinstance(v, list) else v for k, v in preset.options.items()} if preset else {}
        values["gen_length"] = _gen_length({**under, **values}, max_tokens)
        if max_tokens is not None:
            sources["gen_length"] = limit_name
    if preset is not None:
        try:
            values = presets.values(preset, values)  # its block sizes fitted to gen_length
        except ValueError as e:  # none of them divides the request's gen_length
            param = "blockbatch.preset" if asked is not None else sources.get("gen_length", "blockbatch.gen_length")
            raise APIError(400, str(e), param=param) from None
    try:
        options = DecodeOptions(**values)
    except (TypeError, ValueError) as e:
        raise APIError(400, str(e), param=_option_param(str(e), sources)) from None
    return _Params(max_tokens, stop, stream, options, sources, limit_name, preset.name if preset else None)


def _request_preset(name: Any, default: presets.Preset | None) -> presets.Preset:
    """The preset a request names in ``blockbatch.preset``: a built-in one, or the server's own
    (``--preset``) by its name; a request never makes the server read a file."""
    if default is not None and name == default.name:
        return default
    if isinstance(name, str) and name in presets.BUILT_IN:
        return presets.BUILT_IN[name]
    known = presets.names() + ([default.name] if default is not None and default.name not in presets.BUILT_IN else [])
    shown = json.dumps(name)[:60] if not isinstance(name, str) else repr(name[:60])
    raise _bad("blockbatch.preset", f"unknown preset {shown}: the presets are {', '.join(known)}")


def check_preset(preset: str | presets.Preset) -> presets.Preset:
    """A server's default preset (a name, a preset file's path or a Preset), checked the way a
    request would use it; ValueError naming the preset."""
    p = preset if isinstance(preset, presets.Preset) else presets.get(preset)
    try:
        DecodeOptions(**presets.values(p, {"gen_length": _gen_length(dict(p.options), 128)}))
    except (TypeError, ValueError) as e:
        raise ValueError(f"preset {p.name!r} ({p.source}): {e}") from None
    return p


def _gen_length(values: dict, max_tokens: int | None) -> int:
    """gen_length for max_tokens: rounded up to the smallest length the policy decodes (a multiple
    of block_length; of every block size, or of 32 when blockbatch picks its default sizes);
    without max_tokens the DecodeOptions default."""
    if max_tokens is None:
        return contract.DEFAULTS["gen_length"]
    if values.get("policy", contract.DEFAULTS["policy"]) == "blockbatch":
        sizes = values.get("block_sizes")
        good = isinstance(sizes, (list, tuple)) and sizes and all(_is_int(b) and b > 0 for b in sizes)
        unit = math.lcm(*sizes) if good else GEN_LENGTH_UNIT
    else:
        block = values.get("block_length", contract.DEFAULTS["block_length"])
        unit = block if _is_int(block) and block > 0 else 1
    return -(-max_tokens // unit) * unit


# ------------------------------------------------------------------------------------ the app

def default_model_name(engine) -> str:
    """The model id a server of ``engine`` answers to by default: its checkpoint folder's name, or
    ``blockbatch-toy`` for the toy model shipped in the package."""
    from .toy import checkpoint_path

    folder = os.path.realpath(engine.checkpoint.path)
    if folder == os.path.realpath(checkpoint_path()):
        return TOY_MODEL_NAME
    return os.path.basename(folder.rstrip(os.sep)) or TOY_MODEL_NAME


def _error_response(e: APIError):
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def create_app(engine, served_model_name: str | None = None, max_batch: int = DEFAULT_MAX_BATCH,
               max_queue: int = DEFAULT_MAX_QUEUE, max_length: int | None = None, api_key: str | None = None,
               kv_budget_bytes: int = 0, preset: str | presets.Preset | None = None,
               max_body_bytes: int | None = None, allowed_hosts: tuple[str, ...] | None = None,
               body_timeout_s: float = guard.DEFAULT_BODY_TIMEOUT_S):
    """The FastAPI app serving ``engine`` (a CPU ``Engine`` with a tokenizer).

    ``max_batch``: requests decoding at once (packed into one forward per step); ``max_queue``:
    requests waiting beyond those (more get 429); ``max_length``: the longest prompt +
    gen_length accepted (longer get 413; default the model's ``max_sequence_length``, at most
    4096); ``api_key``: when set, every ``/v1`` route needs ``Authorization: Bearer <api_key>``;
    ``preset``: a preset's name or file (``blockbatch.presets``) giving every request its default
    decode options (the request's own win; a request may name a built-in preset instead in
    ``"blockbatch": {"preset": NAME}``), checked here (ValueError naming it);
    ``max_body_bytes``: the largest request body (413 beyond; default
    ``guard.default_max_body_bytes(max_length)``); ``allowed_hosts``: ``Host`` names served besides
    addresses, localhost and this machine's names (``("*",)``: any); ``body_timeout_s``:
    a body must arrive within this (408). The scheduler starts with the app (its lifespan) and is
    closed when the app stops.
    """
    if engine.codec is None:
        raise ValueError("the checkpoint has no tokenizer.json: the server needs one to turn text into tokens")
    for name, value, low in (("max_batch", max_batch, 1), ("max_queue", max_queue, 0)):
        if not _is_int(value) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if max_length is None:
        max_length = min(engine.config.max_sequence_length, 4096)
    if served_model_name is None:
        served_model_name = default_model_name(engine)
    if preset is not None:
        preset = check_preset(preset)
    api_key = guard.check_api_key(api_key)
    if max_body_bytes is None:
        max_body_bytes = guard.default_max_body_bytes(max_length)
    if not _is_int(max_body_bytes) or max_body_bytes < 1024:
        raise ValueError(f"max_body_bytes must be an integer >= 1024, got {max_body_bytes!r}")
    if not (_is_number(body_timeout_s) and body_timeout_s > 0):
        raise ValueError(f"body_timeout_s must be a number of seconds > 0, got {body_timeout_s!r}")
    limits = guard.Limits(max_body_bytes, tuple(allowed_hosts) if allowed_hosts is not None else None,
                          body_timeout_s=float(body_timeout_s))
    state = ServerState(engine, ServeSettings(served_model_name, max_batch, max_queue, max_length, api_key,
                                              kv_budget_bytes, preset, limits))
    metrics = state.metrics

    @asynccontextmanager
    async def lifespan(app):
        state.start()
        try:
            yield
        finally:
            state.stop()

    app = FastAPI(title="blockbatch", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.blockbatch = state
    # Inside the app (not the server), so Ray Serve replicas running it in process have it too.
    app.add_middleware(guard.Guard, limits=limits, count=lambda label: metrics.requests.labels(label).inc())

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, e: APIError):
        if request.url.path.startswith("/v1/") and request.method == "POST":
            metrics.requests.labels(str(e.status)).inc()
        return _error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, e: StarletteHTTPException):
        text = {404: f"no route {request.method} {request.url.path} (routes: POST /v1/completions, POST "
                     f"/v1/chat/completions, GET /v1/models, GET /health, GET /metrics)",
                405: f"method {request.method} not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return JSONResponse(APIError(e.status_code, text).body(), status_code=e.status_code)

    # Exceptions the routes let through are answered by guard.Guard (a 500 with an error id, logged
    # once): a handler for Exception here would run in Starlette's outermost middleware, which
    # re-raises it for uvicorn to log a second traceback.

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, e: RequestValidationError):
        return _error_response(APIError(400, str(e)))

    def authorize(request: Request) -> None:
        key = state.settings.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("latin-1", "replace"),
                                                                 key.encode("latin-1")):
            raise APIError(401, ("wrong API key" if header else "missing API key") + ": send Authorization: Bearer "
                                "<key> with the server's key (blockbatch serve --api-key)", code="invalid_api_key")

    async def read_body(request: Request) -> dict:
        body = parse_json_body(await request.body())  # guard.Guard has read it, within its limits
        model = body.get("model")
        if not isinstance(model, str):
            raise _bad("model", f"required: a string (this server serves {state.settings.served_model_name!r})")
        if model != state.settings.served_model_name:
            raise APIError(404, f"the model {str(model)[:100]!r} does not exist; this server serves "
                                f"{state.settings.served_model_name!r}", param="model", code="model_not_found")
        return body

    def admit(ids: torch.Tensor, params: _Params, prompt_param: str, arrival: float) -> _Job:
        """Checks that need the scheduler, then submit (no await in here: the drain check and
        the submission are one step of the loop)."""
        s = state.settings
        gen = params.options.gen_length
        if ids.numel() + gen > s.max_length:
            source = params.sources.get("gen_length", "gen_length")
            what = (f"gen_length {gen} ({source} {params.max_tokens} rounded up to a length the policy decodes)"
                    if source == params.limit_name else f"gen_length {gen}")
            raise APIError(413, f"the prompt ({ids.numel()} tokens) plus {what} needs {ids.numel() + gen} "
                                f"positions, more than this server's max length {s.max_length}: shorten the prompt "
                                f"or {source}", param=prompt_param, code="context_length_exceeded")
        if state.draining:
            raise APIError(503, "the server is shutting down: it takes no new requests", code="shutting_down")
        if len(state.jobs) >= s.max_batch + s.max_queue:
            raise APIError(429, f"the server is full: {len(state.jobs)} requests are decoding or queued (max_batch "
                                f"{s.max_batch} + max_queue {s.max_queue}); retry later", code="queue_full")
        job = _Job(state, ids, params.options, params.max_tokens, params.stop, arrival, params.preset)
        try:
            job.submit()
        except ValueError as e:
            text = str(e)
            if "KV rows" in text:
                raise APIError(400, text, param="blockbatch.block_sizes") from None
            raise APIError(400, text, param=_option_param(text, params.sources) or prompt_param) from None
        except RuntimeError as e:  # the scheduler closed under us
            raise APIError(503, f"the server is shutting down ({e})", code="shutting_down") from None
        return job

    async def watch_disconnect(request: Request, job: _Job) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.cancel()
                return

    def usage(job: _Job, completion_tokens: int) -> dict:
        prompt = job.prompt_ids.numel()
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens}

    def extras(job: _Job, stats: dict) -> dict:
        used = {"policy": stats["policy"], "gen_length": job.options.gen_length, "nfe": stats["nfe"],
                "wall_ms": stats["wall_ms"]}
        if job.preset is not None:
            used["preset"] = job.preset
        return {"nfe": stats["nfe"], "blockbatch": used}

    def failure(event: Event) -> APIError:
        if isinstance(event.error, TimeoutError):
            return APIError(504, f"the decode ran past its timeout_s: {event.error}", param="blockbatch.timeout_s",
                            code="timeout")
        if event.kind == "cancelled":
            return APIError(503, f"the request was cancelled: {event.error}", code="cancelled")
        return APIError(500, f"the decode failed: {event.error}", code="decode_failed")

    async def generate(request: Request, chat: bool):
        arrival = time.perf_counter()
        authorize(request)
        if state.draining:
            raise APIError(503, "the server is shutting down: it takes no new requests", code="shutting_down")
        body = await read_body(request)
        params = _parse_params(body, chat, state.settings.preset)
        prompt_param = "messages" if chat else "prompt"
        _precheck_length(engine, body, chat, state.settings.max_length)
        # Tokenizing (and rendering the chat template) runs off the event loop: a long prompt must
        # not hold up the other streams and /health.
        ids = await asyncio.to_thread(_chat_ids if chat else _prompt_ids, engine, body)
        job = admit(ids, params, prompt_param, arrival)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        name = state.settings.served_model_name
        if params.stream:
            return StreamingResponse(_stream(request, job, chat, rid, created, name), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watcher = asyncio.create_task(watch_disconnect(request, job))
        try:
            while True:
                event = await job.events.get()
                if event.final:
                    break
        finally:
            watcher.cancel()
            job.cancel()  # the handler was cancelled (server stopping): so is the decode
        if event.kind != "finished":
            e = failure(event)
            return _error_response(e)
        raw = event.output.tokens[ids.numel():].tolist()
        text, completion_tokens, reason = job.visible(raw, final=True)
        metrics.generated_tokens.inc(completion_tokens)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        return JSONResponse({"id": rid, "object": obj, "created": created, "model": name, "choices": [choice],
                             "usage": usage(job, completion_tokens), **extras(job, event.output.stats)})

    async def _stream(request: Request, job: _Job, chat: bool, rid: str, created: int,
                      name: str) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None = None, reason: str | None = None, role: bool = False, **more) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            payload = {"id": rid, "object": obj, "created": created, "model": name, "choices": [choice], **more}
            return f"data: {json.dumps(payload)}\n\n"

        watcher = asyncio.create_task(watch_disconnect(request, job))
        sent = ""
        try:
            if chat:
                yield chunk(role=True)
            while True:
                event = await job.events.get()
                if event.kind == "tokens":
                    text, _, _ = job.visible(job.stable, final=False)
                    if len(text) > len(sent) and text.startswith(sent):
                        yield chunk(text[len(sent):])
                        sent = text
                    continue
                if event.kind == "finished":
                    raw = event.output.tokens[job.prompt_ids.numel():].tolist()
                    text, completion_tokens, reason = job.visible(raw, final=True)
                    if not text.startswith(sent):  # a tokenizer whose text of a prefix is not a prefix of its text
                        log.warning("request %s: streamed text %r is not a prefix of the result %r", rid, sent, text)
                    elif len(text) > len(sent):
                        yield chunk(text[len(sent):])
                    metrics.generated_tokens.inc(completion_tokens)
                    yield chunk("" if not chat else None, reason=reason, usage=usage(job, completion_tokens),
                                **extras(job, event.output.stats))
                else:
                    yield f"data: {json.dumps(failure(event).body())}\n\n"
                yield "data: [DONE]\n\n"
                return
        finally:
            watcher.cancel()
            job.cancel()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": state.settings.served_model_name, "object": "model",
                                            "created": state.created, "owned_by": "blockbatch",
                                            "max_model_len": state.settings.max_length}]}

    @app.get("/health")
    async def health():
        if state.draining:
            return JSONResponse({"status": "draining", "requests": len(state.jobs)}, status_code=503)
        return {"status": "ok", "requests": len(state.jobs)}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    return app


def _precheck_length(engine, body: dict, chat: bool, max_length: int) -> None:
    """413 before any tokenizing for a prompt that cannot fit ``max_length`` positions: more ids,
    or more characters than ``max_length`` tokens of the longest vocabulary entry can hold."""
    limit = max_length * engine.codec.max_token_chars
    if chat:
        messages = body.get("messages")
        chars = sum(_text_chars(m.get("content")) for m in messages if isinstance(m, dict)) \
            if isinstance(messages, list) else 0
        what, param = f"the messages hold {chars} characters", "messages"
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list) and len(prompt) > max_length:
            raise APIError(413, f"the prompt has {len(prompt)} token ids, more than this server's max length "
                                f"{max_length}: shorten the prompt", param="prompt", code="context_length_exceeded")
        chars = len(prompt) if isinstance(prompt, str) else 0
        what, param = f"the prompt has {chars} characters", "prompt"
    if chars > limit:
        raise APIError(413, f"{what}: more than {max_length} tokens of this tokenizer (at most "
                            f"{engine.codec.max_token_chars} characters each) can hold, so it cannot fit this "
                            f"server's max length {max_length}: shorten it", param=param,
                       code="context_length_exceeded")


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text", "")) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def _prompt_ids(engine, body: dict) -> torch.Tensor:
    prompt = body.get("prompt")
    if prompt is None:
        raise _bad("prompt", "required: a string or an array of token ids")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise _bad("prompt", f"one prompt per request, got {len(prompt)} (send them as separate requests)")
    if not isinstance(prompt, (str, list)):
        raise _bad("prompt", f"must be a string or an array of token ids, got {_type_name(prompt)}")
    if isinstance(prompt, list):
        vocab = engine.config.vocab_size
        for i, t in enumerate(prompt):
            if not _is_int(t) or not 0 <= t < vocab:
                raise _bad("prompt", f"entry {i} ({json.dumps(t)[:30]}) is not a token id in [0, {vocab})")
    try:
        return engine.encode(prompt, chat=False, name="prompt")
    except (TypeError, ValueError) as e:
        raise APIError(400, str(e), param="prompt") from None


def _chat_ids(engine, body: dict) -> torch.Tensor:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "required: a non-empty array of {\"role\", \"content\"} objects")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}]", f"must be an object with role and content, got {_type_name(m)}")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise _bad(f"messages[{i}].role", "must be a non-empty string (system, user, assistant, ...)")
        if isinstance(content, list):  # content parts: text only
            texts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise _bad(f"messages[{i}].content[{j}]", "only {\"type\": \"text\", \"text\": ...} parts are "
                                                              "supported")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content", f"must be a string or an array of text parts, got "
                                                 f"{_type_name(content)}")
        plain.append({"role": role, "content": content})
    codec = engine.codec
    if codec.chat_template is None:
        raise APIError(400, "this model has no chat template (tokenizer_config.json key chat_template): use "
                            "/v1/completions with a plain prompt", param="messages", code="no_chat_template")
    try:
        ids = codec.encode_chat(plain)
    except (TypeError, ValueError) as e:
        raise APIError(400, str(e), param="messages") from None
    if not ids:
        raise _bad("messages", "the chat template rendered the conversation as no tokens")
    return torch.tensor(ids, dtype=torch.long)


# ------------------------------------------------------------------------------------ running it

def serve(engine, host: str = "127.0.0.1", port: int = 8000, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
          log_level: str = "info", header_timeout_s: float = guard.DEFAULT_HEADER_TIMEOUT_S, **app_options) -> None:
    """Serve ``create_app(engine, **app_options)`` on uvicorn until SIGTERM / Ctrl-C, then drain:
    new requests get 503 while the admitted ones finish (at most ``drain_timeout_s``, then they
    are cancelled), and return. The HTTP protocol is always h11 with ``guard.protocol_class``'s
    limits (``header_timeout_s``: a request head must arrive within this), whatever else is
    installed."""
    import uvicorn

    app = create_app(engine, **app_options)
    limits = dataclasses.replace(app.state.blockbatch.settings.limits, header_timeout_s=float(header_timeout_s))
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=10, timeout_keep_alive=5, http=guard.protocol_class(limits),
                            h11_max_incomplete_event_size=limits.max_header_bytes)
    server = _draining_server_class()(config, app.state.blockbatch, drain_timeout_s)
    server.run()


def _draining_server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server with a drain before its own graceful shutdown: the first SIGTERM /
        SIGINT sets the draining flag (new requests: 503, /health: 503) and the server exits
        once no admitted request is left; a second signal stops without waiting."""

        def __init__(self, config, state: ServerState, drain_timeout_s: float):
            super().__init__(config)
            self.bb_state = state
            self.drain_timeout_s = drain_timeout_s
            self.drain_deadline: float | None = None
            self.signals = 0

        def handle_exit(self, sig: int, frame) -> None:
            # Not recorded in _captured_signals: uvicorn would re-raise it after a clean shutdown
            # and the process would die of it instead of exiting with status 0.
            self.signals += 1
            if self.signals == 1:
                self.bb_state.draining = True
                self.drain_deadline = time.monotonic() + self.drain_timeout_s
                log.info("%s: draining %d request(s); new requests get 503 (again to stop now)",
                         signal.Signals(sig).name, len(self.bb_state.jobs))
            elif self.signals == 2:
                self.bb_state.cancel_all()
                self.should_exit = True
            else:
                self.force_exit = True

        async def on_tick(self, counter: int) -> bool:
            if self.drain_deadline is not None:
                if not self.bb_state.jobs:
                    return True
                if time.monotonic() > self.drain_deadline:
                    log.warning("drain timeout: cancelling %d request(s)", len(self.bb_state.jobs))
                    self.bb_state.cancel_all()
                    self.drain_deadline = time.monotonic() + 5
            return await super().on_tick(counter)

    return DrainingServer
