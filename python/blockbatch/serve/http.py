"""uvicorn's h11 protocol with the limits of ``blockbatch serve`` (``serve.guard`` describes them):
a header deadline, the header-size error as an OpenAI-shaped 431, and half-closed clients
answered (probes after the client's EOF tell a real close from a half close)."""

from __future__ import annotations

import json
import logging

from .guard import REASONS, APIError, Limits

log = logging.getLogger("blockbatch.serve")


def _raw_error(status: int, e: APIError) -> bytes:
    body = json.dumps(e.body()).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (status, REASONS.get(status, b"Error"), len(body))
    ) + body


def protocol_class(limits: Limits):
    """uvicorn's h11 protocol with the header deadline, the header-size error and the half-close
    handling of the module docstring (pass it as ``uvicorn.Config(http=...)``)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self._bb_eof = False
            self._bb_probe = None
            self._bb_header_timer = None
            self._bb_cycle = None
            self._bb_arm()

        def _bb_arm(self) -> None:
            self._bb_disarm()
            self._bb_header_timer = self.loop.call_later(limits.header_timeout_s, self._bb_header_timeout)

        def _bb_disarm(self) -> None:
            if self._bb_header_timer is not None:
                self._bb_header_timer.cancel()
                self._bb_header_timer = None

        def _bb_active(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _bb_header_timeout(self) -> None:
            self._bb_header_timer = None
            if self.transport.is_closing() or self._bb_active():
                return
            self.transport.write(
                _raw_error(
                    408,
                    APIError(
                        408,
                        f"the request head did not arrive within {limits.header_timeout_s:g} s",
                        code="header_timeout",
                    ),
                )
            )
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and cycle is not self._bb_cycle:  # a new request: its head is complete
                self._bb_cycle = cycle
                self._bb_disarm()
                self._bb_watch_content_type(cycle)

        def _bb_watch_content_type(self, cycle) -> None:
            send = cycle.send
            cycle.bb_event_stream = False

            async def watched(message):
                if message["type"] == "http.response.start":
                    cycle.bb_event_stream = any(
                        k.lower() == b"content-type" and v.lower().startswith(b"text/event-stream")
                        for k, v in message.get("headers", [])
                    )
                await send(message)

            cycle.send = watched

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if self._bb_eof:  # the client sends nothing more
                self.transport.close()
            elif not self._bb_active():
                self._bb_arm()  # the next request's head, within the deadline too

        def connection_lost(self, exc) -> None:
            self._bb_disarm()
            if self._bb_probe is not None:
                self._bb_probe.cancel()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            if self.transport.is_closing():
                return
            buffered = len(self.conn.trailing_data[0])
            if buffered > limits.max_header_bytes:
                e = APIError(
                    431,
                    f"the request head is larger than this server's {limits.max_header_bytes} bytes",
                    code="headers_too_large",
                )
            else:
                e = APIError(400, "invalid HTTP request", code="bad_http")
            self.transport.write(_raw_error(e.status, e))
            self.transport.close()

        def eof_received(self):
            cycle = self.cycle
            if cycle is None or cycle.response_complete or cycle.more_body:
                return None  # idle, or the request is not whole: the client is gone (asyncio closes)
            self._bb_eof = True
            self._bb_probe_step(0)
            return True  # keep the sending side open: the answer still goes out

        def _bb_probe_step(self, n: int) -> None:
            self._bb_probe = None
            cycle = self.cycle
            if self.transport.is_closing() or cycle is None or cycle.response_complete or cycle.disconnected:
                return
            try:
                if not cycle.response_started:
                    data = self.conn.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
                elif getattr(cycle, "bb_event_stream", False):
                    data = self.conn.send(h11.Data(data=b":\n\n"))  # an SSE comment: clients skip it
                else:
                    data = None  # a plain response being written: its own bytes probe
            except h11.LocalProtocolError:  # HTTP/1.0: no interim responses; a half-close is a close
                cycle.disconnected = True
                cycle.message_event.set()
                self.transport.close()
                return
            if data:
                self.transport.write(data)
            self._bb_probe = self.loop.call_later(0.05 if n == 0 else limits.probe_s, self._bb_probe_step, n + 1)

    return GuardedH11Protocol
