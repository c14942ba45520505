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
connection. A client that disconnects cancels the forwarded call, which cancels its decode. Every
response carries ``x-blockbatch-replica`` (the engine replica's id) and ``x-blockbatch-pid`` (its
process id).

With ``device="cuda"`` each replica reserves one GPU (``num_gpus=1``) and decodes on it (the
scheduler on CUDA needs ``BLOCKBATCH_CUDA_BATCHING=1``; every ``BLOCKBATCH_*`` variable of the
calling shell is passed to the replicas); otherwise each replica asks for
``min(1, cluster CPUs / N)`` CPUs so that N replicas fit.

``ray_address=None`` starts a local Ray instance (no dashboard, a small object store, its
files in a fresh temporary folder, removed on exit) that lives as long as this process and listens
on loopback only; ``"auto"`` or ``HOST:PORT`` joins a running cluster (``ray start --head`` /
``ray start --address``).

Ray is imported here only: plain ``blockbatch serve`` and ``import blockbatch`` never load it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import tempfile
import threading

log = logging.getLogger("blockbatch.serve")

APP_NAME = "blockbatch"
REPLICA_HEADER = b"x-blockbatch-replica"
PID_HEADER = b"x-blockbatch-pid"
LOCAL_OBJECT_STORE_BYTES = 150 * 1024 * 1024  # the local instance's object store: requests are small JSON
ATTEMPTS = 3  # engine replicas tried for one request whose replica died before answering
RETRY_PAUSE_S = 0.25  # between those tries: the handle learns of the death meanwhile
# Response headers not passed on by the router: the router's own server sets them.
_HOP_HEADERS = {b"content-length", b"transfer-encoding", b"connection", b"date", b"server"}


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


def build_replica_app(model: str | None, dtype_name: str, threads: int | None, app_options: dict,
                      device: str = "cpu"):
    """In a replica: load the engine on ``device`` and build its app (``create_app``), with the replica
    headers."""
    import torch

    from .cli import DTYPES
    from .engine import Engine
    from .server import create_app

    if threads:
        torch.set_num_threads(threads)
    engine = Engine.from_pretrained(model, device=device, dtype=DTYPES[dtype_name])
    app = create_app(engine, **app_options)
    app.add_middleware(_ReplicaHeaders, replica_id=_replica_id())
    return app


def _serve_grpc_on_loopback() -> bool:
    """On a local instance: make this replica's Ray Serve inter-deployment gRPC server listen on
    loopback instead of all interfaces (Ray Serve binds it to ``[::]`` with no setting for it; every
    other port of the instance follows the node address, 127.0.0.1 there). Called in the replica's
    constructor, which runs before that server starts. False (and a warning) when this Ray has no
    such hook, leaving Ray's default."""
    try:
        from ray.serve._private import replica as replica_module

        add_port = replica_module.add_port_to_grpc_server
    except (ImportError, AttributeError):
        log.warning("this Ray Serve has no replica.add_port_to_grpc_server: its replica gRPC port stays on all "
                    "interfaces")
        return False
    if getattr(add_port, "_blockbatch_loopback", False):
        return True

    def loopback(server, address: str):
        host, _, port = address.rpartition(":")
        return add_port(server, f"127.0.0.1:{port}" if host in ("[::]", "0.0.0.0", "") else address)

    loopback._blockbatch_loopback = True
    replica_module.add_port_to_grpc_server = loopback
    return True


class EngineReplica:
    """The body of the ``BlockBatchEngine`` deployment: one engine and its app, answering whole
    HTTP requests (``http``) in process. The app's scheduler starts here and stops when Ray Serve
    tears the replica down (after its graceful-shutdown wait for running requests)."""

    def __init__(self, model: str | None, dtype_name: str, threads: int | None, app_options: dict,
                 local_instance: bool, device: str = "cpu"):
        if local_instance:
            _serve_grpc_on_loopback()
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

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": request["method"], "scheme": "http", "path": request["path"],
                 "raw_path": request["path"].encode(), "query_string": request["query"].encode(), "root_path": "",
                 "headers": [(bytes(k), bytes(v)) for k, v in request["headers"]], "client": ("127.0.0.1", 0),
                 "server": ("127.0.0.1", 0), "state": {}}
        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda _: messages.put_nowait(None))
        try:
            start, first = None, None
            while True:
                message = await messages.get()
                if message is None:  # the app returned (or raised) without finishing its response
                    if start is None:
                        yield {"status": 500, "headers": [(b"content-type", b"application/json")], "more": False,
                               "body": _error_json(500, f"the engine replica did not answer: {task.exception()!r}",
                                                   "engine_failed")}
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
                    first = {"status": start["status"], "headers": list(start.get("headers", [])), "body": body,
                             "more": more}
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


def _error_json(status: int, message: str, code: str) -> bytes:
    """The body of an OpenAI-shaped error, as the app writes it (``server.APIError``)."""
    from .server import APIError

    return json.dumps(APIError(status, message, code=code).body()).encode()


def _died(e: BaseException) -> bool:
    """True for the errors of an engine replica that died or is unreachable (not of our own code)."""
    import ray.exceptions as rex

    kinds = tuple(k for k in (getattr(rex, "RayActorError", None), getattr(rex, "ActorDiedError", None),
                              getattr(rex, "ActorUnavailableError", None), getattr(rex, "ActorUnschedulableError", None),
                              getattr(rex, "WorkerCrashedError", None), getattr(rex, "NodeDiedError", None))
                  if k is not None)
    return isinstance(e, kinds)


