"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from redline.api import capabilities, jobs_routes, sse
from redline.api.chunks import ChunkEncoder
from redline.api.limits import reserve_tokens
from redline.api.schemas import ChatCompletionRequest, CompletionRequest
from redline.api.tenant import tenant_from
from redline.api.unicode import check_text
from redline.errors import InvalidRequest
from redline.pipeline import AUTO, Completion, Pipeline
from redline.routing.router import WouldMiss
from redline.streams import Progress, StreamManager
from redline.streams.live import WriteThrough
from redline.types import Chunk, assemble, new_id

router = APIRouter()


def _pipeline(request: Request) -> Pipeline:
    return request.app.state.pipeline  # type: ignore[no-any-return]


# the request headers the completion routes read
_READ = (b"x-redline-tier", b"authorization", b"cache-control", b"x-request-id", b"x-session-id")


def _request_headers(scope: Scope) -> dict[bytes, str]:
    """Those headers (the first of each), in one pass over the scope's: Starlette's
    Headers searches from the start for each, and raises a KeyError for a missing one."""
    out: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in _READ and name not in out:
            out[name] = value.decode("latin-1")
    return out


def _tier(header: str | None, body_tier: str | None) -> str | None:
    tier = header or body_tier
    if tier is not None and tier not in ("S", "A", "B", "auto"):
        raise InvalidRequest("X-Redline-Tier must be one of S, A, B, auto", param="tier")
    return tier


def _headers(c: Completion, request_id: str) -> dict[str, str]:
    headers = {
        "X-Request-Id": request_id,
        "X-Redline-Model": c.model,
        "X-Redline-Tier": c.tier,
        "X-Redline-Cache": c.cache,
        "Server-Timing": c.timings.server_timing(),
    }
    if c.arm is not None:
        headers["X-Redline-Arm"] = c.arm  # "experiment:arm" (A/B experiments)
    return headers


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    created = int(request.app.state.started_at)
    names = [*_pipeline(request).model_names(), AUTO]
    return {"object": "list",
            "data": [{"id": n, "object": "model", "created": created, "owned_by": "redline"}
                     for n in names]}


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    return await _handle(request, body, "chat")


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    return await _handle(request, body, "text")


async def _handle(request: Request, body: ChatCompletionRequest | CompletionRequest,
                  gen_kind: str) -> Response:
    check_text(body)  # a lone surrogate is a 400 here, not a 500 in a tokenizer
    headers = _request_headers(request.scope)
    gen = body.to_generation(
        _tier(headers.get(b"x-redline-tier"), body.tier),
        tenant_from(request.scope, headers.get(b"authorization", "")),
        "no-cache" in headers.get(b"cache-control", "").lower())
    session = headers.get(b"x-session-id")
    if session:  # replica placement keeps a session on one engine replica (backends/pool.py)
        if len(session) > 256:
            raise InvalidRequest("X-Session-ID is longer than 256 characters", param="X-Session-ID")
        gen.session = session
    capabilities.check(request.app.state.config, gen, AUTO)
    if not jobs_routes.wants_job(body, gen, _pipeline(request)):  # a job is charged as it runs
        await reserve_tokens(request.app.state.limiter, request.scope, gen)
    return await _serve(request, gen_kind=gen_kind, body=body, gen=gen,
                        request_id=headers.get(b"x-request-id"))


