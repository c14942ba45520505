"""``blockbatch serve --replicas N``: N engine replicas behind one OpenAI endpoint on Ray Serve.

Two deployments. ``BlockBatchEngine`` (N replicas, each a Ray actor) loads its own ``Engine`` and
builds its own ``create_app`` FastAPI app (own scheduler, own metrics); it answers HTTP requests
handed to it whole (method, path, headers, body) by running them through that app in process, so
the routes, validation, SSE streaming and OpenAI-shaped errors are those of ``blockbatch serve``.
``BlockBatchRouter`` (one replica, no CPU reserved) is the HTTP ingress behind Ray Serve's proxy on
``--host:--port``: it forwards every request to an engine replica through a deployment handle,
which spreads them over the replicas. It exists for what the proxy alone does badly when a replica
dies: a request whose replica died before answering is sent again to another replica (nothing had
reached the client), up to ``ATTEMPTS`` times; a stream whose replica dies after its first chunk
ends with an OpenAI-shaped error event and ``data: [DONE]``; and whatever cannot be answered is an
OpenAI-shaped JSON error (503, ``replica_unavailable``), never the proxy's plain-text 500 or a cut
connection. A client that disconnects cancels the forwarded call, which cancels its decode. The
router reads each body itself, at most ``max_body_bytes`` (``app_options["max_body_bytes"]``,
``--max-body-bytes``; by default 1 MiB plus 256 bytes per token of ``max_length``): a larger
Content-Length is refused at once with an OpenAI-shaped 413 (``body_too_large``), a chunked body as
soon as it passes the cap; a client gone in the middle of its body is no error. An unexpected
failure of the router is a 500 naming an error id that its log line also names, never the
exception's text. Every response carries ``x-blockbatch-replica`` (the engine replica's id) and
``x-blockbatch-pid`` (its process id).

With ``device="cuda"`` each replica reserves one GPU (``num_gpus=1``) and decodes on it (the
scheduler on CUDA runs unless ``BLOCKBATCH_CUDA_BATCHING=0``; every ``BLOCKBATCH_*`` variable of the
calling shell is passed to the replicas); otherwise each replica asks for
``min(1, cluster CPUs / N)`` CPUs so that N replicas fit.

``ray_address=None`` starts a local Ray instance (no dashboard, a small object store, its
files in a fresh temporary folder, removed on exit) that lives as long as this process and listens
on loopback only; ``"auto"`` or ``HOST:PORT`` joins a running cluster (``ray start --head`` /
``ray start --address``).

Shutdown. The first SIGTERM / SIGINT drains: the router stops admitting (new requests get an
OpenAI-shaped 503, ``shutting_down``; ``/health`` answers 503 ``draining``) while the requests it
had admitted, streamed or not, finish and are delivered whole, for at most ``drain_timeout_s``
(``--drain-timeout``); then the ones still running are cancelled (a stream ends with an error event,
``shutting_down``, and ``data: [DONE]``; a request not answered yet gets the 503). Ray Serve's HTTP
proxy keeps serving all along: only then are the deployments shut down (``serve.shutdown``) and the
local instance stopped, its folder removed, and the process returns normally (``blockbatch serve``
exits 0). A second signal stops at once: no drain wait, the local instance is stopped without Ray
Serve's graceful shutdown (a joined cluster's deployments still get ``serve.shutdown``, bounded by
``SHUTDOWN_GRACE_S``), its processes and folder are cleaned up the same way, and
``KeyboardInterrupt`` is raised (``blockbatch serve`` prints ``interrupted`` and exits 130).

A local instance comes with a watchdog process (``_ray_watchdog``, in its own session) holding a
pipe from this process: when this process exits, by any route, also SIGKILL, the pipe closes and
the watchdog stops what is left of THAT instance (the processes naming its folder on their command
line or carrying it in ``BB_RAY_INSTANCE``; never another Ray instance) and removes its folder.
Ray's agents would otherwise outlive a killed server for about a minute, and its folder forever.

Ray is imported here only: plain ``blockbatch serve`` and ``import blockbatch`` never load it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any


from . import _ray_watchdog
from .router import RouterReplica, error_json, max_body_bytes, new_error_id, serve_grpc_on_loopback

log = logging.getLogger("blockbatch.serve")

APP_NAME = "blockbatch"
REPLICA_HEADER = b"x-blockbatch-replica"
PID_HEADER = b"x-blockbatch-pid"
LOCAL_OBJECT_STORE_BYTES = 150 * 1024 * 1024  # the local instance's object store: requests are small JSON


SHUTDOWN_GRACE_S = 5.0  # serve.shutdown's wait for a replica's requests: the drain has run before it
DELIVERY_GRACE_S = 0.5  # after the last response left the router, for its bytes to pass the proxy
CONTROL_TIMEOUT_S = 10.0  # the driver's calls to the router (drain, in_flight, cancel_all)
WATCHDOG_WAIT_S = 30.0  # for the watchdog's cleanup at exit


class _ReplicaHeaders:
    """ASGI middleware adding the replica's id and pid to every HTTP response (streamed ones too)."""

    def __init__(self, app, replica_id: str):
        self.app = app
        self.headers = [(REPLICA_HEADER, replica_id.encode()), (PID_HEADER, str(os.getpid()).encode())]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + self.headers
            await send(message)

        return await self.app(scope, receive, send_with_headers)


