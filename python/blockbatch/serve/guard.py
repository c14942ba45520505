"""What every HTTP request of ``blockbatch serve`` meets before the app reads it.

Two layers, both on by default:

- ``Guard``, an ASGI middleware inside the app (so Ray Serve replicas, which run the app in
  process, have it too): at most ``max_headers`` headers (431); a ``Host`` the server answers to
  (403: a web page cannot reach a loopback server through DNS rebinding, which needs a host name
  of the attacker's); ``Content-Type: application/json`` on the ``/v1`` POST routes (415: a form or
  ``text/plain`` body is a cross-site "simple request" that no preflight stops); a body of at most
  ``max_body_bytes`` (413 at once from ``Content-Length``, else as soon as the read passes it)
  read in full within ``body_timeout_s`` (408); and any exception the routes let through answered
  as a 500 with an error id and logged once, its text never sent. Refusals carry
  ``Connection: close``: the rest of a refused body is never read.
- ``protocol_class(limits)`` (``serve.http``), uvicorn's h11 protocol (whatever else is installed: httptools has
  no header limits) with a header deadline (a connection that has not sent a whole request head
  ``header_timeout_s`` after it opened or after its last response gets 408 and is closed), a
  header-size limit (431) and half-closed clients: a client that sends its request and then shuts
  its sending side (``shutdown(SHUT_WR)``, ``nc -N``, some proxies) is answered, not taken for
  gone. TCP cannot tell that from a close until the server writes, so after the client's EOF the
  server writes a harmless probe (an interim ``100 Continue`` before the response, an SSE comment
  during a stream) at once, again after 50 ms and then every ``probe_s``: a client that really
  closed answers the first with a reset, the second write fails, and the request is cancelled as
  for any disconnect.

Errors are in OpenAI's shape, ``APIError.body()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import logging
import socket
import uuid
from typing import Callable

log = logging.getLogger("blockbatch.serve")

DEFAULT_MAX_HEADERS = 100
DEFAULT_MAX_HEADER_BYTES = 32 * 1024  # the whole request head (h11's buffer limit)
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_PROBE_S = 1.0
BODY_BYTES_PER_POSITION = 256  # body cap: a fixed allowance plus this per position of max_length
BODY_BYTES_BASE = 1024 * 1024


class APIError(Exception):
    """An error answered in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``."""

    TYPES = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "invalid_request_error",
        408: "timeout_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
        429: "rate_limit_error",
        431: "invalid_request_error",
        500: "server_error",
        503: "service_unavailable",
        504: "timeout_error",
    }

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


REASONS = {
    400: b"Bad Request",
    403: b"Forbidden",
    408: b"Request Timeout",
    413: b"Content Too Large",
    415: b"Unsupported Media Type",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
}


def default_max_body_bytes(max_length: int) -> int:
    """The body cap for a server of ``max_length`` positions: room for a prompt of that many
    tokens as text or as ids (a token id is at most a few bytes of JSON; a token's text rarely a
    few dozen) plus the request's other fields."""
    return BODY_BYTES_BASE + BODY_BYTES_PER_POSITION * max_length


@dataclasses.dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    allowed_hosts: tuple[str, ...] | None = None  # names served besides the default ones (host_allowed); "*": any
    max_headers: int = DEFAULT_MAX_HEADERS
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    probe_s: float = DEFAULT_PROBE_S


# ------------------------------------------------------------------------------------ Host


def _own_names() -> set[str]:
    names = {"localhost"}
    for name in (socket.gethostname, socket.getfqdn):
        try:
            names.add(name().lower())
        except OSError:
            pass
    return names


def host_name(header: str) -> str:
    """The host of a ``Host`` header, lower case, without port or IPv6 brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header[1:]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(header: str | None, allowed: tuple[str, ...] | None, own: set[str] | None = None) -> bool:
    """Whether a request with this ``Host`` header is served: always for an IP address (a
    DNS-rebinding page sends its own host name, never an address), ``localhost``,
    ``*.localhost`` and this machine's host names; else when ``allowed`` lists it (``*``: any
    host, ``.example.com``: a domain and its subdomains). A request without Host (HTTP/1.0) is
    served."""
    if header is None or header == "":
        return True
    host = host_name(header)
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    if host == "localhost" or host.endswith(".localhost") or host in (own if own is not None else _own_names()):
        return True
    for pattern in allowed or ():
        pattern = pattern.lower()
        if (
            pattern == "*"
            or host == pattern
            or (pattern.startswith(".") and (host.endswith(pattern) or host == pattern[1:]))
        ):
            return True
    return False


def parse_allowed_hosts(text: str | None) -> tuple[str, ...] | None:
    """``--allowed-hosts``: comma-separated host names served besides addresses, localhost and this
    machine's names (``*``: any); None or empty: those only."""
    if text is None or not text.strip():
        return None
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    for h in hosts:
        if h != "*" and (any(c in h for c in " /@?#") or h.count("*")):
            raise ValueError(
                f"--allowed-hosts: {h!r} is not a host name (comma-separated names, '.domain' for a "
                "domain and its subdomains, or '*' for any)"
            )
    return hosts


