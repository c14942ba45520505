"""``BlockBatchRouter``, the HTTP ingress of ``blockbatch serve --replicas N`` (``replicas``): it
forwards every request to an engine replica through a deployment handle, sends it again to
another replica when its replica died before answering (nothing had reached the client), ends a
stream whose replica died after its first chunk with an OpenAI-shaped error event and
``data: [DONE]``, and answers whatever it cannot hide with an OpenAI-shaped JSON error (503,
``replica_unavailable``), never the proxy's plain-text 500 or a cut connection. It reads each body
itself, at most ``max_body_bytes``, and counts the requests in flight for the drain."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

from starlette.requests import ClientDisconnect
from starlette.responses import Response, StreamingResponse

from .guard import APIError, default_max_body_bytes

log = logging.getLogger("blockbatch.serve")


ATTEMPTS = 3  # engine replicas tried for one request whose replica died before answering
RETRY_PAUSE_S = 0.25  # between those tries: the handle learns of the death meanwhile


# Response headers not passed on by the router: the router's own server sets them.
_HOP_HEADERS = {b"content-length", b"transfer-encoding", b"connection", b"date", b"server"}


def serve_grpc_on_loopback() -> bool:
    """On a local instance: make this replica's Ray Serve inter-deployment gRPC server listen on
    loopback instead of all interfaces (Ray Serve binds it to ``[::]`` with no setting for it; every
    other port of the instance follows the node address, 127.0.0.1 there). Called in the replica's
    constructor, which runs before that server starts. False (and a warning) when this Ray has no
    such hook, leaving Ray's default."""
    try:
        from ray.serve._private import replica as replica_module

        add_port = replica_module.add_port_to_grpc_server
    except (ImportError, AttributeError):
        log.warning(
            "this Ray Serve has no replica.add_port_to_grpc_server: its replica gRPC port stays on all interfaces"
        )
        return False
    if getattr(add_port, "_blockbatch_loopback", False):
        return True

    def loopback(server, address: str):
        host, _, port = address.rpartition(":")
        return add_port(server, f"127.0.0.1:{port}" if host in ("[::]", "0.0.0.0", "") else address)

    # a mark on the function itself, so that a second call finds the hook installed
    loopback._blockbatch_loopback = True  # type: ignore[attr-defined]
    replica_module.add_port_to_grpc_server = loopback
    return True


def error_json(status: int, message: str, code: str) -> bytes:
    """The body of an OpenAI-shaped error, as the app writes it (``server.APIError``)."""
    return json.dumps(APIError(status, message, code=code).body()).encode()


def _died(e: BaseException) -> bool:
    """True for the errors of an engine replica that died or is unreachable (not of our own code)."""
    import ray.exceptions as rex

    kinds = tuple(
        k
        for k in (
            getattr(rex, "RayActorError", None),
            getattr(rex, "ActorDiedError", None),
            getattr(rex, "ActorUnavailableError", None),
            getattr(rex, "ActorUnschedulableError", None),
            getattr(rex, "WorkerCrashedError", None),
            getattr(rex, "NodeDiedError", None),
        )
        if k is not None
    )
    return isinstance(e, kinds)


def _cancelling() -> int:
    """The pending cancellation requests of the task running the caller (``Task.cancelling``)."""
    task = asyncio.current_task()
    assert task is not None  # called from a coroutine that asyncio runs: it runs in a task
    return task.cancelling()