class DirectRoutes:
    """ASGI middleware, the innermost: POST /v1/chat/completions and /v1/completions with
    a JSON body that validates go straight to their handlers (the same as the routes
    above), past FastAPI's exception middlewares, router and dependency solver: those
    were a third of a relayed request's own time before its upstream call (0.36 ms of
    the gateway's ~1.1 ms at one stream). The body is parsed and validated in one pass
    (pydantic-core). Anything else, and any body that does not validate, goes the
    regular way with its messages replayed, so errors are exactly the regular ones;
    an exception from a handler is answered by the app's handler for it, as
    FastAPI's ExceptionMiddleware would (anything without one propagates the same)."""

    ROUTES: dict[str, tuple[type[ChatCompletionRequest] | type[CompletionRequest], str]] = {
        "/v1/chat/completions": (ChatCompletionRequest, "chat"),
        "/v1/completions": (CompletionRequest, "text")}

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST" or not json_body(scope):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        try:
            if message["type"] != "http.request":
                raise ValueError("no whole body")
            raw = b"".join(m.get("body", b"") for m in messages)
            body = route[0].model_validate_json(raw)
        except ValueError:  # pydantic's ValidationError is one: the regular way answers
            await self.app(scope, replay(messages, receive), send)
            return
        await serve_direct(scope, receive, send, body, route[1])


async def serve_direct(scope: Scope, receive: Receive, send: Send,
                       body: ChatCompletionRequest | CompletionRequest, gen_kind: str,
                       outermost: bool = False) -> None:
    """Answer a completion request whose body has validated, as its route would. An
    exception is answered by the app's handler for it, as FastAPI's ExceptionMiddleware
    would; `outermost` (no Starlette middleware outside: see api/fastlane.py) also
    answers anything else with the app's `Exception` handler and raises it again, as
    Starlette's ServerErrorMiddleware does (the server logs it)."""
    request = Request(scope, receive)
    try:
        response = await _handle(request, body, gen_kind)
    except Exception as exc:
        handler = _handler_for(request.app, exc)
        if handler is not None:
            response = await handler(request, exc)
        elif outermost and Exception in request.app.exception_handlers:
            await (await request.app.exception_handlers[Exception](request, exc))(scope, receive, send)
            raise
        else:
            raise
    await response(scope, receive, send)


def json_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


def replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()
    return replayed


def _handler_for(app: Any, exc: Exception) -> Callable[..., Any] | None:
    """The app's exception handler for `exc`, as Starlette's ExceptionMiddleware finds
    it (by the exception's classes, most derived first); `Exception`'s own handler is the
    server-error middleware's, outside: not taken here."""
    handlers = app.exception_handlers
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]  # type: ignore[no-any-return]
    return None


async def _serve(request: Request, *, gen_kind: str, body: Any, gen: Any,
                 request_id: str | None) -> Response:
    pipeline = _pipeline(request)
    if jobs_routes.wants_job(body, gen, pipeline):  # tier B or "background": 202 + a job
        return await jobs_routes.accept(request, body, gen, gen_kind)
    request_id = request_id or gen.id
    streams: StreamManager = request.app.state.streams
    made: list[_StreamParts] = []  # made while the first token is awaited, if it was

    def prepare(model: str, tier: str) -> None:
        if not made:
            made.append(_StreamParts(gen, gen_kind, body.include_usage, streams, model, tier))

    try:
        completion = await pipeline.complete(gen, on_routed=prepare if body.stream else None)
    except WouldMiss:  # allow_background: a job now beats a first token past the budget
        response = await jobs_routes.accept(request, body, gen, gen_kind)
        response.headers["X-Redline-Degraded"] = "background"
        return response
    if body.stream:
        parts = made[0] if made else None
        if parts is None or (parts.model, parts.tier) != (completion.model, completion.tier):
            parts = _StreamParts(gen, gen_kind, body.include_usage, streams, completion.model,
                                 completion.tier)
        made.append(parts)  # non-empty: a late prepare() does nothing
        stream_id = new_id("strm")
        headers = _headers(completion, request_id) | {
            "X-Redline-Stream-Id": stream_id, "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no"}
        # generation runs in its own task (journalled, resumable); this response only reads
        events = _sse(completion, parts.encoder, stream_id, parts.progress)
        # the first token is in hand: encode its events here, so that the response's
        # first write carries it. Handed to a producer task, it would wait for that task
        # to start and then for this one to wake: two trips through a busy event loop.
        first: list[bytes] = []
        try:
            # chat: the role event of each choice, then it
            for _ in range(1 + gen.sampling.n if gen_kind == "chat" else 1):
                first.append(await events.__anext__())
        except StopAsyncIteration:
            pass
        except BaseException:  # cancelled while a first chunk without text waits for more
            await events.aclose()  # closes the chunks: frees the upstream or engine sequence
            raise
        live = streams.start(stream_id, events, tenant=gen.tenant, first=first)
        through = WriteThrough()  # the producer writes the tokens once the response is under way
        return sse.EventStream(streams.follow(live, through=through), headers=headers,
                               first_ready=bool(first), on_started=through.offer)
    encoder = ChunkEncoder(gen_kind, gen.id, completion.model)  # type: ignore[arg-type]
    got = [chunk async for chunk in completion.chunks]
    payload = encoder.full(assemble(got, gen.sampling.n), completion.usage,
                           completion.finish_reason or "stop")
    return Response(payload, media_type="application/json",
                    headers=_headers(completion, request_id))


