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
the server's ``preset`` (``blockbatch serve --preset NAME|FILE``). Streaming sends the
generation's *stable prefix* as it grows: a diffusion decode commits positions out of order, and
only the prefix no later step can change is shown, so the streamed text always ends up equal to
the non-streamed one.

The event loop never waits on the model: ``submit`` only validates and queues, the scheduler's
thread hands every event to the loop with ``call_soon_threadsafe``, and each request waits on
its own ``asyncio.Queue``. The request format lives in ``protocol``, the bridge to the scheduler
in ``jobs``, the metrics in ``metrics``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import os
import signal
import time
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import families, presets
from . import guard, http
from .guard import APIError
from ..scheduler import Event
from .jobs import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE, Job, ServerState, ServeSettings
from . import responses
from .responses import DecodeReport, ModelCard, ModelList, Outcome, Usage
from .protocol import (
    Params,
    bad,
    chat_ids,
    check_preset,
    is_int,
    is_number,
    option_param,
    parse_json_body,
    parse_params,
    precheck_length,
    prompt_ids,
)

log = logging.getLogger("blockbatch.serve")

DEFAULT_DRAIN_TIMEOUT_S = 60.0
TOY_MODEL_NAME = "blockbatch-toy"


# ------------------------------------------------------------------------------------ the app


def default_model_name(engine) -> str:
    """The model id a server of ``engine`` answers to by default: its checkpoint folder's name, or
    ``blockbatch-toy`` for the toy model shipped in the package."""
    from ..toy import checkpoint_path

    folder = os.path.realpath(engine.checkpoint.path)
    if folder == os.path.realpath(checkpoint_path()):
        return TOY_MODEL_NAME
    return os.path.basename(folder.rstrip(os.sep)) or TOY_MODEL_NAME