class RouterReplica:
    """The body of the ``BlockBatchRouter`` ingress: forwards each HTTP request to an engine replica
    (``engine``: the handle of ``BlockBatchEngine``), sending it again to another one if its
    replica died before answering, and turns a death it cannot hide into an OpenAI-shaped error.

    It reads a request's body itself, at most ``max_body_bytes`` (413 beyond: at once when the
    Content-Length says so, else as soon as the chunks pass it), and counts the requests it has
    admitted until their responses are sent whole, for the drain: ``drain`` stops admitting,
    ``in_flight`` tells how many are left, ``cancel_all`` cancels them (the drain ran out)."""

    def __init__(self, engine, local_instance: bool, max_body_bytes: int = default_max_body_bytes(4096)):
        if local_instance:
            serve_grpc_on_loopback()
        self.engine = engine.options(stream=True)
        self.max_body_bytes = max_body_bytes
        self.draining = False  # drain() was called: new requests get 503
        self.stopping = False  # cancel_all() was called: what is cancelled answers shutting_down
        self.requests = 0  # admitted and not yet answered whole
        self.calls: set = set()  # the forwarded calls running now (cancel_all cancels them)

    # The driver's calls (serve_replicas). Coroutines, so that they run on the event loop of the
    # requests, not on a thread beside it.
    async def drain(self) -> int:
        self.draining = True
        return self.requests

    async def in_flight(self) -> int:
        return self.requests

    async def cancel_all(self) -> int:
        self.stopping = True
        for call in list(self.calls):
            call.cancel()
        return self.requests

    def _done(self) -> None:
        self.requests -= 1

    async def __call__(self, request):
        if self.draining:
            if request.url.path == "/health":
                return Response(
                    json.dumps({"status": "draining", "requests": self.requests}).encode(),
                    503,
                    media_type="application/json",
                )
            return _error_response(503, "the server is shutting down: it takes no new requests", "shutting_down")
        self.requests += 1
        done = _Once(self._done)
        try:
            response = await self._forward(request)
        except ClientDisconnect:  # the client went away while sending its body: nobody to answer
            log.info("%s %s: the client disconnected before its body was sent", request.method, request.url.path)
            response = Response(b"", 400)
        except Exception:
            response = _internal_error(f"{request.method} {request.url.path}")
        except BaseException:  # cancelled (the client went away): nothing will be sent
            done()
            raise
        response.__class__ = _COUNTED[type(response)]
        response.bb_done = done
        return response

    async def _forward(self, request):
        body = await _read_body(request, self.max_body_bytes)
        if not isinstance(body, bytes):
            return body  # the 413
        forwarded = {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": list(request.headers.raw),
            "body": body,
        }
        error = None
        for attempt in range(ATTEMPTS):
            if attempt:
                await asyncio.sleep(RETRY_PAUSE_S * attempt)
            if self.stopping:
                return _drain_ran_out()
            call = self.engine.http.remote(forwarded)
            self.calls.add(call)
            try:
                first = await call.__anext__()
            except StopAsyncIteration:
                self.calls.discard(call)
                error = "the engine replica ended the response without answering"
                break
            except asyncio.CancelledError:
                self.calls.discard(call)
                call.cancel()
                if self.stopping and not asyncio.current_task().cancelling():
                    return _drain_ran_out()  # cancel_all cancelled the call before it reached a replica
                raise
            except Exception as e:
                self.calls.discard(call)
                call.cancel()
                if self.stopping:
                    return _drain_ran_out()
                if not _died(e):
                    return _internal_error(f"forwarding {request.method} {request.url.path}")
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                log.warning(
                    "%s %s: engine replica died before answering (try %d of %d): %s",
                    request.method,
                    request.url.path,
                    attempt + 1,
                    ATTEMPTS,
                    error,
                )
                continue
            headers = {
                k.decode("latin-1"): v.decode("latin-1") for k, v in first["headers"] if k.lower() not in _HOP_HEADERS
            }
            if not first["more"]:
                self.calls.discard(call)
                return Response(first["body"], first["status"], headers=headers)
            event_stream = headers.get("content-type", "").startswith("text/event-stream")
            return StreamingResponse(self._rest(call, first["body"], event_stream), first["status"], headers=headers)
        return _error_response(
            503,
            f"no engine replica could answer after {ATTEMPTS} tries (the last: {error}); retry later",
            "replica_unavailable",
            headers={"retry-after": "1"},
        )

    async def _rest(self, call, first: bytes, event_stream: bool):
        """The body after the first chunk; a replica that dies mid-stream ends an event stream with
        an OpenAI-shaped error event and ``[DONE]`` (the ``openai`` client raises it as an
        ``APIError``), as does a stream cancelled at the end of the drain."""
        try:
            yield first
            try:
                async for chunk in call:
                    yield chunk
            except (Exception, asyncio.CancelledError) as e:
                cancelled = isinstance(e, asyncio.CancelledError)
                if cancelled and (not self.stopping or _cancelling()):
                    raise  # the client went away: nothing more to send
                if self.stopping:
                    error = error_json(503, _DRAIN_RAN_OUT, "shutting_down")
                elif _died(e):
                    error = error_json(
                        503, f"the engine replica serving this stream died ({type(e).__name__})", "replica_died"
                    )
                else:
                    error_id = new_error_id()
                    log.exception("a forwarded stream failed [error %s]", error_id)
                    error = error_json(
                        503,
                        f"the engine replica serving this stream failed (error {error_id} in the server's log)",
                        "replica_died",
                    )
                if event_stream:
                    yield b"data: " + error + b"\n\n" + b"data: [DONE]\n\n"
        finally:
            self.calls.discard(call)
            call.cancel()  # the client went away (or the stream ended): nothing left to run


