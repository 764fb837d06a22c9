"""ASGI middleware: request body cap (413 before the body is read whole), body-read
deadline (408 for a client that trickles its body), readiness gate."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from redline.errors import NotReady, PayloadTooLarge, RedlineError, RequestTimeout


async def send_error(send: Send, err: RedlineError, close: bool = False,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(err.to_dict()).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), *(headers or ())]
    if err.retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(err.retry_after))).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def body_framing(scope: Scope) -> tuple[int | None, bool]:
    """The request's declared body length (a Content-Length of digits, else None) and
    whether it comes chunked (any Transfer-Encoding)."""
    length: int | None = None
    chunked = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and value.isdigit():
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked


class ReadyGate:
    """503 + Retry-After on /v1/* until the models are warm, and while draining."""

    def __init__(self, app: ASGIApp, is_ready: Callable[[], bool], why: Callable[[], str]) -> None:
        self.app, self.is_ready, self.why = app, is_ready, why

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and not self.is_ready():
            await send_error(send, NotReady(f"Server not ready: {self.why()}.", retry_after=1))
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuse bodies over `limit` bytes: at once from Content-Length, or as soon as the
    streamed body passes the limit (chunked uploads). `per_path` sets other limits for
    exact paths (file uploads are larger than requests)."""

    def __init__(self, app: ASGIApp, limit: int, per_path: dict[str, int] | None = None) -> None:
        self.app, self.limit = app, limit
        self.per_path = per_path or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.per_path.get(scope["path"], self.limit)
        length, chunked = body_framing(scope)
        if length is not None and length > limit:
            await self._reject(send, limit)
            return
        if length is not None and not chunked:
            # the server reads exactly Content-Length bytes: nothing to watch, and the
            # response (every relayed token of a stream) goes out unwrapped
            await self.app(scope, receive, send)
            return
        seen = 0
        rejected = False

        async def guarded_receive() -> Message:
            # over the limit: answer 413 ourselves, and tell the app the client left
            # (frameworks turn exceptions raised while reading the body into a 400)
            nonlocal seen, rejected
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    rejected = True
                    await self._reject(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not rejected:
                await send(message)

        await self.app(scope, guarded_receive, guarded_send)

    async def _reject(self, send: Send, limit: int) -> None:
        err = PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes.")
        await send_error(send, err, close=True)


class BodyTimeout:
    """A request body must arrive whole within `timeout` seconds of the request's start.
    uvicorn has no body-read timeout: a client that sends a byte every few seconds (the
    slow-body attack) would hold a connection and a task forever. After the body is in,
    `receive` is passed through untouched (it then waits for the client's disconnect).
    Late, `receive` raises an HTTPException(408) that the app's handler (or the hot
    routes) answers; `send` is not wrapped (every relayed token goes through it)."""

    def __init__(self, app: ASGIApp, timeout: float) -> None:
        self.app, self.timeout = app, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise _BodyTimedOut() from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        try:
            await self.app(scope, timed_receive, send)
        except _BodyTimedOut:  # an app that did not answer it: before any response, always
            err = RequestTimeout(f"The request body was not received within {self.timeout:g} s.")
            await send_error(send, err, close=True)


class _BodyTimedOut(HTTPException):
    """An HTTPException so that FastAPI's body reader re-raises it (it turns any other
    error into a 400) and the app's handler answers 408 in the OpenAI shape."""

    def __init__(self) -> None:
        super().__init__(408, "The request body was not received in time.")
