"""Stored chat completions (OpenAI's `store: true` on chat completions, and the routes
that read them back: list, retrieve, update metadata, delete, and a completion's
messages), in the one store, so that every replica sees them.

Two kinds of keys, with the stored responses' TTL: `chatcompletions:<id>` holds one
completion (the ChatCompletion object as answered, the request's messages, its metadata
and its tenant), and `chatcompletions:index:<tenant>` is a hash of the tenant's stored
completions (id -> model, metadata, when stored) for listing; it expires with the last of
them (every write starts its TTL again). A completion belongs to its tenant: a lookup by
another tenant answers as if it did not exist. A record is the standard library's JSON:
a client's message may hold an integer past 64 bits, which it keeps exactly."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from redline.responses.records import owned
from redline.store.base import Store

PREFIX = "chatcompletions:"


@dataclass
class StoredCompletion:
    tenant: str
    completion: dict[str, Any]  # the ChatCompletion object, as the client got it
    messages: list[dict[str, Any]]  # the request's messages, as sent
    metadata: dict[str, str]
    stored_at: float = field(default_factory=time.time)

    @property
    def id(self) -> str:
        return str(self.completion["id"])

    def json(self) -> dict[str, Any]:
        """As OpenAI's stored-completion routes answer it: the completion with its
        metadata."""
        return {**self.completion, "metadata": self.metadata}


class StoredCompletions:
    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s

    async def put(self, record: StoredCompletion) -> None:
        body = {"tenant": record.tenant, "completion": record.completion,
                "messages": record.messages, "metadata": record.metadata,
                "stored_at": record.stored_at}
        await self.store.set(PREFIX + record.id, json.dumps(body).encode(), ttl=self.ttl_s)
        entry = {"model": record.completion.get("model"), "metadata": record.metadata,
                 # the order of a list (created has a second's resolution); an update keeps it
                 "at": record.stored_at}
        await self.store.hset(self._index(record.tenant), record.id, orjson.dumps(entry),
                              ttl=self.ttl_s)

    async def get(self, completion_id: str, tenant: str) -> StoredCompletion | None:
        """The completion, or None when unknown, expired, deleted or another tenant's."""
        body = await owned(self.store, PREFIX + completion_id, tenant, json.loads)
        if body is None:
            return None
        return StoredCompletion(body["tenant"], body["completion"], body["messages"],
                                body.get("metadata") or {}, body.get("stored_at", 0.0))

    async def update(self, record: StoredCompletion, metadata: dict[str, str]) -> None:
        record.metadata = dict(metadata)
        await self.put(record)

    async def delete(self, record: StoredCompletion) -> None:
        await self.store.delete(PREFIX + record.id)
        await self.store.hdel(self._index(record.tenant), record.id)

    async def listed(self, tenant: str, model: str | None,
                     metadata: dict[str, str]) -> list[StoredCompletion]:
        """The tenant's stored completions, oldest first, of `model` (None: any) and with
        every `metadata` pair. One that expired drops out of the index at the next read."""
        index = await self.store.hgetall(self._index(tenant))
        rows = []
        for cid, raw in index.items():
            entry = orjson.loads(raw)
            if model is not None and entry.get("model") != model:
                continue
            have = entry.get("metadata") or {}
            if any(have.get(k) != v for k, v in metadata.items()):
                continue
            rows.append((entry.get("at", 0.0), cid))
        rows.sort()
        out = []
        for _, cid in rows:
            record = await self.get(cid, tenant)
            if record is None:  # expired on its own
                await self.store.hdel(self._index(tenant), cid)
                continue
            out.append(record)
        return out

    @staticmethod
    def _index(tenant: str) -> str:
        return f"{PREFIX}index:{tenant}"