class _Once:
    """``fn``, called at most once however often this is called."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self) -> None:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()


def _counted(cls):
    """``cls`` (a starlette response class) calling its ``bb_done`` once it has been sent (or its
    client went away): the router counts a request in flight until then, not only until its
    handler returned, so that the drain waits for the last bytes of a stream."""

    async def __call__(self, scope, receive, send):
        try:
            await cls.__call__(self, scope, receive, send)
        finally:
            self.bb_done()

    return type(f"Counted{cls.__name__}", (cls,), {"__call__": __call__})


_COUNTED = {cls: _counted(cls) for cls in (Response, StreamingResponse)}
_DRAIN_RAN_OUT = "the server is shutting down and its drain timeout (--drain-timeout) ran out: request cancelled"


def _error_response(status: int, message: str, code: str, headers: dict | None = None):
    return Response(error_json(status, message, code), status, media_type="application/json", headers=headers)


def _drain_ran_out():
    return _error_response(503, _DRAIN_RAN_OUT, "shutting_down")


def new_error_id() -> str:
    return uuid.uuid4().hex[:12]


def _internal_error(what: str):
    """A 500 for an unexpected failure, logged with its traceback (call it in an ``except``): the
    body names an error id, also in the log line, and nothing of the exception (no internals reach
    the client)."""
    error_id = new_error_id()
    log.exception("%s failed [error %s]", what, error_id)
    return _error_response(500, f"internal error {error_id} (details in the server's log)", "internal_error")


def max_body_bytes(app_options: dict) -> int:
    """The router's body cap: ``app_options["max_body_bytes"]`` (``--max-body-bytes``), by default
    the server's (``guard.default_max_body_bytes`` of ``max_length``, 4096 when not given: 1 MiB
    plus 256 bytes per position)."""
    limit = app_options.get("max_body_bytes")
    if limit is None:
        limit = default_max_body_bytes(app_options.get("max_length") or 4096)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"--max-body-bytes must be a positive integer, got {limit!r}")
    return limit


async def _read_body(request, limit: int):
    """The request's body as bytes, or a 413 response once it is known to be over ``limit``: at once
    from its Content-Length (nothing read), else while reading its chunks (a chunked body)."""
    declared = request.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > limit:
        return _too_large(limit, f"{int(declared)} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return _too_large(limit, f"more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int, size: str):
    return _error_response(
        413, f"the request body ({size}) is over the limit of {limit} bytes (--max-body-bytes)", "body_too_large"
    )
