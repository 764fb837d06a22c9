"""Stored responses in the real stores (memory, SQLite): a record is its tenant's only,
expires after the configured time, and a deleted one is gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from redline.config import RedlineConfig
from redline.responses import Conversations, ResponseRecord, ResponseRecords
from redline.store import open_store


def _record(rid: str, tenant: str = "t1") -> ResponseRecord:
    return ResponseRecord(tenant, {"id": rid, "object": "response", "output": [
        {"type": "message", "id": "msg_2", "role": "assistant", "content": []}]},
        input=[{"type": "message", "id": "msg_1", "role": "user", "content": []}],
        context=[{"type": "function_call_output", "id": "fco_0", "call_id": "c", "output": "x"}])


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_records_belong_to_their_tenant_and_expire(kind: str, tmp_path: Path) -> None:
    async def run() -> None:
        store = open_store("memory://" if kind == "memory" else f"sqlite:///{tmp_path}/s.db")
        try:
            records = ResponseRecords(store, ttl_s=0.3)
            await records.put(_record("resp_a"))
            got = await records.get("resp_a", "t1")
            assert got is not None and got.response["id"] == "resp_a"
            assert [i["id"] for i in got.chain()] == ["fco_0", "msg_1", "msg_2"]
            assert await records.get("resp_a", "t2") is None
            assert not await records.delete("resp_a", "t2")  # another tenant's: untouched
            assert await records.get("resp_a", "t1") is not None
            await asyncio.sleep(0.6)
            assert await records.get("resp_a", "t1") is None  # expired
            await ResponseRecords(store, ttl_s=60).put(_record("resp_b"))
            assert await records.delete("resp_b", "t1")
            assert await records.get("resp_b", "t1") is None
        finally:
            await store.close()
    asyncio.run(run())


def test_the_expiry_is_configurable() -> None:
    assert RedlineConfig().responses.ttl_s == 30 * 24 * 3600
    assert RedlineConfig(responses={"ttl_s": 60}).responses.ttl_s == 60
    with pytest.raises(ValueError):
        RedlineConfig(responses={"ttl_s": 0})


def _msg(mid: str) -> dict[str, object]:
    return {"type": "message", "id": mid, "role": "user", "content": []}


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_conversations_belong_to_their_tenant_and_expire_unless_written(
        kind: str, tmp_path: Path) -> None:
    """A conversation's items in order, a deleted one left out; a write refreshes the
    whole conversation's TTL (its metadata and its items together); one left alone
    expires; one deleted is not brought back by a response that ends after it."""
    async def run() -> None:
        store = open_store("memory://" if kind == "memory" else f"sqlite:///{tmp_path}/c.db")
        try:
            conversations = Conversations(store, ttl_s=0.6)
            conv = await conversations.create("t1", {"k": "v"}, [_msg("m1")])
            assert await conversations.get(conv.id, "t2") is None
            assert await conversations.append(conv.id, "t1", [_msg("m2"), _msg("m3")])
            assert not await conversations.append(conv.id, "t2", [_msg("x")])  # not t2's
            await conversations.delete_item(conv.id, "t1", "m2")
            assert [i["id"] for i in await conversations.items(conv)] == ["m1", "m3"]
            for _ in range(3):  # writes, each within the TTL: kept past it in all
                await asyncio.sleep(0.3)
                await conversations.update(conv, {"k": "w"})
            got = await conversations.get(conv.id, "t1")
            assert got is not None and got.metadata == {"k": "w"}
            assert [i["id"] for i in await conversations.items(got)] == ["m1", "m3"]
            await asyncio.sleep(0.9)
            assert await conversations.get(conv.id, "t1") is None  # left alone: expired
            other = await conversations.create("t1", None, [])
            await conversations.delete(other)
            assert not await conversations.append(other.id, "t1", [_msg("late")])
            assert await conversations.get(other.id, "t1") is None
            assert await conversations.items(other) == []
        finally:
            await store.close()
    asyncio.run(run())
