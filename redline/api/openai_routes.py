"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.types import Scope

from redline.api import capabilities, jobs_routes, sse, stream_takeover
from redline.api.chat_store_routes import stored
from redline.api.chunks import ChunkEncoder, Kind
from redline.api.embeddings import local_models
from redline.api.schemas import ChatCompletionRequest, CompletionRequest
from redline.api.services import Services, services_of
from redline.api.tenant import tenant_from
from redline.api.unicode import check_text
from redline.closing import aclose
from redline.errors import InvalidRequest, ModelNotFound
from redline.pipeline import Completion
from redline.routing.names import AUTO, parse_tier
from redline.streams import Progress, StreamManager
from redline.types import Chunk, assemble, new_id

router = APIRouter()


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


def _headers(c: Completion, request_id: str) -> dict[str, str]:
    return {"X-Request-Id": request_id, **c.headers(),
            "Server-Timing": c.timings.server_timing()}


def model_ids(services: Services) -> list[str]:
    """What /v1/models lists (and a key's allowlist may name): the configured models, the
    virtual `auto`, and the bundled embedders that are installed (POST /v1/embeddings,
    /rerank, /score)."""
    return [*services.pipeline.model_names(), AUTO, *local_models(services.config)]


def _model_objects(request: Request) -> list[dict[str, Any]]:
    """OpenAI's model objects for what this request's key may use."""
    services = services_of(request.app)
    created = int(services.started_at)
    names = model_ids(services)
    key = request.scope.get("state", {}).get("api_key")
    if key is not None and key.models is not None:  # a key sees the models it may use
        names = [n for n in names if n in key.models]
    caps = services.pipeline.router.capabilities
    served = [caps.of(n) for n in services.pipeline.model_names()]
    encoders = local_models(services.config)

    def capabilities(name: str) -> list[str]:
        """An addition to OpenAI's model object: what the model serves (a playground
        lists only chat models; a base model has no `chat`)."""
        if name in encoders:
            return ["embeddings", "rerank", "score"]
        if name == AUTO:  # it chooses among the models, each request what it needs
            return sorted(frozenset().union(*served))
        return sorted(caps.of(name))

    # vLLM's max_model_len: an embedded model's context per sequence (what a prompt and
    # its answer must fit); a remote model's is its engine's, which redline does not know
    contexts = {m.name: m.n_ctx for m in services.config.models if m.backend == "local"}

    def entry(n: str) -> dict[str, Any]:
        out = {"id": n, "object": "model", "created": created, "owned_by": "redline",
               "capabilities": capabilities(n)}
        if n in contexts:
            out["max_model_len"] = contexts[n]
        return out

    return [entry(n) for n in names]


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": _model_objects(request)}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    """One model object (OpenAI's `models.retrieve`); a model the key may not use is as
    unknown as one that is not configured."""
    for obj in _model_objects(request):
        if obj["id"] == model:
            return obj
    raise ModelNotFound(f"The model `{model}` does not exist.", param="model")


# a JSON body is served by the hot routes (api/hot.py) before these see it; these serve
# the rest (another content type) and describe the routes in /openapi.json
@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    check_text(body)  # Python's JSON parser keeps a lone surrogate: a 400 here, not a 500 later
    return await serve(services_of(request.app), request, body, "chat")


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    check_text(body)
    return await serve(services_of(request.app), request, body, "text")


async def serve(services: Services, request: Request,
                body: ChatCompletionRequest | CompletionRequest, gen_kind: Kind) -> Response:
    """Answer a completion request whose body has validated (from the hot routes,
    api/hot.py, or the FastAPI routes above), its text checked: pydantic-core's JSON
    parser (the hot routes) refuses lone surrogates, the routes above check for them."""
    asked = _request_headers(request.scope)
    gen = body.to_generation(
        parse_tier(asked.get(b"x-redline-tier") or body.tier),
        tenant_from(request.scope, asked.get(b"authorization", "")),
        "no-cache" in asked.get(b"cache-control", "").lower())
    session = asked.get(b"x-session-id")
    if session:  # replica placement keeps a session on one engine replica (backends/pool.py)
        if len(session) > 256:
            raise InvalidRequest("X-Session-ID is longer than 256 characters", param="X-Session-ID")
        gen.session = session
    capabilities.check(services.config, gen)  # n, the embedded engine's fields
    pipeline = services.pipeline
    await services.gate.check(request.scope, gen)  # a key's allowlist and budget, jobs too
    storing = isinstance(body, ChatCompletionRequest) and bool(body.store)
    if jobs_routes.wants_job(body, gen, pipeline):  # tier B or "background": 202 + a job
        return await jobs_routes.accept(request, body, gen, gen_kind)
    request_id = asked.get(b"x-request-id") or gen.id
    streams = services.streams
    # arm, cache, route plan (a 404 or a capability's 400 here): nothing sent yet
    prepared = await pipeline.prepare(gen)
    if prepared.would_miss and not storing:  # allow_background: a job beats a late first token
        response = await jobs_routes.accept(request, body, gen, gen_kind)
        response.headers["X-Redline-Degraded"] = "background"
        return response
    # after the plan, so a request refused by it holds no slot and no tokens; a job is
    # charged as it runs. The gate: a key's concurrent generations, then its tokens
    await services.gate.enter(request.scope, gen, checked=True)
    parts = (_StreamParts(gen, gen_kind, body.include_usage, streams, prepared.model, prepared.tier)
             if body.stream else None)
    completion = await pipeline.open(prepared)
    if storing:  # kept once whole (OpenAI's stored completions)
        assert isinstance(body, ChatCompletionRequest)
        completion.chunks = stored(services, body, gen, completion, completion.chunks)
    if parts is not None:
        if (parts.model, parts.tier) != (completion.model, completion.tier):  # a fallback
            parts = _StreamParts(gen, gen_kind, body.include_usage, streams, completion.model,
                                 completion.tier)
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
            await aclose(events)  # closes the chunks: frees the upstream or engine sequence
            raise
        if streams.cfg.journal_live:  # kept for another gateway, should this one die
            events = stream_takeover.kept(services, stream_id, stream_takeover.handed(
                body, gen, gen_kind, completion.model), events)
        live = streams.start(stream_id, events, tenant=gen.tenant, first=first,
                             presence=gen.presence)
        return sse.EventStream(streams.follow(live), headers=headers, first_ready=bool(first))
    encoder = ChunkEncoder(gen_kind, gen.id, completion.model, legacy=gen.legacy_functions)
    got = [chunk async for chunk in completion.chunks]
    payload = encoder.full(assemble(got, gen.choices), completion.usage,
                           completion.finish_reason or "stop")
    return Response(payload, media_type="application/json",
                    headers=_headers(completion, request_id))


class _StreamParts:
    """What a streamed response takes from its model and tier: the chunk encoder and the
    progress tracker (a prediction from the length history)."""

    __slots__ = ("model", "tier", "encoder", "progress")

    def __init__(self, gen: Any, gen_kind: Kind, include_usage: bool, streams: StreamManager,
                 model: str, tier: str) -> None:
        self.model, self.tier = model, tier
        self.encoder = ChunkEncoder(gen_kind, gen.id, model, include_usage,
                                    legacy=gen.legacy_functions)
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
        await aclose(c.chunks)
    yield ev(sse.DONE)


def _ms(c: Completion) -> dict[str, float]:
    return {k: round(v * 1000, 2) for k, v in c.timings.seconds.items()}


__all__ = ["router", "Chunk"]
