"""A small HTTP/1.1 client for streamed upstream responses: one asyncio protocol per
connection, httptools (llhttp, C) for the response, a keep-alive pool per upstream.

Why not aiohttp here: a gateway's first token waits on every trip its request makes
through a busy event loop, and each trip waits behind the other streams' tokens. On
Python < 3.12 aiohttp sends a request's body from a task of its own (one trip before the
upstream sees the request), and it wakes the caller for the response head and again for
the first body bytes. Here the request goes out in the caller's own step (one write), and
the caller wakes when body bytes, the end of the response, or an error are there: the
head alone wakes no one. Per relayed chunk it is one `data_received` and one wake-up.

First tokens before relayed ones: once a stream's first token is out (the caller sets
`relaying`), its chunks wake the caller one loop pass later, behind what came in the same
pass: a new request's first step, another stream's first token. At 64 streams, a request's
first step waited behind up to a few relayed tokens (~80 µs each) in its pass; a relayed
token, 20 ms from the next, does not notice the pass. Paired A/B: TTFT p50 -0.14 to
-0.18 ms (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

import httptools


class UpstreamTimeout(Exception):
    """No byte from the upstream for the read timeout."""


class UpstreamClosed(ConnectionError):
    """The upstream closed the connection before the response was complete."""


class Http1Connection(asyncio.Protocol):
    """One keep-alive connection; one response at a time (no pipelining)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout_s: float) -> None:
        self.loop = loop
        self.read_timeout_s = read_timeout_s
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_rx = 0.0
        self.uses = 0  # requests sent on it
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.received = False  # any byte of this response
        self.framed = False  # Content-Length or chunked: else the body ends with the connection
        self.error: BaseException | None = None
        self._body: list[bytes] = []
        # the caller relays a stream whose first token is out: its wake-ups go behind
        # the callbacks already due (a request's first step, another's first token)
        self.relaying = False

    # -- asyncio.Protocol -----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection's: a Transport

    def data_received(self, data: bytes) -> None:
        self._last_rx = self.loop.time()
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = exc
            self.close()
        if self._body or self.complete or self.error is not None:
            if self.relaying:
                self.loop.call_soon(self._wake)
            else:
                self._wake()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.error is None:
            if self.head_done and not self.framed:
                self.complete = True  # a body delimited by the connection's end
            else:
                self.error = exc or UpstreamClosed("the upstream closed the connection")
        self._cancel_timer()
        self._wake()

    # -- httptools callbacks --------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # -- the caller's side ----------------------------------------------------
    def send(self, data: bytes) -> None:
        self._reset()
        self.uses += 1
        self._last_rx = self.loop.time()
        assert self.transport is not None
        self.transport.write(data)

    def take(self) -> list[bytes]:
        """The body bytes that came since the last call."""
        body, self._body = self._body, []
        return body

    async def wait(self) -> None:
        """Until body bytes are there, the response is complete, or it failed (raised)."""
        while not (self._body or self.complete):
            if self.error is not None:
                raise self.error
            self._waiter = self.loop.create_future()
            if self._timer is None:
                self._timer = self.loop.call_at(self._last_rx + self.read_timeout_s, self._check)
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read_all(self) -> bytes:
        out: list[bytes] = []
        while True:
            await self.wait()
            out += self.take()
            if self.complete:
                return b"".join(out)

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self._body

    def close(self) -> None:
        self._cancel_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # the upstream sees the connection go: it stops generating

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _check(self) -> None:
        """The read timer: one per read timeout, not one per chunk."""
        self._timer = None
        if self._waiter is None:
            return  # nobody waits: the next wait() arms it again
        due = self._last_rx + self.read_timeout_s
        if self.loop.time() >= due:
            self.error = UpstreamTimeout(f"no data from the upstream for {self.read_timeout_s:g} s")
            self.close()
            self._wake()
        else:
            self._timer = self.loop.call_at(due, self._check)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Http1Pool:
    """Keep-alive connections to one origin (scheme://host:port). No limit on how many:
    admission control and tiers bound the load."""

    def __init__(self, base_url: str, *, connect_timeout_s: float, read_timeout_s: float,
                 max_idle: int = 256) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname or "localhost"
        self.tls = parts.scheme == "https"
        default = 443 if self.tls else 80
        self.port = parts.port or default
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        self.host_header = host if self.port == default else f"{host}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle = max_idle
        self._idle: list[Http1Connection] = []
        self._ssl = ssl.create_default_context() if self.tls else None
        self.opened = 0  # connections made, for tests and stats

    async def acquire(self, fresh: bool = False) -> Http1Connection:
        """An idle kept-alive connection, or a new one (always, with `fresh`)."""
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: Http1Connection(loop, self.read_timeout_s),
                                   self.host, self.port, ssl=self._ssl,
                                   server_hostname=self.host if self.tls else None),
            self.connect_timeout_s)
        self.opened += 1
        return conn

    def release(self, conn: Http1Connection) -> None:
        """Back to the pool if its response was read to the end and it may be kept."""
        if conn.reusable() and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    @property
    def idle(self) -> int:
        return len(self._idle)

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    def request_head(self, path: str, length: int, extra: bytes = b"") -> bytes:
        """The head of a POST of a JSON body of `length` bytes to `path` (under the base URL)."""
        return (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
                "Accept: text/event-stream\r\nUser-Agent: redline\r\n").encode() + extra + b"\r\n"
