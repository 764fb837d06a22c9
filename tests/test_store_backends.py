"""One behaviour, three stores: memory, a real SQLite file, a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from redline.store import Store, StoreUnavailable, open_store
from redline.store.memory import MemoryStore
from redline.store.sqlite import SQLiteStore


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        s = open_store("memory://")
    elif request.param == "sqlite":
        s = open_store(f"sqlite:///{tmp_path}/state.db")
    else:
        s = open_store(request.getfixturevalue("redis_url"))
    yield s
    await s.close()


async def test_values_roundtrip_and_delete(store: Store) -> None:
    assert await store.get("k") is None
    await store.set("k", b"v1")
    assert await store.get("k") == b"v1"
    await store.set("k", b"\x00\xffbinary")
    assert await store.get("k") == b"\x00\xffbinary"
    await store.delete("k")
    assert await store.get("k") is None
    await store.delete("never-set")  # no error


async def test_ttl_expires_values_lists_and_hashes(store: Store) -> None:
    # a TTL long enough that three writes on a busy machine (SQLite fsyncs each) cannot
    # outlast it before the first read
    await store.set("v", b"x", ttl=1.0)
    await store.append("l", b"a", ttl=1.0)
    await store.hset("h", "f", b"1", ttl=1.0)
    await store.set("forever", b"y")
    assert await store.get("v") == b"x"
    await asyncio.sleep(1.2)
    assert await store.get("v") is None
    assert await store.range("l") == []
    assert await store.hgetall("h") == {}
    assert await store.get("forever") == b"y"
    # an expired list starts again from empty
    assert await store.append("l", b"b") == 1


async def test_incr_is_atomic_and_sets_ttl_once(store: Store) -> None:
    assert await store.incr("n") == 1
    assert await store.incr("n", 5) == 6
    results = await asyncio.gather(*(store.incr("c", ttl=60) for _ in range(50)))
    assert sorted(results) == list(range(1, 51))
    assert await store.get("c") == b"50"
    await store.incr("short", ttl=0.2)
    await asyncio.sleep(0.1)
    await store.incr("short", ttl=0.2)  # does not extend the TTL set at creation
    await asyncio.sleep(0.15)
    assert await store.get("short") is None


async def test_lists_append_and_range(store: Store) -> None:
    assert await store.range("j") == []
    for i in range(5):
        assert await store.append("j", f"e{i}".encode()) == i + 1
    assert await store.range("j") == [b"e0", b"e1", b"e2", b"e3", b"e4"]
    assert await store.range("j", 3) == [b"e3", b"e4"]
    assert await store.range("j", 9) == []
    await store.delete("j")
    assert await store.range("j") == []


async def test_lists_extend_appends_many_in_order(store: Store) -> None:
    assert await store.append("j", b"a") == 1
    assert await store.extend("j", [b"b", b"c", b"d"], ttl=30) == 4
    assert await store.extend("j", [b"e"]) == 5
    assert await store.range("j") == [b"a", b"b", b"c", b"d", b"e"]
    assert await store.range("j", 2) == [b"c", b"d", b"e"]


async def test_write_many_extends_then_sets_in_one_write(store: Store) -> None:
    await store.extend("a", [b"1"], ttl=30)
    await store.write_many([("a", [b"2", b"3"], 30), ("b", [b"x"], 30)],
                           [("meta:a", b"3", 30), ("meta:b", b"1", None)])
    assert await store.range("a") == [b"1", b"2", b"3"] and await store.range("b") == [b"x"]
    assert await store.get("meta:a") == b"3" and await store.get("meta:b") == b"1"
    await store.write_many([], [])  # nothing to write is fine


async def test_hashes(store: Store) -> None:
    await store.hset("h", "a", b"1")
    await store.hset("h", "b", b"2")
    await store.hset("h", "a", b"3")
    assert await store.hgetall("h") == {"a": b"3", "b": b"2"}
    await store.hdel("h", "a")
    assert await store.hgetall("h") == {"b": b"2"}
    await store.hdel("h", "b")
    assert await store.hgetall("h") == {}


async def test_sqlite_survives_restart_and_is_shared(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.db"
    a = SQLiteStore(path)
    await a.set("k", b"kept")
    await a.append("l", b"x")
    b = SQLiteStore(path)  # a second process would open the file the same way
    assert await b.get("k") == b"kept"
    assert await b.append("l", b"y") == 2
    await a.close()
    await b.close()
    c = open_store(f"sqlite:///{path}")  # relative to / because path is absolute
    assert await c.range("l") == [b"x", b"y"]
    await c.close()
    mode = __import__("sqlite3").connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


async def test_memory_store_is_lru_bounded() -> None:
    s = MemoryStore(max_keys=3)
    for k in "abcd":
        await s.set(k, b"1")
    assert await s.get("a") is None
    assert await s.get("d") == b"1"
    s2 = open_store("memory://?max_keys=2")
    assert isinstance(s2, MemoryStore) and s2._data.maxsize == 2


async def test_redis_unreachable_raises_store_unavailable() -> None:
    from conftest import free_port

    s = open_store(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(StoreUnavailable):
        await s.get("k")
    await s.close()


def test_open_store_rejects_unknown_urls() -> None:
    with pytest.raises(ValueError):
        open_store("mongodb://x")
    with pytest.raises(ValueError):
        open_store("sqlite://relative.db")