def _replica_id() -> str:
    try:
        from ray import serve

        ctx = serve.get_replica_context()
        return getattr(ctx, "replica_tag", None) or str(getattr(ctx, "replica_id", "")) or f"pid-{os.getpid()}"
    except Exception:  # not in a replica (a direct call)
        return f"pid-{os.getpid()}"


def build_replica_app(model: str | None, dtype_name: str, threads: int | None, app_options: dict, device: str = "cpu"):
    """In a replica: load the engine on ``device`` and build its app (``create_app``), with the replica
    headers."""
    import torch

    from ..engine import DTYPES, Engine
    from .app import create_app

    if threads:
        torch.set_num_threads(threads)
    engine = Engine.from_pretrained(model, device=device, dtype=DTYPES[dtype_name])
    app = create_app(engine, **app_options)
    app.add_middleware(_ReplicaHeaders, replica_id=_replica_id())
    return app


class EngineReplica:
    """The body of the ``BlockBatchEngine`` deployment: one engine and its app, answering whole
    HTTP requests (``http``) in process. The app's scheduler starts here and stops when Ray Serve
    tears the replica down (after its graceful-shutdown wait for running requests)."""

    def __init__(
        self,
        model: str | None,
        dtype_name: str,
        threads: int | None,
        app_options: dict,
        local_instance: bool,
        device: str = "cpu",
    ):
        if local_instance:
            serve_grpc_on_loopback()
        self.app = build_replica_app(model, dtype_name, threads, app_options, device)
        self.state = self.app.state.blockbatch
        self.state.start()  # what the app's lifespan does under a server; here no server runs it

    def __del__(self):
        state = getattr(self, "state", None)
        if state is not None:
            state.stop()

    async def http(self, request: dict):
        """Run one request through the app; yields ``{"status", "headers", "body", "more"}`` once the
        response has its first body bytes (or has ended), then each further body chunk as bytes.
        Cancelled (the router's client went away): the app sees ``http.disconnect``, which cancels
        the request's decode."""
        messages: asyncio.Queue = asyncio.Queue()
        disconnected = asyncio.Event()
        body_given = False

        async def receive():
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": request["body"], "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            await messages.put(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request["method"],
            "scheme": "http",
            "path": request["path"],
            "raw_path": request["path"].encode(),
            "query_string": request["query"].encode(),
            "root_path": "",
            "headers": [(bytes(k), bytes(v)) for k, v in request["headers"]],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
            "state": {},
        }
        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda _: messages.put_nowait(None))
        try:
            start, first = None, None
            while True:
                message = await messages.get()
                if message is None:  # the app returned (or raised) without finishing its response
                    if start is None:
                        error_id = new_error_id()
                        failure = None if task.cancelled() else task.exception()
                        log.error(
                            "%s %s: the app ended without answering [error %s]",
                            request["method"],
                            request["path"],
                            error_id,
                            exc_info=failure,
                        )
                        yield {
                            "status": 500,
                            "headers": [(b"content-type", b"application/json")],
                            "more": False,
                            "body": error_json(
                                500,
                                f"the engine replica did not answer (error {error_id} in the server's log)",
                                "engine_failed",
                            ),
                        }
                    return
                if message["type"] == "http.response.start":
                    start = message
                    continue
                if message["type"] != "http.response.body":
                    continue
                body, more = message.get("body", b""), message.get("more_body", False)
                if first is None:
                    if not body and more:
                        continue  # an empty first chunk: wait for content before answering
                    assert start is not None  # ASGI: http.response.start comes before any body
                    first = {
                        "status": start["status"],
                        "headers": list(start.get("headers", [])),
                        "body": body,
                        "more": more,
                    }
                    yield first
                elif body:
                    yield body
                if not more:
                    return
        finally:
            disconnected.set()
            if not task.done():
                try:
                    await asyncio.wait_for(asyncio.shield(task), 5)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    task.cancel()
                except Exception:
                    pass


