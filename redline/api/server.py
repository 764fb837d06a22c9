"""The HTTP server: uvicorn, hardened against slow clients, draining on SIGTERM.

uvicorn alone has no header or body read timeout: a slowloris client that sends a
header line every few seconds holds its connection forever. Here:
- headers must be complete `header_timeout_s` after the connection opens (or after the
  previous response on a keep-alive connection), else the connection is closed;
- bodies must be whole `body_timeout_s` after the request starts (`BodyTimeout`, 408);
- past `max_connections` open connections, a new one is answered 503 + Retry-After
  in the OpenAI shape and closed (uvicorn's own `limit_concurrency` answers plain text);
- SIGTERM drains: /readyz and new /v1/* requests answer 503 at once, running requests
  and streams go on to their end for up to `drain_timeout_s`, then the server exits.
  A second SIGTERM/SIGINT exits at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

# llhttp in C (httptools, a dependency): a fraction of h11's cost per request and chunk
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from redline.api.services import Inflight, Services, services_of
from redline.api.sse import HOLD_HEAD, OFFERS
from redline.config import LimitsConfig
from redline.errors import Overloaded

log = logging.getLogger(__name__)


class CountInflight:
    """ASGI middleware that keeps an `Inflight` count, for the drain."""

    def __init__(self, app: Any, inflight: Inflight) -> None:
        self.app, self.inflight = app, inflight

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        self.inflight.n += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight.n -= 1


async def _overloaded(scope: Any, receive: Any, send: Any) -> None:
    err = Overloaded("Too many open connections; retry shortly.", retry_after=1)
    body = json.dumps(err.to_dict()).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                            (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class _HeaderDeadline:
    """The header deadline and connection cap, for either of uvicorn's HTTP protocols:
    headers must be complete `header_timeout_s` after the connection opens or the last
    response ends, else the connection is closed; past `max_connections`, a new
    connection's request is answered 503."""

    header_timeout_s = 10.0
    max_connections = 1024

    _header_timer: asyncio.TimerHandle | None = None
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    app: Any

    def _awaiting_headers(self) -> bool:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # the uvicorn protocol's, after this mixin in the class's bases (mypy sees object's)
        super().connection_made(transport)  # type: ignore[misc]  # a mixin: see the line above
        if len(self.connections) > self.max_connections:
            self.app = _overloaded  # this connection's request gets a 503, then it closes
        self._arm()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection gets its own deadline
        super().on_response_complete()  # type: ignore[misc]  # the protocol's (above)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]  # the protocol's (above)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self._awaiting_headers() and not self.transport.is_closing():
            self.transport.close()


class GuardedH11(_HeaderDeadline, H11Protocol):
    """uvicorn's h11 protocol plus a header deadline and a connection cap."""

    def _awaiting_headers(self) -> bool:
        # IDLE: no complete request line + headers yet (h11 buffers partial ones)
        return bool(self.conn.their_state is h11.IDLE)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:
            self._disarm()


class GuardedHttpTools(_HeaderDeadline, HttpToolsProtocol):
    """uvicorn's httptools protocol with the same header deadline and connection cap."""

    _in_headers = True  # the next request's headers are not complete yet

    def _arm(self) -> None:
        if self.pipeline:  # a pipelined request's headers are complete already:
            return  # it is served next, not cut at a deadline for headers
        self._in_headers = True
        super()._arm()

    def _awaiting_headers(self) -> bool:
        return self._in_headers

    def on_response_complete(self) -> None:
        _withdraw(self.cycle)
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        _withdraw(self.cycle)
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not an upgrade
            # the server's offer to EventStream (api/sse.py), an ASGI extension
            self.scope.setdefault("extensions", {})[OFFERS] = {
                HOLD_HEAD: lambda: _HeldWrite(cycle).release}


def _withdraw(cycle: Any) -> None:
    """Take the offer back from a response's scope: it closes over the cycle that
    holds the scope, a reference cycle that only the collector would free (a 5-10 ms
    pause every second or so under load)."""
    extensions = cycle.scope.get("extensions") if cycle is not None else None
    if extensions:
        extensions.pop(OFFERS, None)


class _HeldWrite:
    """In place of a response cycle's transport: holds the first write (the response
    head), sends it joined with the second (the first body chunk), then puts the real
    transport back. release() sends what is still held; it returns None."""

    __slots__ = ("cycle", "real", "held")

    def __init__(self, cycle: Any) -> None:
        self.cycle, self.real = cycle, cycle.transport
        self.held: bytes | None = None
        cycle.transport = self

    def write(self, data: bytes) -> None:
        if self.held is None:
            self.held = data
            return
        held, self.held = self.held, None
        self.cycle.transport = self.real
        self.real.write(held + data)

    def release(self) -> None:
        if self.cycle.transport is self:
            self.cycle.transport = self.real
        held, self.held = self.held, None
        if held is not None and not self.real.is_closing():
            self.real.write(held)

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...
        return getattr(self.real, name)


def protocol(limits: LimitsConfig) -> type[asyncio.Protocol]:
    base: type[asyncio.Protocol] = GuardedHttpTools
    return type(base.__name__, (base,), {"header_timeout_s": limits.header_timeout_s,
                                         "max_connections": limits.max_connections})


class DrainingServer(uvicorn.Server):
    """The first SIGTERM/SIGINT starts a drain instead of closing the listeners: a load
    balancer keeps getting 503 from /readyz (and new requests 503) while the running
    ones finish; the server exits when none are left or at the drain deadline."""

    def __init__(self, config: uvicorn.Config, services: Services, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.services, self.inflight = services, services.inflight
        self.drain_timeout_s = drain_timeout_s
        self.drain_started: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_started is None and sig in (signal.SIGTERM, signal.SIGINT):
            self.drain_started = time.monotonic()
            self.services.draining = True
            log.info("signal %d: draining %d running request(s), at most %.0f s",
                     sig, self.inflight.n, self.drain_timeout_s)
            return
        super().handle_exit(sig, frame)  # a second signal: exit now

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None:
            waited = time.monotonic() - self.drain_started
            if self.inflight.n == 0:
                log.info("drained in %.1f s", waited)
                return True
            if waited >= self.drain_timeout_s:
                log.warning("drain deadline: %d request(s) still running are cut", self.inflight.n)
                return True
        return await super().on_tick(counter)


def _loop() -> str:
    """uvloop where it is installed (Linux, macOS): its transports and scheduling cost a
    fraction of asyncio's, which is most of a gateway's per-token work."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def build(app: Any, host: str, port: int, limits: LimitsConfig, log_level: str = "info") -> DrainingServer:
    """A server for `app` (made by `create_app`: its services count and drain requests)."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=False,
        http=protocol(limits), lifespan="on", loop=_loop(),
        timeout_keep_alive=int(max(1, limits.keep_alive_s)),
        # the drain already waited for running requests; what is left after it is cut
        timeout_graceful_shutdown=1,
    )
    return DrainingServer(config, services_of(app), limits.drain_timeout_s)


def run(app: Any, host: str, port: int, limits: LimitsConfig, log_level: str = "info") -> None:
    build(app, host, port, limits, log_level).run()


__all__ = ["CountInflight", "DrainingServer", "GuardedH11", "Inflight", "build", "protocol", "run"]
