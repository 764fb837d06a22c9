"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Scope

from redline.api import jobs_routes, sse
from redline.api.schemas import ChatCompletionRequest, CompletionRequest
from redline.api.tenant import tenant_from
from redline.closing import aclose
from redline.pipeline import Completion
from redline.routing.names import AUTO, parse_tier
from redline.streams import Progress, StreamManager
from redline.streams.live import WriteThrough
from redline.types import Chunk, new_id

if TYPE_CHECKING:
    from redline.api.services import Services

router = APIRouter()


# the request headers the completion routes read
_READ = (b"x-redline-tier", b"authorization", b"cache-control", b"x-request-id")


def _request_headers(scope: Scope) -> dict[bytes, str]:
    """Those headers (the first of each), in one pass over the scope's: Starlette's
    Headers searches from the start for each, and raises a KeyError for a missing one."""
    out: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in _READ and name not in out:
            out[name] = value.decode("latin-1")
    return out


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
    names = [*request.app.state.services.pipeline.model_names(), AUTO]
    return {"object": "list",
            "data": [{"id": n, "object": "model", "created": created, "owned_by": "redline"}
                     for n in names]}


# a JSON body is served by the hot routes (api/hot.py) before these see it; these serve
# the rest (another content type) and describe the routes in /openapi.json
@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    return await serve(request.app.state.services, request, body, "chat")


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    return await serve(request.app.state.services, request, body, "text")


async def serve(services: Services, request: Request,
                body: ChatCompletionRequest | CompletionRequest, gen_kind: str) -> Response:
    """Answer a completion request whose body has validated (from the hot routes,
    api/hot.py, or the FastAPI routes above)."""
    asked = _request_headers(request.scope)
    gen = body.to_generation(
        parse_tier(asked.get(b"x-redline-tier") or body.tier),
        tenant_from(request.scope, asked.get(b"authorization", "")),
        "no-cache" in asked.get(b"cache-control", "").lower())
    pipeline = services.pipeline
    if jobs_routes.wants_job(body, gen, pipeline):  # tier B or "background": 202 + a job
        return await jobs_routes.accept(request, body, gen, gen_kind)
    request_id = asked.get(b"x-request-id") or gen.id
    streams = services.streams
    prepared = await pipeline.prepare(gen)  # arm, cache, route plan: nothing sent yet
    if prepared.would_miss:  # allow_background: a job now beats a first token past the budget
        response = await jobs_routes.accept(request, body, gen, gen_kind)
        response.headers["X-Redline-Degraded"] = "background"
        return response
    parts = (_StreamParts(gen, gen_kind, body.include_usage, streams, prepared.model, prepared.tier)
             if body.stream else None)
    completion = await pipeline.open(prepared)
    if parts is not None:
        if (parts.model, parts.tier) != (completion.model, completion.tier):  # a fallback
            parts = _StreamParts(gen, gen_kind, body.include_usage, streams, completion.model,
                                 completion.tier)
        stream_id = new_id("strm")
        headers = _headers(completion, request_id) | {
            "X-Redline-Stream-Id": stream_id, "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no"}
        # generation runs in its own task (journalled, resumable); this response only reads
        events = _sse(completion, parts.shape, stream_id, body.include_usage, parts.progress,
                      parts.piece)
        # the first token is in hand: encode its events here, so that the response's
        # first write carries it. Handed to a producer task, it would wait for that task
        # to start and then for this one to wake: two trips through a busy event loop.
        first: list[bytes] = []
        try:
            for _ in range(2 if gen_kind == "chat" else 1):  # chat: the role event, then it
                first.append(await events.__anext__())
        except StopAsyncIteration:
            pass
        except BaseException:  # cancelled while a first chunk without text waits for more
            await aclose(events)  # closes the chunks: frees the upstream or engine sequence
            raise
        live = streams.start(stream_id, events, tenant=gen.tenant, first=first)
        through = WriteThrough()  # the producer writes the tokens once the response is under way
        return sse.EventStream(streams.follow(live, through=through), headers=headers,
                               first_ready=bool(first), on_started=through.offer)
    shape = _shape(gen_kind, gen.id, completion.model)
    text = []
    async for chunk in completion.chunks:
        text.append(chunk.text)
    payload = shape.full("".join(text), completion)
    return JSONResponse(payload, headers=_headers(completion, request_id))