def serve_replicas(
    replicas: int,
    *,
    model: str | None,
    dtype_name: str,
    threads: int | None,
    host: str,
    port: int,
    ray_address: str | None,
    drain_timeout_s: float,
    log_level: str,
    app_options: dict,
    device: str = "cpu",
) -> None:
    """Run ``replicas`` replicas on Ray Serve until SIGTERM / Ctrl-C, then drain (the requests in
    flight get ``drain_timeout_s`` to finish, new ones get 503), shut the deployments down and, if
    this process started the local Ray instance, stop it and remove its folder. Returns after that
    drain; raises ``KeyboardInterrupt`` after a second signal, which skips the drain (see the
    module's docstring)."""
    router_body_cap = max_body_bytes(app_options)  # a bad setting fails before Ray starts
    if ray_address is None:
        # A local instance on loopback: without this, Ray turns the node address 127.0.0.1 into the
        # machine's outward address and its GCS, raylet and workers listen on all interfaces. Read
        # when ray is imported; the instance's processes inherit it.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray import serve

    # A loaded 2-core machine can take longer than Ray Serve's 5 s to answer the proxy's readiness
    # check, after which the controller kills the proxy and serve.start fails: allow 30 s (the
    # local instance's processes inherit this environment).
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")
    local = ray_address is None
    temp_dir, watchdog = None, None
    if local:
        temp_dir = tempfile.mkdtemp(prefix="bb-ray-", dir="/tmp")  # short: Ray's socket paths live under it
        # Every process of the instance inherits this, also the workers whose command line Ray
        # replaces with a title: the watchdog finds them by it.
        os.environ[_ray_watchdog.INSTANCE_VARIABLE] = temp_dir
        watchdog = _start_watchdog(temp_dir)  # before ray.init: a server killed from here on leaves nothing

    stop, now = threading.Event(), threading.Event()  # a first signal (drain), a second (stop now)
    in_serve_shutdown = False

    def on_signal(sig, frame):
        name = signal.Signals(sig).name
        if not stop.is_set():
            log.info("%s: draining, then shutting the replicas down (again to stop now)", name)
            stop.set()
            return
        if not now.is_set():
            log.warning("%s again: stopping now%s", name, " (the local Ray instance at once)" if local else "")
            now.set()
            if in_serve_shutdown and local:
                raise KeyboardInterrupt  # out of serve.shutdown's graceful wait: ray.shutdown stops all
        # A third signal: the shutdown under way is as quick as it gets.

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if local:
            ray.init(
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                _temp_dir=temp_dir,
                _node_ip_address="127.0.0.1",
                log_to_driver=log_level == "debug",
                logging_level=logging.WARNING,
            )
        else:
            ray.init(address=ray_address, log_to_driver=log_level == "debug", logging_level=logging.WARNING)
        log.info(
            "ray: %s (%s)",
            ray.get_runtime_context().gcs_address,
            f"local instance, files under {temp_dir}" if temp_dir else f"joined {ray_address}",
        )

        actor_options: dict[str, Any]
        if device == "cuda":
            actor_options = {"num_gpus": 1}
        else:
            cpus = ray.cluster_resources().get("CPU", 1.0)
            actor_options = {"num_cpus": min(1.0, cpus / replicas)}
        # The BLOCKBATCH_* settings of this shell (kernel choices, BLOCKBATCH_CUDA_BATCHING) reach
        # every replica, also those on other machines of a cluster.
        # The API key travels in app_options, never in a runtime environment (Ray shows those).
        settings_env = {
            k: v for k, v in os.environ.items() if k.startswith("BLOCKBATCH_") and k != "BLOCKBATCH_API_KEY"
        }
        if settings_env:
            actor_options["runtime_env"] = {"env_vars": settings_env}

        queue_per_replica = app_options.get("max_batch", 8) + app_options.get("max_queue", 64)
        # Each engine replica loads its own engine in its constructor (nothing large is pickled) and
        # owns its scheduler; the router holds no engine and reserves no CPU. The router drains the
        # requests itself before serve.shutdown, so Ray Serve's own graceful wait is short: it only
        # bounds a shutdown that skipped or outran the drain. The router's slots beyond the engines'
        # queues leave room for /health and the driver's drain calls when every queue is full.
        engine = serve.deployment(
            EngineReplica,
            name="BlockBatchEngine",
            num_replicas=replicas,
            ray_actor_options=actor_options,
            graceful_shutdown_timeout_s=SHUTDOWN_GRACE_S,
            graceful_shutdown_wait_loop_s=0.25,
            max_ongoing_requests=queue_per_replica,
            health_check_period_s=2,
            health_check_timeout_s=30,
        )
        router = serve.deployment(
            RouterReplica,
            name="BlockBatchRouter",
            num_replicas=1,
            ray_actor_options={"num_cpus": 0},
            graceful_shutdown_timeout_s=SHUTDOWN_GRACE_S,
            graceful_shutdown_wait_loop_s=0.25,
            max_ongoing_requests=replicas * queue_per_replica + 64,
        )
        # Ray's stubs type serve.deployment(cls, **options) as its decorator form (no class given),
        # which has no .bind; at run time it is the Deployment
        engine_app = engine.bind(model, dtype_name, threads, app_options, local, device)  # type: ignore[attr-defined]
        application = router.bind(engine_app, local, router_body_cap)  # type: ignore[attr-defined]

        serve.start(http_options={"host": host, "port": port})
        for sig in handlers:
            signal.signal(sig, on_signal)
        serve.run(application, name=APP_NAME, route_prefix="/", blocking=False)
        log.info("serving %d replica(s) on http://%s:%d (%s each)", replicas, host, port, actor_options)
        while not stop.wait(0.5):
            pass
        if not now.is_set():
            _drain(serve, drain_timeout_s, now)
    finally:
        try:
            if ray.is_initialized() and not (now.is_set() and local):
                in_serve_shutdown = True
                try:
                    serve.shutdown()
                except (Exception, KeyboardInterrupt) as e:  # KeyboardInterrupt: a second signal meanwhile
                    if not isinstance(e, KeyboardInterrupt):
                        log.warning("serve.shutdown failed (%s: %s): stopping Ray", type(e).__name__, e)
                finally:
                    in_serve_shutdown = False
        finally:
            try:
                ray.shutdown()
            finally:
                if temp_dir is not None:
                    _stop_instance(temp_dir, watchdog)
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)
    if now.is_set():
        raise KeyboardInterrupt  # the second signal: blockbatch serve says "interrupted" (status 130)