class RouterReplica:
    """The body of the ``BlockBatchRouter`` ingress: forwards each HTTP request to an engine replica
    (``engine``: the handle of ``BlockBatchEngine``), sending it again to another one if its
    replica died before answering, and turns a death it cannot hide into an OpenAI-shaped error."""

    def __init__(self, engine, local_instance: bool):
        if local_instance:
            _serve_grpc_on_loopback()
        self.engine = engine.options(stream=True)

    async def __call__(self, request):
        from starlette.responses import Response, StreamingResponse

        forwarded = {"method": request.method, "path": request.url.path, "query": request.url.query,
                     "headers": list(request.headers.raw), "body": await request.body()}
        error = None
        for attempt in range(ATTEMPTS):
            if attempt:
                await asyncio.sleep(RETRY_PAUSE_S * attempt)
            stream = self.engine.http.remote(forwarded)
            try:
                first = await stream.__anext__()
            except StopAsyncIteration:
                error = "the engine replica ended the response without answering"
                break
            except Exception as e:
                stream.cancel()
                if not _died(e):
                    log.exception("forwarding %s %s failed", request.method, request.url.path)
                    return Response(_error_json(500, f"internal error: {type(e).__name__}: {e}", "internal_error"), 500,
                                    media_type="application/json")
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                log.warning("%s %s: engine replica died before answering (try %d of %d): %s", request.method,
                            request.url.path, attempt + 1, ATTEMPTS, error)
                continue
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in first["headers"]
                       if k.lower() not in _HOP_HEADERS}
            if not first["more"]:
                return Response(first["body"], first["status"], headers=headers)
            event_stream = headers.get("content-type", "").startswith("text/event-stream")
            return StreamingResponse(_rest(stream, first["body"], event_stream), first["status"], headers=headers)
        return Response(_error_json(503, f"no engine replica could answer after {ATTEMPTS} tries (the last: {error}); "
                                    "retry later", "replica_unavailable"), 503, media_type="application/json",
                        headers={"retry-after": "1"})


async def _rest(stream, first: bytes, event_stream: bool):
    """The body after the first chunk; a replica that dies mid-stream ends an event stream with an
    OpenAI-shaped error event and ``[DONE]`` (the ``openai`` client raises it as an ``APIError``)."""
    try:
        yield first
        try:
            async for chunk in stream:
                yield chunk
        except Exception as e:
            if not _died(e):
                log.exception("a forwarded stream failed")
            if event_stream:
                message = f"the engine replica serving this stream failed: {type(e).__name__}"
                yield b"data: " + _error_json(503, message, "replica_died") + b"\n\n" + b"data: [DONE]\n\n"
    finally:
        stream.cancel()  # the client went away (or the stream ended): nothing left to run


def serve_replicas(replicas: int, *, model: str | None, dtype_name: str, threads: int | None, host: str, port: int,
                   ray_address: str | None, drain_timeout_s: float, log_level: str, app_options: dict,
                   device: str = "cpu") -> None:
    """Run ``replicas`` replicas on Ray Serve until SIGTERM / Ctrl-C, then shut the deployment down
    (each replica gets ``drain_timeout_s`` to finish its requests) and, if this process started
    the local Ray instance, stop it."""
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
    temp_dir = None
    if ray_address is None:
        temp_dir = tempfile.mkdtemp(prefix="bb-ray-", dir="/tmp")  # short: Ray's socket paths live under it
        ray.init(include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES, _temp_dir=temp_dir,
                 _node_ip_address="127.0.0.1", log_to_driver=log_level == "debug",
                 logging_level=logging.WARNING)
    else:
        ray.init(address=ray_address, log_to_driver=log_level == "debug", logging_level=logging.WARNING)
    log.info("ray: %s (%s)", ray.get_runtime_context().gcs_address,
             f"local instance, files under {temp_dir}" if temp_dir else f"joined {ray_address}")

    if device == "cuda":
        actor_options = {"num_gpus": 1}
    else:
        cpus = ray.cluster_resources().get("CPU", 1.0)
        actor_options = {"num_cpus": min(1.0, cpus / replicas)}
    # The BLOCKBATCH_* settings of this shell (kernel choices, BLOCKBATCH_CUDA_BATCHING) reach every
    # replica, also those on other machines of a cluster.
    settings_env = {k: v for k, v in os.environ.items() if k.startswith("BLOCKBATCH_")}
    if settings_env:
        actor_options["runtime_env"] = {"env_vars": settings_env}

    local = ray_address is None
    queue_per_replica = app_options.get("max_batch", 8) + app_options.get("max_queue", 64)
    # Each engine replica loads its own engine in its constructor (nothing large is pickled) and owns
    # its scheduler; the router holds no engine and reserves no CPU.
    engine = serve.deployment(EngineReplica, name="BlockBatchEngine", num_replicas=replicas,
                              ray_actor_options=actor_options, graceful_shutdown_timeout_s=drain_timeout_s,
                              max_ongoing_requests=queue_per_replica, health_check_period_s=2,
                              health_check_timeout_s=30)
    router = serve.deployment(RouterReplica, name="BlockBatchRouter", num_replicas=1,
                              ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=drain_timeout_s,
                              max_ongoing_requests=replicas * queue_per_replica + 16)
    application = router.bind(engine.bind(model, dtype_name, threads, app_options, local, device), local)

    serve.start(http_options={"host": host, "port": port})
    stop = threading.Event()

    def on_signal(sig, frame):
        if stop.is_set():
            os._exit(1)  # a second signal: stop at once
        log.info("%s: shutting the replicas down", signal.Signals(sig).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        serve.run(application, name=APP_NAME, route_prefix="/", blocking=False)
        log.info("serving %d replica(s) on http://%s:%d (%s each)", replicas, host, port, actor_options)
        while not stop.wait(0.5):
            pass
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            if temp_dir is not None:  # the local instance's sessions and logs: gone with it
                shutil.rmtree(temp_dir, ignore_errors=True)