def _error_response(e: APIError):
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def create_app(
    engine,
    served_model_name: str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_length: int | None = None,
    api_key: str | None = None,
    kv_budget_bytes: int = 0,
    kv_page_len: int = -1,
    prefix_cache: bool = True,
    preset: str | presets.Preset | None = None,
    max_body_bytes: int | None = None,
    allowed_hosts: tuple[str, ...] | None = None,
    body_timeout_s: float = guard.DEFAULT_BODY_TIMEOUT_S,
):
    """The FastAPI app serving ``engine`` (a CPU ``Engine`` with a tokenizer).

    ``max_batch``: requests decoding at once (packed into one forward per step); ``max_queue``:
    requests waiting beyond those (more get 429); ``max_length``: the longest prompt +
    gen_length accepted (longer get 413; default the model's ``max_sequence_length``, at most
    4096); ``api_key``: when set, every ``/v1`` route needs ``Authorization: Bearer <api_key>``;
    ``kv_page_len``: the KV pool's layout (``BatchScheduler``: -1 automatic, 0 dense rows, N pages of N);
    ``prefix_cache``: block-causal requests reuse earlier requests' complete prompt blocks (on by default);
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
        if not is_int(value) or value < low:
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
    if not is_int(max_body_bytes) or max_body_bytes < 1024:
        raise ValueError(f"max_body_bytes must be an integer >= 1024, got {max_body_bytes!r}")
    if not (is_number(body_timeout_s) and body_timeout_s > 0):
        raise ValueError(f"body_timeout_s must be a number of seconds > 0, got {body_timeout_s!r}")
    limits = guard.Limits(
        max_body_bytes,
        tuple(allowed_hosts) if allowed_hosts is not None else None,
        body_timeout_s=float(body_timeout_s),
    )
    state = ServerState(
        engine,
        ServeSettings(
            served_model_name,
            max_batch,
            max_queue,
            max_length,
            api_key,
            kv_budget_bytes,
            preset,
            limits,
            kv_page_len,
            bool(prefix_cache),
        ),
    )
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
        text = {
            404: f"no route {request.method} {request.url.path} (routes: POST /v1/completions, POST "
            f"/v1/chat/completions, GET /v1/models, GET /health, GET /metrics)",
            405: f"method {request.method} not allowed on {request.url.path}",
        }.get(e.status_code, str(e.detail))
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
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode("latin-1", "replace"), key.encode("latin-1")
        ):
            raise APIError(
                401,
                ("wrong API key" if header else "missing API key") + ": send Authorization: Bearer "
                "<key> with the server's key (blockbatch serve --api-key)",
                code="invalid_api_key",
            )

    async def read_body(request: Request) -> dict:
        body = parse_json_body(await request.body())  # guard.Guard has read it, within its limits
        model = body.get("model")
        if not isinstance(model, str):
            raise bad("model", f"required: a string (this server serves {state.settings.served_model_name!r})")
        if model != state.settings.served_model_name:
            raise APIError(
                404,
                f"the model {str(model)[:100]!r} does not exist; this server serves "
                f"{state.settings.served_model_name!r}",
                param="model",
                code="model_not_found",
            )
        return body

    def admit(ids: torch.Tensor, params: Params, prompt_param: str, arrival: float) -> Job:
        """Checks that need the scheduler, then submit (no await in here: the drain check and
        the submission are one step of the loop)."""
        s = state.settings
        gen = params.options.gen_length
        if ids.numel() + gen > s.max_length:
            source = params.sources.get("gen_length", "gen_length")
            what = (
                f"gen_length {gen} ({source} {params.max_tokens} rounded up to a length the policy decodes)"
                if source == params.limit_name
                else f"gen_length {gen}"
            )
            raise APIError(
                413,
                f"the prompt ({ids.numel()} tokens) plus {what} needs {ids.numel() + gen} "
                f"positions, more than this server's max length {s.max_length}: shorten the prompt "
                f"or {source}",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if state.draining:
            raise APIError(503, "the server is shutting down: it takes no new requests", code="shutting_down")
        if len(state.jobs) >= s.max_batch + s.max_queue:
            raise APIError(
                429,
                f"the server is full: {len(state.jobs)} requests are decoding or queued (max_batch "
                f"{s.max_batch} + max_queue {s.max_queue}); retry later",
                code="queue_full",
            )
        job = Job(state, ids, params.options, params.max_tokens, params.stop, arrival, params.preset)
        try:
            job.submit()
        except ValueError as e:
            text = str(e)
            if "KV rows" in text:
                raise APIError(400, text, param="blockbatch.block_sizes") from None
            raise APIError(400, text, param=option_param(text, params.sources) or prompt_param) from None
        except RuntimeError as e:  # the scheduler closed under us
            raise APIError(503, f"the server is shutting down ({e})", code="shutting_down") from None
        return job

    async def watch_disconnect(request: Request, job: Job) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.cancel()
                return

    def outcome(job: Job, completion_tokens: int, stats: dict) -> Outcome:
        prompt = job.prompt_ids.numel()
        report = DecodeReport(
            policy=stats["policy"], gen_length=job.options.gen_length, nfe=stats["nfe"], wall_ms=stats["wall_ms"]
        )
        if job.preset is not None:
            report.preset = job.preset
        return Outcome(
            Usage(prompt_tokens=prompt, completion_tokens=completion_tokens, total_tokens=prompt + completion_tokens),
            report,
        )

    def failure(event: Event) -> APIError:
        if isinstance(event.error, TimeoutError):
            return APIError(
                504, f"the decode ran past its timeout_s: {event.error}", param="blockbatch.timeout_s", code="timeout"
            )
        if event.kind == "cancelled":
            return APIError(503, f"the request was cancelled: {event.error}", code="cancelled")
        return APIError(500, f"the decode failed: {event.error}", code="decode_failed")

    family_defaults = families.default_options(engine.config)  # LLaDA2: policy 'block'

    async def generate(request: Request, chat: bool):
        arrival = time.perf_counter()
        authorize(request)
        if state.draining:
            raise APIError(503, "the server is shutting down: it takes no new requests", code="shutting_down")
        body = await read_body(request)
        params = parse_params(body, chat, state.settings.preset, family_defaults)
        prompt_param = "messages" if chat else "prompt"
        precheck_length(engine, body, chat, state.settings.max_length)
        # Tokenizing (and rendering the chat template) runs off the event loop: a long prompt must
        # not hold up the other streams and /health.
        ids = await asyncio.to_thread(chat_ids if chat else prompt_ids, engine, body)
        job = admit(ids, params, prompt_param, arrival)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        name = state.settings.served_model_name
        if params.stream:
            return StreamingResponse(
                _stream(request, job, chat, rid, created, name),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
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
        output = event.output
        assert output is not None  # a finished event carries its output
        raw = output.tokens[ids.numel() :].tolist()
        text, completion_tokens, reason = job.visible(raw, final=True)
        metrics.generated_tokens.inc(completion_tokens)
        done = outcome(job, completion_tokens, output.stats)
        return JSONResponse(responses.response(chat, rid, created, name, text, reason, done).body())

    async def _stream(request: Request, job: Job, chat: bool, rid: str, created: int, name: str) -> AsyncIterator[str]:
        def chunk(
            text: str | None = None, reason: str | None = None, role: bool = False, outcome: Outcome | None = None
        ) -> str:
            body = responses.chunk(chat, rid, created, name, text, reason, role, outcome).body()
            return f"data: {json.dumps(body)}\n\n"

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
                        yield chunk(text[len(sent) :])
                        sent = text
                    continue
                if event.kind == "finished":
                    output = event.output
                    assert output is not None  # a finished event carries its output
                    raw = output.tokens[job.prompt_ids.numel() :].tolist()
                    text, completion_tokens, reason = job.visible(raw, final=True)
                    if not text.startswith(sent):  # a tokenizer whose text of a prefix is not a prefix of its text
                        log.warning("request %s: streamed text %r is not a prefix of the result %r", rid, sent, text)
                    elif len(text) > len(sent):
                        yield chunk(text[len(sent) :])
                    metrics.generated_tokens.inc(completion_tokens)
                    yield chunk(
                        "" if not chat else None, reason=reason, outcome=outcome(job, completion_tokens, output.stats)
                    )
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
        card = ModelCard(
            id=state.settings.served_model_name,
            object="model",
            created=state.created,
            owned_by="blockbatch",
            max_model_len=state.settings.max_length,
        )
        return ModelList(object="list", data=[card]).model_dump()

    @app.get("/health")
    async def health():
        if state.draining:
            return JSONResponse({"status": "draining", "requests": len(state.jobs)}, status_code=503)
        return {"status": "ok", "requests": len(state.jobs)}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    return app


# ------------------------------------------------------------------------------------ running it


def serve(
    engine,
    host: str = "127.0.0.1",
    port: int = 8000,
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    log_level: str = "info",
    header_timeout_s: float = guard.DEFAULT_HEADER_TIMEOUT_S,
    **app_options,
) -> None:
    """Serve ``create_app(engine, **app_options)`` on uvicorn until SIGTERM / Ctrl-C, then drain:
    new requests get 503 while the admitted ones finish (at most ``drain_timeout_s``, then they
    are cancelled), and return. The HTTP protocol is always h11 with ``http.protocol_class``'s
    limits (``header_timeout_s``: a request head must arrive within this), whatever else is
    installed."""
    import uvicorn

    app = create_app(engine, **app_options)
    limits = dataclasses.replace(app.state.blockbatch.settings.limits, header_timeout_s=float(header_timeout_s))
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=10,
        timeout_keep_alive=5,
        http=http.protocol_class(limits),
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )
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
                log.info(
                    "%s: draining %d request(s); new requests get 503 (again to stop now)",
                    signal.Signals(sig).name,
                    len(self.bb_state.jobs),
                )
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