class _StreamParts:
    """What a streamed response takes from its model and tier: the chunk encoder and the
    progress tracker (a prediction from the length history)."""

    __slots__ = ("model", "tier", "encoder", "progress")

    def __init__(self, gen: Any, gen_kind: str, include_usage: bool, streams: StreamManager,
                 model: str, tier: str) -> None:
        self.model, self.tier = model, tier
        self.encoder = ChunkEncoder(gen_kind, gen.id, model, include_usage)  # type: ignore[arg-type]
        self.progress = streams.progress(gen, model, tier)


async def _sse(c: Completion, encoder: ChunkEncoder, stream_id: str,
               progress: Progress | None = None) -> AsyncIterator[bytes]:
    seq = 0

    def ev(data: dict[str, Any] | str) -> bytes:
        nonlocal seq
        seq += 1
        return sse.event(stream_id, seq, data)

    def at(tokens: int) -> dict[str, Any] | None:
        return None if progress is None else progress.advance(tokens)

    try:
        if encoder.kind == "chat":
            for index in range(c.request.sampling.n):
                yield ev(encoder.role(index, at(0)))
        async for chunk in c.chunks:
            if chunk.finish_reason == "error":
                yield ev({"error": {"message": chunk.error or "generation failed",
                                    "type": "server_error", "param": None, "code": None}})
                break
            if chunk.has_delta:
                plain = not (chunk.index or chunk.reasoning or chunk.tool_calls
                             or chunk.logprobs or chunk.extra)
                yield ev(encoder.text(chunk.text, at(chunk.tokens)) if plain
                         else encoder.delta(chunk, at(chunk.tokens)))
            elif progress is not None:
                progress.advance(chunk.tokens)
            if chunk.ends_choice is not None:  # another choice goes on
                yield ev(encoder.finish(chunk.index, chunk.ends_choice, None))
            if chunk.finish_reason is not None:
                last: dict[str, Any] = {"timings": _ms(c)}
                if progress is not None:
                    last["progress"] = progress.finish()
                yield ev(encoder.finish(chunk.index, chunk.finish_reason, last))
        if encoder.include_usage and c.usage is not None:
            yield ev(encoder.usage(c.usage))
    except Exception as exc:  # a failure after streaming began: an error event, then DONE
        yield ev({"error": {"message": f"generation failed: {type(exc).__name__}",
                            "type": "server_error", "param": None, "code": None}})
    finally:
        # abandoned (closed early): close the chunks now, which frees the engine sequence
        close = getattr(c.chunks, "aclose", None)
        if close is not None:
            with contextlib.suppress(RuntimeError):
                await close()
    yield ev(sse.DONE)


def _ms(c: Completion) -> dict[str, float]:
    return {k: round(v * 1000, 2) for k, v in c.timings.seconds.items()}


__all__ = ["router", "Chunk"]
