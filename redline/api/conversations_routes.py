"""The Conversations API (OpenAI's /v1/conversations): a conversation's items kept by
redline, which a response given `conversation` continues and extends
(api/responses_run.py). POST /v1/conversations, GET/POST/DELETE
/v1/conversations/{id}, GET/POST /v1/conversations/{id}/items and GET/DELETE
/v1/conversations/{id}/items/{item_id}. Items take the shapes of the Responses API's
input items (messages with text and image parts, function calls and their outputs) and
are checked as its input is. Every conversation belongs to its tenant: another key gets
a 404 on every route, and in a response's `conversation`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from redline.api import responses_request as rq
from redline.api.errors import validated
from redline.api.responses_routes import page
from redline.api.responses_run import conversation_not_found
from redline.api.schemas import Metadata
from redline.api.services import services_of
from redline.api.tenant import tenant_of
from redline.api.tokenize_routes import read_json
from redline.errors import InvalidRequest, NotFound
from redline.responses import Conversation, Conversations

router = APIRouter()

MAX_ITEMS = 20  # items added by one request, as OpenAI takes them


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[Any] | None = Field(None, max_length=MAX_ITEMS)
    metadata: Metadata | None = Field(None, max_length=16)


class UpdateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metadata: Metadata = Field(..., max_length=16)


class ItemsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[Any] = Field(..., min_length=1, max_length=MAX_ITEMS)


def _conversations(request: Request) -> Conversations:
    """Kept beside the stored responses: the same store, the same TTL."""
    services = services_of(request.app)
    return Conversations(services.store, services.config.responses.ttl_s)


async def _conversation(request: Request, conversation_id: str) -> Conversation:
    conversation = await _conversations(request).get(conversation_id, tenant_of(request))
    if conversation is None:
        raise conversation_not_found(conversation_id)
    return conversation


def _include(request: Request) -> None:
    """`include` is checked as the Responses API checks it; what it adds is kept with
    the items already (the logprobs an answer was asked for) or is not served."""
    rq.check_include(request.query_params.getlist("include"))


def _new_items(raw: list[Any]) -> list[dict[str, Any]]:
    return rq.normalize(raw, field="items")


@router.post("/v1/conversations", response_model=None)
async def create(request: Request) -> dict[str, Any]:
    body = validated(CreateBody, await read_json(request))
    items = _new_items(body.items or [])
    conversation = await _conversations(request).create(tenant_of(request), body.metadata,
                                                        items)
    return conversation.json()


@router.get("/v1/conversations/{conversation_id}", response_model=None)
async def retrieve(conversation_id: str, request: Request) -> dict[str, Any]:
    return (await _conversation(request, conversation_id)).json()


@router.post("/v1/conversations/{conversation_id}", response_model=None)
async def update(conversation_id: str, request: Request) -> dict[str, Any]:
    body = validated(UpdateBody, await read_json(request))
    conversation = await _conversation(request, conversation_id)
    await _conversations(request).update(conversation, body.metadata)
    return conversation.json()


@router.delete("/v1/conversations/{conversation_id}", response_model=None)
async def delete(conversation_id: str, request: Request) -> dict[str, Any]:
    conversation = await _conversation(request, conversation_id)
    await _conversations(request).delete(conversation)
    return {"id": conversation.id, "object": "conversation.deleted", "deleted": True}


@router.get("/v1/conversations/{conversation_id}/items", response_model=None)
async def list_items(conversation_id: str, request: Request) -> dict[str, Any]:
    query = request.query_params
    _include(request)
    conversation = await _conversation(request, conversation_id)
    items = await _conversations(request).items(conversation)
    return page(items, query.get("limit", "20"), query.get("order", "desc"),
                query.get("after"), "this conversation")


@router.post("/v1/conversations/{conversation_id}/items", response_model=None)
async def add_items(conversation_id: str, request: Request) -> dict[str, Any]:
    _include(request)
    body = validated(ItemsBody, await read_json(request))
    items = _new_items(body.items)
    conversation = await _conversation(request, conversation_id)
    conversations = _conversations(request)
    held = {i["id"] for i in await conversations.items(conversation)}
    for i, item in enumerate(items):  # the conversation's, or one before it in this list
        if item["id"] in held:
            raise InvalidRequest(f"An item with id '{item['id']}' is already in this "
                                 "conversation.", param=f"items[{i}].id")
        held.add(item["id"])
    if not await conversations.append(conversation.id, conversation.tenant, items):
        raise conversation_not_found(conversation_id)  # deleted meanwhile
    return {"object": "list", "data": items, "first_id": items[0]["id"],
            "last_id": items[-1]["id"], "has_more": False}


async def _item(request: Request, conversation: Conversation,
                item_id: str) -> dict[str, Any]:
    for item in await _conversations(request).items(conversation):
        if item["id"] == item_id:
            return item
    raise NotFound(f"Item with id '{item_id}' not found in conversation "
                   f"'{conversation.id}'.", param="item_id")


@router.get("/v1/conversations/{conversation_id}/items/{item_id}", response_model=None)
async def retrieve_item(conversation_id: str, item_id: str,
                        request: Request) -> dict[str, Any]:
    _include(request)
    return await _item(request, await _conversation(request, conversation_id), item_id)


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}", response_model=None)
async def delete_item(conversation_id: str, item_id: str, request: Request) -> dict[str, Any]:
    """The item removed; the answer is the conversation, as OpenAI answers it."""
    conversation = await _conversation(request, conversation_id)
    await _item(request, conversation, item_id)
    await _conversations(request).delete_item(conversation.id, conversation.tenant, item_id)
    return conversation.json()
