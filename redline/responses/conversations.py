"""Conversations of the Responses API (OpenAI's /v1/conversations), in the one store
(shared by every replica): a conversation is an ordered list of items (input messages,
output messages, function calls and their outputs) that a response given
`conversation` reads as its context and, once it has run, extends with its own input
and output items.

Two keys per conversation, with the stored responses' TTL, refreshed by every write
(a conversation in use does not expire; one left alone for that long does):
`conversations:<id>` (tenant, created_at, metadata, JSON) and `conversations:<id>:log`,
an append-only list of what happened to its items, in order: an item added, an item
deleted, or only a write that refreshed the TTL (so both keys expire together). Appends
from several replicas at once all land, in one order. A conversation belongs to
its tenant: a lookup by another tenant answers as if it did not exist."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from redline.responses.records import owned
from redline.store.base import Store
from redline.types import new_id

PREFIX = "conversations:"


def new_conversation_id() -> str:
    return new_id("conv").replace("-", "_")


@dataclass
class Conversation:
    id: str
    tenant: str
    created_at: int
    metadata: dict[str, str] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        """The Conversation object, as OpenAI answers it."""
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}


class Conversations:
    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s

    async def create(self, tenant: str, metadata: dict[str, str] | None,
                     items: list[dict[str, Any]]) -> Conversation:
        conversation = Conversation(new_conversation_id(), tenant, int(time.time()),
                                    dict(metadata or {}))
        # the log first: a conversation is never seen without its items
        await self._log(conversation.id, [{"item": i} for i in items] or [{"touched": True}])
        await self._put(conversation)
        return conversation

    async def get(self, conversation_id: str, tenant: str) -> Conversation | None:
        """The conversation, or None when unknown, expired, deleted or another tenant's."""
        body = await owned(self.store, PREFIX + conversation_id, tenant)
        if body is None:
            return None
        return Conversation(conversation_id, body["tenant"], body["created_at"],
                            body.get("metadata") or {})

    async def update(self, conversation: Conversation, metadata: dict[str, str]) -> None:
        conversation.metadata = dict(metadata)
        await self._log(conversation.id, [{"touched": True}])
        await self._put(conversation)

    async def delete(self, conversation: Conversation) -> None:
        """Deleted with its items (the responses that used it are kept, as OpenAI
        keeps them)."""
        await self.store.delete(PREFIX + conversation.id)
        await self.store.delete(self._key(conversation.id))

    async def items(self, conversation: Conversation) -> list[dict[str, Any]]:
        """Its items in order, the deleted ones left out."""
        out: dict[str, dict[str, Any]] = {}  # by id, in the order they were added
        for raw in await self.store.range(self._key(conversation.id)):
            entry = orjson.loads(raw)
            if "item" in entry:
                out.setdefault(entry["item"]["id"], entry["item"])
            elif "deleted" in entry:
                out.pop(entry["deleted"], None)
        return list(out.values())

    async def append(self, conversation_id: str, tenant: str,
                     items: list[dict[str, Any]]) -> bool:
        """Add items at its end; False (nothing added) when it is not the tenant's, or
        was deleted meanwhile."""
        return await self._write(conversation_id, tenant, [{"item": i} for i in items])

    async def delete_item(self, conversation_id: str, tenant: str, item_id: str) -> None:
        await self._write(conversation_id, tenant, [{"deleted": item_id}])

    async def _write(self, conversation_id: str, tenant: str,
                     entries: list[dict[str, Any]]) -> bool:
        body = await owned(self.store, PREFIX + conversation_id, tenant)
        if body is None:  # deleted (or expired): not brought back
            return False
        if entries:
            await self._log(conversation_id, entries)
            # its TTL from now, as stored (not a copy an update since has made stale)
            await self.store.set(PREFIX + conversation_id, orjson.dumps(body), ttl=self.ttl_s)
        return True

    async def _log(self, conversation_id: str, entries: list[dict[str, Any]]) -> None:
        await self.store.extend(self._key(conversation_id),
                                [orjson.dumps(e) for e in entries], ttl=self.ttl_s)

    async def _put(self, conversation: Conversation) -> None:
        body = {"tenant": conversation.tenant, "created_at": conversation.created_at,
                "metadata": conversation.metadata}
        await self.store.set(PREFIX + conversation.id, orjson.dumps(body), ttl=self.ttl_s)

    @staticmethod
    def _key(conversation_id: str) -> str:
        return f"{PREFIX}{conversation_id}:log"
