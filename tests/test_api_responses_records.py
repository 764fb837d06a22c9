"""Stored responses in the real stores (memory, SQLite): a record is its tenant's only,
expires after the configured time, and a deleted one is gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from redline.config import RedlineConfig
from redline.responses import ResponseRecord, ResponseRecords
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