# ------------------------------------------------------------------------------------ API key


def check_api_key(key: str | None, what: str = "api_key") -> str | None:
    """The key as the server compares it; ValueError naming ``what`` for a key an HTTP header cannot
    carry (headers are latin-1 text without control characters)."""
    if key is None:
        return None
    key = key.strip()
    if not key:
        raise ValueError(f"{what}: the API key is empty")
    try:
        key.encode("latin-1")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what}: the API key holds {key[e.start]!r} at character {e.start}, which an HTTP "
            "header cannot carry (latin-1 text only); choose an ASCII key"
        ) from None
    if any(ord(c) < 32 or ord(c) == 127 for c in key) or " " in key:
        raise ValueError(f"{what}: the API key holds a space or a control character; choose a key without them")
    return key


# ------------------------------------------------------------------------------------ the middleware


def _header(scope, name: bytes) -> bytes | None:
    for k, v in scope["headers"]:
        if k.lower() == name:
            return v
    return None


async def send_error(send, e: APIError, close: bool = True) -> None:
    body = json.dumps(e.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    if e.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Guard:
    """ASGI middleware: the checks of the module docstring. ``count(label)`` is called for every
    request on a ``/v1`` POST route that it refuses (the status) or that left before its body was
    read (``cancelled``)."""

    def __init__(self, app, limits: Limits, count: Callable[[str], None] | None = None):
        self.app = app
        self.limits = limits
        self.count = count or (lambda label: None)
        self.own = _own_names()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        api = scope["method"] == "POST" and scope["path"].startswith("/v1/")
        started = False

        async def tracked(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            refused = self._check_head(scope, api)
            if refused is None and scope["method"] in ("POST", "PUT", "PATCH"):
                refused, receive = await self._read_body(scope, receive)
                if refused == "gone":
                    if api:
                        self.count("cancelled")
                    return
            if refused is not None:
                if api:
                    self.count(str(refused.status))
                return await send_error(send, refused)
            await self.app(scope, receive, tracked)
        except Exception as e:  # noqa: BLE001 - one log line with an id; the client gets the id, not the text
            error_id = uuid.uuid4().hex[:12]
            log.error(
                "%s %s failed (error id %s): %s: %s",
                scope["method"],
                scope["path"],
                error_id,
                type(e).__name__,
                str(e)[:500],
                exc_info=not isinstance(e, RecursionError),
            )
            if api:
                self.count("500")
            if not started:
                await send_error(
                    send,
                    APIError(
                        500,
                        f"internal error (error id {error_id}: the server's log has the details)",
                        code="internal_error",
                    ),
                )

    def _check_head(self, scope, api: bool) -> APIError | None:
        lim = self.limits
        if len(scope["headers"]) > lim.max_headers:
            return APIError(
                431,
                f"the request has {len(scope['headers'])} headers, more than this server's {lim.max_headers}",
                code="too_many_headers",
            )
        host = _header(scope, b"host")
        if not host_allowed(host.decode("latin-1") if host is not None else None, lim.allowed_hosts, self.own):
            assert host is not None  # host_allowed serves a request without Host
            shown = host.decode("latin-1")[:100]
            return APIError(
                403,
                f"this server does not answer to Host {shown!r} (it protects loopback servers from "
                "web pages through DNS rebinding): use its address or localhost, or start it with "
                "--allowed-hosts NAME[,NAME...] ('*': any)",
                code="host_not_allowed",
            )
        if api:
            ctype = (_header(scope, b"content-type") or b"").decode("latin-1")
            media = ctype.split(";", 1)[0].strip().lower()
            if media != "application/json":
                shown = ctype[:80] if ctype else "none"
                return APIError(
                    415,
                    f"the request body must be sent as Content-Type: application/json (got "
                    f"{shown}); other types are what a web page can send across sites without "
                    "asking",
                    code="unsupported_media_type",
                )
        length = _header(scope, b"content-length")
        if length is not None:
            try:
                n = int(length)
                if n < 0 or len(length) > 19:
                    raise ValueError
            except ValueError:
                return APIError(
                    400,
                    f"Content-Length {length.decode('latin-1')[:30]!r} is not a byte count",
                    code="bad_content_length",
                )
            if n > lim.max_body_bytes:
                return self._too_large(n)
        return None

    def _too_large(self, n: int | None) -> APIError:
        size = f"{n} bytes" if n is not None else "more"
        return APIError(
            413,
            f"the request body ({size}) is larger than this server's limit of "
            f"{self.limits.max_body_bytes} bytes (blockbatch serve --max-body-bytes); a prompt that "
            "long could not fit its max length anyway",
            code="body_too_large",
        )

    async def _read_body(self, scope, receive):
        """The whole body, within the limits, and a receive that hands it to the app: (None, receive),
        (APIError, None), or ("gone", None) when the client left first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_s
        chunks, size = [], 0
        while True:
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                return APIError(
                    408,
                    f"the request body did not arrive within {self.limits.body_timeout_s:g} s ({size} bytes came)",
                    code="body_timeout",
                ), None
            if message["type"] == "http.disconnect":
                return "gone", None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                return self._too_large(None), None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        given = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return None, replay
