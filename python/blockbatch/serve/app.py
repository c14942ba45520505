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
its own ``asyncio.Queue``. This module builds the app (its arguments, state and middleware) and
runs it; the routes live in ``routes`` (one module per job), the request format in ``protocol``,
the bridge to the scheduler in ``jobs``, the metrics in ``metrics``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI

from .. import families, presets
from . import guard, http, routes
from .jobs import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE, ServerState, ServeSettings
from .protocol import check_preset, is_int, is_number

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
    app.state.served = routes.access.Served(state, families.default_options(engine.config))  # LLaDA2: 'block'
    # Inside the app (not the server), so Ray Serve replicas running it in process have it too.
    app.add_middleware(guard.Guard, limits=limits, count=lambda label: metrics.requests.labels(label).inc())
    routes.errors.install(app, metrics, routes.ROUTES_TEXT)
    for router in routes.ROUTERS:
        app.include_router(router)
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
