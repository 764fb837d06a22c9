"""Stored chat completions, as OpenAI serves them: a chat completion asked with `store:
true` is kept once it is answered (streamed or not), with the request's messages and its
`metadata`, and read back by GET /v1/chat/completions (a list, filtered by `model` and
`metadata[key]=value`, paged by `after`, `limit` and `order`), GET, POST (its metadata) and
DELETE /v1/chat/completions/{id}, and GET /v1/chat/completions/{id}/messages. They live in
the one store (responses/completions.py), on every replica, with the stored responses'
TTL, and each belongs to its tenant: another key gets a 404.

A background job or a batch line is not stored (`store: true` there is a 400): what is
kept is what the route answered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from redline.api.chunks import ChunkEncoder
from redline.api.errors import validated
from redline.api.responses_routes import page
from redline.api.schemas import ChatCompletionRequest, Metadata
from redline.api.services import Services, services_of
from redline.api.tenant import tenant_of
from redline.api.tokenize_routes import read_json
from redline.closing import aclose
from redline.errors import NotFound
from redline.pipeline import Completion
from redline.responses import StoredCompletion, StoredCompletions
from redline.types import Chunk, GenerationRequest, assemble

router = APIRouter()


class UpdateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metadata: Metadata | None = Field(..., max_length=16)


def completions_of(services: Services) -> StoredCompletions:
    """Kept beside the stored responses: the same store, the same TTL."""
    return StoredCompletions(services.store, services.config.responses.ttl_s)


async def stored(services: Services, body: ChatCompletionRequest, gen: GenerationRequest,
                 c: Completion, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    """`chunks` (`c`'s), passed on; once the answer is whole, and before its last chunk
    goes out, it is kept as the ChatCompletion the route answers."""
    got: list[Chunk] = []
    try:
        async for chunk in chunks:
            got.append(chunk)
            if chunk.finish_reason is not None and chunk.finish_reason != "error":
                encoder = ChunkEncoder("chat", gen.id, c.model, legacy=gen.legacy_functions)
                completion = orjson.loads(encoder.full(assemble(got, gen.choices),
                                                       c.usage or chunk.usage,
                                                       chunk.finish_reason))
                messages = [m.model_dump(exclude_none=True) for m in body.messages]
                await completions_of(services).put(StoredCompletion(
                    gen.tenant, completion, messages, dict(body.metadata or {})))
            yield chunk
    finally:  # closed early, or failed: the chunks' own end frees the engine's sequence
        await aclose(chunks)


async def _stored_one(request: Request, completion_id: str) -> StoredCompletion:
    record = await completions_of(services_of(request.app)).get(completion_id,
                                                                tenant_of(request))
    if record is None:
        raise NotFound(f"No chat completion found with id '{completion_id}'.",
                       param="completion_id")
    return record


@router.get("/v1/chat/completions", response_model=None)
async def list_completions(request: Request) -> dict[str, Any]:
    query = request.query_params
    wanted = {k[len("metadata["):-1]: v for k, v in query.items()
              if k.startswith("metadata[") and k.endswith("]")}
    records = await completions_of(services_of(request.app)).listed(
        tenant_of(request), query.get("model"), wanted)
    return page([r.json() for r in records], query.get("limit", "20"),
                query.get("order", "asc"), query.get("after"), "your stored chat completions")


@router.get("/v1/chat/completions/{completion_id}", response_model=None)
async def retrieve(completion_id: str, request: Request) -> dict[str, Any]:
    return (await _stored_one(request, completion_id)).json()


@router.post("/v1/chat/completions/{completion_id}", response_model=None)
async def update(completion_id: str, request: Request) -> dict[str, Any]:
    body = validated(UpdateBody, await read_json(request))
    record = await _stored_one(request, completion_id)
    await completions_of(services_of(request.app)).update(record, body.metadata or {})
    return record.json()


@router.delete("/v1/chat/completions/{completion_id}", response_model=None)
async def delete(completion_id: str, request: Request) -> dict[str, Any]:
    record = await _stored_one(request, completion_id)
    await completions_of(services_of(request.app)).delete(record)
    return {"id": record.id, "object": "chat.completion.deleted", "deleted": True}


@router.get("/v1/chat/completions/{completion_id}/messages", response_model=None)
async def messages(completion_id: str, request: Request) -> dict[str, Any]:
    record = await _stored_one(request, completion_id)
    query = request.query_params
    rows = []
    for i, m in enumerate(record.messages):
        content = m.get("content")
        parts = content if isinstance(content, list) else None
        text = content if isinstance(content, str) else (
            "".join(p.get("text", "") for p in parts if isinstance(p, dict)) if parts else None)
        rows.append({**m, "id": f"{record.id}-{i}", "content": text, "content_parts": parts})
    return page(rows, query.get("limit", "20"), query.get("order", "asc"), query.get("after"),
                "this chat completion's messages")