def _drain(serve, timeout_s: float, now: threading.Event) -> None:
    """Stop the router admitting, wait (at most ``timeout_s``, or until ``now`` is set) for the
    requests it had admitted to be answered whole, cancel those left, and give the last bytes
    ``DELIVERY_GRACE_S`` to pass the proxy, which keeps serving meanwhile."""
    try:
        router = serve.get_deployment_handle("BlockBatchRouter", app_name=APP_NAME)

        def call(method: str) -> int:
            return getattr(router, method).remote().result(timeout_s=CONTROL_TIMEOUT_S)

        left = call("drain")
        log.info("draining %d request(s), for at most %g s (--drain-timeout); new requests get 503", left, timeout_s)
        deadline = time.monotonic() + timeout_s
        while left and not now.is_set() and time.monotonic() < deadline:
            now.wait(0.2)
            left = call("in_flight")
        if left and not now.is_set():
            log.warning("drain timeout (--drain-timeout %g s): cancelling %d request(s)", timeout_s, left)
            call("cancel_all")
            deadline = time.monotonic() + SHUTDOWN_GRACE_S  # for their clients to get the shutting_down error
            while left and not now.is_set() and time.monotonic() < deadline:
                now.wait(0.2)
                left = call("in_flight")
        if not now.is_set():
            log.info("drained: shutting the replicas down")
            now.wait(DELIVERY_GRACE_S)
    except Exception as e:  # a router that died or does not answer: nothing to wait for
        log.warning("the drain failed (%s: %s): shutting the replicas down", type(e).__name__, e)


def _start_watchdog(temp_dir: str) -> subprocess.Popen:
    """The local instance's watchdog (``_ray_watchdog``): a small process of its own session reading a
    pipe from this one, which cleans the instance up when this process exits (also SIGKILL). Run by
    file name with ``-I``: it loads neither blockbatch nor torch nor Ray."""
    env = dict(os.environ, **{_ray_watchdog.INSTANCE_VARIABLE: temp_dir})
    return subprocess.Popen(
        [sys.executable, "-I", _ray_watchdog.__file__],
        stdin=subprocess.PIPE,
        env=env,
        start_new_session=True,
        close_fds=True,
    )


def _stop_instance(temp_dir: str, watchdog: subprocess.Popen | None) -> None:
    """After ``ray.shutdown``: what is left of the local instance (Ray's agents outlive it for a
    while) stopped and its folder removed, by the watchdog (its pipe closed) or, should it not
    finish, here."""
    if watchdog is not None:
        try:
            assert watchdog.stdin is not None  # _start_watchdog opens it with stdin=PIPE
            watchdog.stdin.close()
            watchdog.wait(WATCHDOG_WAIT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("the Ray watchdog did not finish (%s): cleaning up here", type(e).__name__)
    if os.path.exists(temp_dir) or _ray_watchdog.instance_processes(temp_dir):
        _ray_watchdog.clean(temp_dir)