def _shape(gen_kind: str, gen_id: str, model: str) -> _Shape:
    return _ChatShape(gen_id, model) if gen_kind == "chat" else _TextShape(gen_id, model)


class _StreamParts:
    """What a streamed response takes from its model and tier: the chunk shape, its
    per-token encoder, the progress tracker (a prediction from the length history)."""

    __slots__ = ("model", "tier", "shape", "piece", "progress")

    def __init__(self, gen: Any, gen_kind: str, include_usage: bool, streams: StreamManager,
                 model: str, tier: str) -> None:
        self.model, self.tier = model, tier
        self.shape = _shape(gen_kind, gen.id, model)
        self.piece = self.shape.encoder(include_usage)
        self.progress = streams.progress(gen, model, tier)


async def _sse(c: Completion, shape: _Shape, stream_id: str, include_usage: bool,
               progress: Progress | None = None,
               piece: Callable[[str, dict[str, Any] | None], str] | None = None,
               ) -> AsyncIterator[bytes]:
    seq = 0

    def ev(data: dict[str, Any] | str) -> bytes:
        nonlocal seq
        seq += 1
        return sse.event(stream_id, seq, data)

    if piece is None:  # the per-token chunk, without a dict or json.dumps
        piece = shape.encoder(include_usage)

    try:
        if isinstance(shape, _ChatShape):
            yield ev(shape.role(include_usage, None if progress is None else progress.advance(0)))
        async for chunk in c.chunks:
            if chunk.finish_reason == "error":
                yield ev({"error": {"message": chunk.error or "generation failed",
                                    "type": "server_error", "param": None, "code": None}})
                break
            if chunk.text:
                yield ev(piece(chunk.text, None if progress is None else progress.advance(chunk.tokens)))
            elif progress is not None:
                progress.advance(chunk.tokens)
            if chunk.finish_reason is not None:
                last: dict[str, Any] = {"timings": _ms(c)}
                if progress is not None:
                    last["progress"] = progress.finish()
                yield ev(shape.piece("", chunk.finish_reason, include_usage, redline=last))
        if include_usage and c.usage is not None:
            yield ev(shape.usage_chunk(c))
    except Exception as exc:  # a failure after streaming began: an error event, then DONE
        yield ev({"error": {"message": f"generation failed: {type(exc).__name__}",
                            "type": "server_error", "param": None, "code": None}})
    finally:
        # abandoned (closed early): close the chunks now, which frees the engine sequence
        await aclose(c.chunks)
    yield ev(sse.DONE)


def _ms(c: Completion) -> dict[str, float]:
    return {k: round(v * 1000, 2) for k, v in c.timings.seconds.items()}


def _usage(c: Completion) -> dict[str, int]:
    u = c.usage
    if u is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens}


_MARK = "\x00redline-text\x00"  # stands for the text while a template is made
_ID_MARK, _CREATED_MARK = "\x00redline-id\x00", "\x00redline-created\x00"  # and these for theirs
_TEMPLATES: dict[tuple[type, str, str, bool], tuple[str, str, str]] = {}
_MAX_TEMPLATES = 256  # one per shape, kind, model and include_usage: models are few
_ROLE_DELTA = {"role": "assistant", "content": ""}


def _progress_json(progress: dict[str, Any] | None) -> str:
    """`,"redline":{"progress":…}` as compact_json writes it (empty for None)."""
    if progress is None:
        return ""
    eta = progress["eta_ms"]
    return (f',"redline":{{"progress":{{"tokens":{progress["tokens"]},"expected_tokens":'
            f'{progress["expected_tokens"]},"eta_ms":{"null" if eta is None else eta}}}}}')


