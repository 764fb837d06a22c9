"""The completion routes' common case in one ASGI layer.

A relayed request's own time before its upstream call is spent mostly in layers: uvicorn
hands the request to FastAPI, Starlette, its error middleware, two of FastAPI's own
(telemetry, body limit), redline's six (body limit, body deadline, auth, readiness, rate
limit, in-flight count) and DirectRoutes, each a coroutine call, two of them wrapping
`receive` and `send` in closures of their own. Every call is cheap when the code is in the
CPU's caches; on a gateway whose two cores also run the upstream's and the clients' work it
rarely is, and the stack was ~50 µs of the ~250 µs from a request's bytes to its upstream
write (stage trace at one stream, docs/BENCHMARKS.md).

`FastLane` sits outside all of them (inside the server's hooks). A POST to
/v1/chat/completions or /v1/completions with a JSON content type and a Content-Length
within the body limit, that passes the same checks (the same middleware objects' own
`check` methods) and whose body validates, is answered here by DirectRoutes' handler. The
body is read by BodyTimeout's deadline (408 after it), or at once where the server says it
is all in (`BODY_IN`: no timer). Anything else goes through the whole stack untouched,
before anything is charged or consumed except the body, which is replayed: its answer
(401, 413, 503, 400, ...) is exactly the regular one.

The lane turns itself off where it cannot stand in for every layer: a middleware it does
not know in the stack, FastAPI's OpenTelemetry tracing on, or a root path.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from redline.api.auth import Auth
from redline.api.limits import RateLimit
from redline.api.middleware import BodyLimit, BodyTimeout, ReadyGate, body_framing
from redline.api.openai_routes import DirectRoutes, json_body, replay, serve_direct
from redline.api.server import CountInflight
from redline.api.sse import BODY_IN

log = logging.getLogger(__name__)

# FastAPI's own layers that pass every request through unchanged in the app as made here
# (no max_body_size; telemetry off, checked per request below)
_PASS_THROUGH = {("fastapi.telemetry._asgi", "ExceptionTelemetryMiddleware"),
                 ("fastapi._body_limit", "AppBodyLimitMiddleware")}


class FastLane:
    """ASGI, outside the app's middleware stack (see the module's docstring); `stack` is
    where every request it does not answer goes (the app itself)."""

    def __init__(self, app: Any) -> None:
        """`app`: the FastAPI app made by `create_app`, middlewares all added."""
        self.app = app
        self.stack: ASGIApp = app  # where everything else goes
        self.layers = _layers(app)
        self.on = self.layers is not None and not app.root_path
        if not self.on:
            log.info("fast lane off: the middleware stack is not the one it stands in for")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = DirectRoutes.ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or not self.on or scope["method"] != "POST" or not self._plain(scope):
            await self.stack(scope, receive, send)
            return
        layers = self.layers
        assert layers is not None
        if layers.auth.check(scope) is not None or layers.ready.check(scope) is not None:
            await self.stack(scope, receive, send)  # the stack answers it
            return
        body_in = scope.get(BODY_IN)
        if body_in is not None and body_in():
            messages = [await receive()]  # in whole: no wait, no deadline to keep
        else:  # on its way (a client that writes its head and body apart): BodyTimeout's read
            timed = layers.timeout
            read = await timed.read(receive, asyncio.get_running_loop().time() + timed.timeout)
            if read is None:
                await timed.refuse(send)  # 408, as BodyTimeout answers
                return
            messages = read
        try:
            if messages[-1]["type"] != "http.request":
                raise ValueError("the client left")
            raw = messages[0].get("body", b"") if len(messages) == 1 else b"".join(
                m.get("body", b"") for m in messages)
            body = route[0].model_validate_json(raw)
        except ValueError:  # pydantic's ValidationError is one: the stack answers
            await self.stack(scope, replay(messages, receive), send)
            return
        scope["app"] = self.app  # as Starlette sets it (Request.app)
        if layers.rate.applies(scope):
            limited = await layers.rate.admit(scope, send)
            if limited is None:
                return  # 429 sent
            send = limited
        inflight = layers.inflight.inflight
        inflight.n += 1
        try:
            await serve_direct(scope, receive, send, body, route[1], outermost=True)
        finally:
            inflight.n -= 1

    def _plain(self, scope: Scope) -> bool:
        """The body is declared JSON, of a length within BodyLimit's (not chunked), and
        no per-request layer of FastAPI's is on."""
        telemetry = getattr(self.app, "_native_telemetry", None)
        if telemetry is not None and telemetry.enabled():
            return False
        assert self.layers is not None
        length, chunked = body_framing(scope)
        return (not chunked and length is not None
                and length <= self.layers.body.limit_for(scope["path"]) and json_body(scope))


class _Layers:
    __slots__ = ("body", "timeout", "auth", "ready", "rate", "inflight")

    def __init__(self, found: dict[type, Any]) -> None:
        self.body: BodyLimit = found[BodyLimit]
        self.timeout: BodyTimeout = found[BodyTimeout]
        self.auth: Auth = found[Auth]
        self.ready: ReadyGate = found[ReadyGate]
        self.rate: RateLimit = found[RateLimit]
        self.inflight: CountInflight = found[CountInflight]


def _layers(app: Any) -> _Layers | None:
    """The app's own middleware objects between the server and DirectRoutes, or None if
    the stack holds anything else (a layer this lane would skip without doing its work)."""
    if app.middleware_stack is None:
        app.middleware_stack = app.build_middleware_stack()  # as Starlette does on first call
    known = {ServerErrorMiddleware, BodyLimit, BodyTimeout, Auth, ReadyGate, RateLimit,
             CountInflight}
    found: dict[type, Any] = {}
    layer: ASGIApp | None = app.middleware_stack
    while layer is not None and not isinstance(layer, DirectRoutes):
        kind = type(layer)
        if kind not in known and (kind.__module__, kind.__qualname__) not in _PASS_THROUGH:
            return None
        if kind is ServerErrorMiddleware and getattr(layer, "debug", False):
            return None  # tracebacks as HTML: not what serve_direct answers
        found[kind] = layer
        layer = getattr(layer, "app", None)
    if layer is None or any(k not in found for k in known):
        return None
    return _Layers(found)


__all__ = ["FastLane"]
