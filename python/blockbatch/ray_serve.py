"""``blockbatch serve --replicas N``: N engine replicas behind one OpenAI endpoint on Ray Serve.

Each replica is a Ray Serve deployment replica (a Ray actor) that loads its own ``Engine`` and
builds its own ``create_app`` FastAPI app (own scheduler, own metrics) as the deployment's ASGI
ingress, so the routes, SSE streaming and OpenAI-shaped errors are those of ``blockbatch serve``.
Ray Serve's HTTP proxy listens on ``--host:--port`` and spreads requests over the replicas. Every
response carries ``x-blockbatch-replica`` (the replica's id) and ``x-blockbatch-pid`` (its
process id).

One GPU per replica when this machine's torch sees CUDA (``num_gpus=1``; the decode itself still
runs on the CPU scheduler today, the GPU reservation places one replica per GPU); otherwise each
replica asks for ``min(1, cluster CPUs / N)`` CPUs so that N replicas fit.

``ray_address=None`` starts a local Ray instance (no dashboard, a small object store, its
files in a fresh temporary folder, removed on exit) that lives as long as this process; ``"auto"``
or ``HOST:PORT`` joins a running cluster (``ray start --head`` / ``ray start --address``).

Ray is imported here only: plain ``blockbatch serve`` and ``import blockbatch`` never load it.
"""

from __future__ import annotations

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


def build_replica_app(model: str | None, dtype_name: str, threads: int | None, app_options: dict):
    """In a replica: load the engine and build its app (``create_app``), with the replica headers."""
    import torch

    from .cli import DTYPES
    from .engine import Engine
    from .server import create_app

    if threads:
        torch.set_num_threads(threads)
    engine = Engine.from_pretrained(model, dtype=DTYPES[dtype_name])
    app = create_app(engine, **app_options)
    try:
        from ray import serve

        ctx = serve.get_replica_context()
        rid = getattr(ctx, "replica_tag", None) or str(getattr(ctx, "replica_id", "")) or f"pid-{os.getpid()}"
    except Exception:  # not in a replica (a direct call)
        rid = f"pid-{os.getpid()}"
    app.add_middleware(_ReplicaHeaders, replica_id=rid)
    return app


def serve_replicas(replicas: int, *, model: str | None, dtype_name: str, threads: int | None, host: str, port: int,
                   ray_address: str | None, drain_timeout_s: float, log_level: str, app_options: dict) -> None:
    """Run ``replicas`` replicas on Ray Serve until SIGTERM / Ctrl-C, then shut the deployment down
    (each replica gets ``drain_timeout_s`` to finish its requests) and, if this process started
    the local Ray instance, stop it."""
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

    import torch

    if torch.cuda.is_available():
        actor_options = {"num_gpus": 1}
    else:
        cpus = ray.cluster_resources().get("CPU", 1.0)
        actor_options = {"num_cpus": min(1.0, cpus / replicas)}

    from fastapi import FastAPI

    # The ingress is built in each replica (``build_replica_app``): a builder function, so the
    # engine is never pickled and every replica owns its scheduler.
    def builder() -> FastAPI:
        return build_replica_app(model, dtype_name, threads, app_options)

    @serve.deployment(num_replicas=replicas, ray_actor_options=actor_options,
                      graceful_shutdown_timeout_s=drain_timeout_s, max_ongoing_requests=
                      app_options.get("max_batch", 8) + app_options.get("max_queue", 64),
                      health_check_period_s=2, health_check_timeout_s=30)
    @serve.ingress(builder)
    class BlockBatchReplica:
        pass

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
        serve.run(BlockBatchReplica.bind(), name=APP_NAME, route_prefix="/", blocking=False)
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