class _Shape:
    object_full = ""
    object_chunk = ""

    def __init__(self, gen_id: str, model: str) -> None:
        self.id = gen_id.replace("req-", "chatcmpl-" if isinstance(self, _ChatShape) else "cmpl-")
        self.model = model
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def _template(self, kind: str, include_usage: bool) -> tuple[str, str, str]:
        """A chunk's JSON in three parts, for this shape, model and include_usage (kept
        across streams): before the id, before `created`, and the rest without the
        closing brace ("redline" is the envelope's last key). `kind`: "piece" (a text
        chunk, its text `_MARK`) or "role" (chat's first chunk)."""
        key = (type(self), kind, self.model, include_usage)
        parts = _TEMPLATES.get(key)
        if parts is None:
            proto = type(self).__new__(type(self))
            proto.id, proto.created, proto.model = _ID_MARK, _CREATED_MARK, self.model  # type: ignore[assignment]
            data = (proto.piece(_MARK, None, include_usage) if kind == "piece"
                    else proto.delta(_ROLE_DELTA, None, include_usage))  # type: ignore[attr-defined]
            before_id, rest = sse.compact_json(data).split(json.dumps(_ID_MARK), 1)
            before_created, rest = rest.split(json.dumps(_CREATED_MARK), 1)
            parts = (before_id, before_created, rest[:-1])
            if len(_TEMPLATES) >= _MAX_TEMPLATES:
                _TEMPLATES.clear()
            _TEMPLATES[key] = parts
        return parts

    def _head(self, parts: tuple[str, str, str]) -> str:
        return f"{parts[0]}{json.dumps(self.id)}{parts[1]}{self.created}"

    def encoder(self, include_usage: bool) -> Callable[[str, dict[str, Any] | None], str]:
        """The JSON of `piece(text, None, include_usage, {"progress": progress})` for a
        non-empty text, made from a template: the envelope is encoded once per shape,
        model and include_usage, and each token costs one string escape (relaying
        tokens is most of a gateway's work)."""
        parts = self._template("piece", include_usage)
        before_text, tail = parts[2].split(json.dumps(_MARK), 1)
        head = self._head(parts) + before_text
        escape = json.dumps

        def encode(text: str, progress: dict[str, Any] | None) -> str:
            return f"{head}{escape(text)}{tail}{_progress_json(progress)}}}"

        return encode

    def usage_chunk(self, c: Completion) -> dict[str, Any]:
        out = self._envelope(self.object_chunk, [])
        out["usage"] = _usage(c)
        return out

    def piece(self, text: str, finish: str | None, include_usage: bool,
              redline: dict[str, Any] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def full(self, text: str, c: Completion) -> dict[str, Any]:
        raise NotImplementedError


class _ChatShape(_Shape):
    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"

    def delta(self, delta: dict[str, Any], finish: str | None, include_usage: bool,
              redline: dict[str, Any] | None = None) -> dict[str, Any]:
        out = self._envelope(self.object_chunk, [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])
        if include_usage:
            out["usage"] = None
        if redline:
            out["redline"] = redline
        return out

    def role(self, include_usage: bool, progress: dict[str, Any] | None) -> str:
        """The JSON of `delta(_ROLE_DELTA, None, include_usage, {"progress": progress})`
        (the stream's first chunk), from a template."""
        parts = self._template("role", include_usage)
        return f"{self._head(parts)}{parts[2]}{_progress_json(progress)}}}"

    def piece(self, text: str, finish: str | None, include_usage: bool,
              redline: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.delta({"content": text} if text else {}, finish, include_usage, redline)

    def full(self, text: str, c: Completion) -> dict[str, Any]:
        out = self._envelope(self.object_full, [{
            "index": 0, "message": {"role": "assistant", "content": text},
            "logprobs": None, "finish_reason": c.finish_reason or "stop"}])
        out["usage"] = _usage(c)
        return out


class _TextShape(_Shape):
    object_full = "text_completion"
    object_chunk = "text_completion"

    def piece(self, text: str, finish: str | None, include_usage: bool,
              redline: dict[str, Any] | None = None) -> dict[str, Any]:
        out = self._envelope(self.object_chunk, [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}])
        if include_usage:
            out["usage"] = None
        if redline:
            out["redline"] = redline
        return out

    def full(self, text: str, c: Completion) -> dict[str, Any]:
        out = self._envelope(self.object_full, [{
            "index": 0, "text": text, "logprobs": None,
            "finish_reason": c.finish_reason or "stop"}])
        out["usage"] = _usage(c)
        return out


__all__ = ["router", "Chunk"]
