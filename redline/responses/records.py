"""A stored response: the Response object as answered, its own input items, and the
items of the chain before it (so that a follow-up by `previous_response_id` reads one
record, on any replica that shares the store, and a deleted or expired ancestor does
not break a conversation that already went past it).

One key per response, `responses:<id>`, JSON, with the configured TTL; it belongs to
its tenant: a lookup by another tenant answers as if it did not exist."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from redline.store.base import Store

PREFIX = "responses:"


@dataclass(frozen=True)
class ResponseRecord:
    tenant: str
    response: dict[str, Any]  # the Response object, as the client got it
    input: list[dict[str, Any]]  # this response's input items (with their ids)
    context: list[dict[str, Any]]  # the items before them: the chain's inputs and outputs

    @property
    def id(self) -> str:
        return str(self.response["id"])

    def chain(self) -> list[dict[str, Any]]:
        """The items a follow-up continues from: everything before, then this turn's
        input and output (instructions are not carried over, as OpenAI defines)."""
        return [*self.context, *self.input, *self.response.get("output", ())]


class ResponseRecords:
    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s

    async def put(self, record: ResponseRecord) -> None:
        body = {"tenant": record.tenant, "response": record.response, "input": record.input,
                "context": record.context}
        await self.store.set(PREFIX + record.id, orjson.dumps(body), ttl=self.ttl_s)

    async def get(self, response_id: str, tenant: str) -> ResponseRecord | None:
        """The record, or None when unknown, expired, deleted or another tenant's."""
        body = await owned(self.store, PREFIX + response_id, tenant)
        if body is None:
            return None
        return ResponseRecord(body["tenant"], body["response"], body["input"], body["context"])

    async def delete(self, response_id: str, tenant: str) -> bool:
        if await self.get(response_id, tenant) is None:
            return False
        await self.store.delete(PREFIX + response_id)
        return True


async def owned(store: Store, key: str, tenant: str,
                loads: Callable[[bytes], Any] = orjson.loads) -> dict[str, Any] | None:
    """The JSON record at `key` (one with a `tenant`), or None when it is absent or
    another tenant's: to another tenant, a record answers as if it did not exist."""
    raw = await store.get(key)
    if raw is None:
        return None
    body: dict[str, Any] = loads(raw)
    return body if body.get("tenant") == tenant else None
