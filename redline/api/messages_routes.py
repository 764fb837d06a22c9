"""POST /v1/messages: Anthropic's Messages API (as vLLM, llama.cpp's server and LiteLLM
serve it), for clients built on Anthropic's SDK. The request becomes the same typed
request as a chat completion (api/anthropic.py), goes through the same pipeline
(cache, routing, capabilities), and the answer comes back as Anthropic's message or
its streaming events; errors in Anthropic's shape."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from redline.api import anthropic, capabilities
from redline.api.services import Services, services_of
from redline.api.tenant import tenant_from
from redline.api.tokenize_routes import chat_tokens, counted_model, local_backend, read_json
from redline.closing import aclose
from redline.errors import InvalidRequest, RedlineError
from redline.pipeline import Completion
from redline.types import Chunk, GenerationRequest, assemble

router = APIRouter()


def _error(status: int, message: str, retry_after: float | None = None) -> Response:
    return Response(orjson.dumps(anthropic.error_body(status, message)), status_code=status,
                    media_type="application/json", headers=anthropic.error_headers(retry_after))


def _invalid(exc: ValidationError) -> InvalidRequest:
    errors = exc.errors()
    where = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
    what = errors[0]["msg"] if errors else "invalid value"
    return InvalidRequest(f"{where}: {what}", param=where or None)


COUNTED = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking",
                     "context_management", "output_config", "cache_control"})


@router.post("/v1/messages/count_tokens", response_model=None)
async def count_tokens(request: Request) -> Response:
    """Anthropic's messages.count_tokens: the input tokens a message request's usage would
    report (its system prompt, its turns and its tools as the engine renders them) for a
    named model, before it is sent (api/tokenize_routes.py counts them)."""
    try:
        services = services_of(request.app)
        raw = await read_json(request)
        unknown = sorted(set(raw) - COUNTED)
        if unknown:
            raise InvalidRequest(f"{unknown[0]}: Extra inputs are not permitted",
                                 param=unknown[0])
        try:  # a message request that generates nothing: its max_tokens does not count
            body = anthropic.MessagesRequest.model_validate({**raw, "max_tokens": 1})
        except ValidationError as exc:
            raise _invalid(exc) from exc
        name = await counted_model(services, request, raw)  # a key's allowlist too
        gen = body.to_generation(None, tenant_from(request.scope, request.headers.get(
            "authorization", "")), True)
        capabilities.check(services.config, gen)  # what POST /v1/messages would refuse
        count = await chat_tokens(services, name, gen)
    except RedlineError as exc:
        return _error(exc.status, exc.message, exc.retry_after)
    return Response(orjson.dumps({"input_tokens": count}), media_type="application/json")


@router.post("/v1/messages", response_model=None)
async def messages(request: Request) -> Response:
    try:
        try:
            body = anthropic.MessagesRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise _invalid(exc) from exc
        headers = request.headers
        gen = body.to_generation(headers.get("x-redline-tier") or body.tier,
                                 tenant_from(request.scope, headers.get("authorization", "")),
                                 "no-cache" in headers.get("cache-control", "").lower())
        services = services_of(request.app)
        capabilities.check(services.config, gen)  # the model's capabilities: the router's
        await services.gate.enter(request.scope, gen)  # per-key limits
        pipeline = services.pipeline
        completion = await pipeline.complete(gen)
    except RedlineError as exc:  # a 429 or 503 says when to try again, as on the OpenAI routes
        return _error(exc.status, exc.message, exc.retry_after)
    msg_id = gen.id.replace("req-", "msg_")
    extra = {**completion.headers(), "request-id": msg_id}
    if body.stream:
        start = _input_tokens(services, completion, gen)
        return StreamingResponse(_events(msg_id, completion.model, completion, start),
                                 media_type="text/event-stream", headers=extra)
    got = [chunk async for chunk in completion.chunks]
    failed = next((c for c in got if c.finish_reason == "error"), None)
    if failed is not None:
        return _error(500, failed.error or "generation failed")
    return Response(anthropic.whole(msg_id, completion.model, assemble(got)[0], completion.usage),
                    media_type="application/json", headers=extra)


def _input_tokens(services: Services, c: Completion, gen: GenerationRequest) -> int:
    """What message_start says of the prompt, before it is generated from: its tokens where
    an embedded model generates (its own count, which its usage then reports; the prompt
    was tokenized for it already); 0 where that count arrives only with the answer (a
    remote engine's, a cached answer's), in message_delta."""
    backend = local_backend(services, c.model)
    if backend is None or c.cache in ("hit", "semantic"):
        return 0
    try:
        return len(backend.tokens_of(gen, False))
    except RedlineError:  # the stream reports what the engine refuses
        return 0


async def _events(msg_id: str, model: str, c: Completion,
                  input_tokens: int) -> AsyncIterator[bytes]:
    event = anthropic.event
    yield event("message_start", {"message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0}}})
    blocks = anthropic.Blocks()
    last: Chunk | None = None
    try:
        async for chunk in c.chunks:
            if chunk.finish_reason == "error":
                yield event("error", anthropic.error_body(500, chunk.error or "generation failed"))
                return
            for piece in blocks.add(chunk.reasoning, chunk.text, chunk.tool_calls):
                yield piece
            if chunk.finish_reason is not None:
                last = chunk
    except Exception as exc:  # after the stream began: an error event ends it
        yield event("error", anthropic.error_body(500, f"generation failed: {type(exc).__name__}"))
        return
    finally:
        await aclose(c.chunks)
    for piece in blocks.close():
        yield piece
    reason = last.finish_reason if last is not None else "stop"
    # the whole usage, as Anthropic's API sends it here (cumulative): message_start held
    # the prompt's count only where an embedded model answers, and the SDK takes
    # input_tokens from this event
    yield event("message_delta", {"delta": {"stop_reason": anthropic.STOP.get(reason or "stop"),
                                            "stop_sequence": None},
                                  "usage": anthropic.usage_json(c.usage)})
    yield event("message_stop", {})
