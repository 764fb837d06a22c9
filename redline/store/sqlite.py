"""`SQLiteStore`: the embedded default. One file (WAL), survives restart, and can be
shared by several processes on one machine.

All SQL runs on one dedicated thread that owns the connection, so the event loop never
blocks on disk and the connection is never shared between threads. Read-modify-write
operations (incr, append, hset) run in `BEGIN IMMEDIATE` transactions, which makes them
atomic across processes too. Expiry is wall-clock (`time.time()`) so it survives a
restart; expired keys are invisible at once and purged every `_PURGE_EVERY` writes.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from redline.store.base import StoreUnavailable

T = TypeVar("T")
_PURGE_EVERY = 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, value BLOB, n INTEGER NOT NULL DEFAULT 0,
    expires REAL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS keys_expires ON keys(expires) WHERE expires IS NOT NULL;
CREATE TABLE IF NOT EXISTS items (
    key TEXT NOT NULL, idx INTEGER NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (key, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fields (
    key TEXT NOT NULL, field TEXT NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (key, field)) WITHOUT ROWID;
"""


def _expires(ttl: float | None) -> float | None:
    return None if ttl is None else time.time() + ttl


class SQLiteStore:
    def __init__(self, path: str | Path, url: str | None = None) -> None:
        self.path = Path(path)
        self.url = url or f"sqlite:///{self.path}"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._db: sqlite3.Connection | None = None
        self._writes = 0

    # -- the store thread ------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            db.executescript(_SCHEMA)
            self._db = db
            self._purge(db)
        return self._db

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            return fn(self._conn())

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from exc

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def tx(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            self._writes += 1
            if self._writes % _PURGE_EVERY == 0:
                self._purge(db)
            return out

        return await self._run(tx)

    @staticmethod
    def _purge(db: sqlite3.Connection) -> None:
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM items WHERE key IN "
                   "(SELECT key FROM keys WHERE expires IS NOT NULL AND expires <= ?)", (now,))
        db.execute("DELETE FROM fields WHERE key IN "
                   "(SELECT key FROM keys WHERE expires IS NOT NULL AND expires <= ?)", (now,))
        db.execute("DELETE FROM keys WHERE expires IS NOT NULL AND expires <= ?", (now,))
        db.execute("COMMIT")

    @staticmethod
    def _drop(db: sqlite3.Connection, key: str) -> None:
        db.execute("DELETE FROM keys WHERE key = ?", (key,))
        db.execute("DELETE FROM items WHERE key = ?", (key,))
        db.execute("DELETE FROM fields WHERE key = ?", (key,))

    @classmethod
    def _live(cls, db: sqlite3.Connection, key: str, kind: str,
              purge: bool = False) -> tuple[bytes | None, int] | None:
        """(value, n) of a live key of `kind`; None when absent or expired (dropped
        when `purge`, i.e. inside a write transaction)."""
        row = db.execute("SELECT kind, value, n, expires FROM keys WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if row[3] is not None and row[3] <= time.time():
            if purge:
                cls._drop(db, key)
            return None
        if row[0] != kind:
            raise TypeError(f"store key {key!r} holds a {row[0]}, not a {kind}")
        return row[1], row[2]

    # -- plain values ----------------------------------------------------------
    async def get(self, key: str) -> bytes | None:
        def op(db: sqlite3.Connection) -> bytes | None:
            live = self._live(db, key, "value")
            return None if live is None else bytes(live[0] or b"")
        return await self._run(op)

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self._write(lambda db: self._set(db, key, value, ttl))

    @classmethod
    def _set(cls, db: sqlite3.Connection, key: str, value: bytes, ttl: float | None) -> None:
        cls._live(db, key, "value", purge=True)
        db.execute("INSERT OR REPLACE INTO keys (key, kind, value, n, expires) "
                   "VALUES (?, 'value', ?, 0, ?)", (key, bytes(value), _expires(ttl)))

    async def delete(self, key: str) -> None:
        await self._write(lambda db: self._drop(db, key))

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        def op(db: sqlite3.Connection) -> int:
            live = self._live(db, key, "value", purge=True)
            if live is None:
                db.execute("INSERT INTO keys (key, kind, value, n, expires) "
                           "VALUES (?, 'value', ?, 0, ?)", (key, str(amount).encode(), _expires(ttl)))
                return amount
            n = int(live[0] or b"0") + amount
            db.execute("UPDATE keys SET value = ? WHERE key = ?", (str(n).encode(), key))
            return n
        return await self._write(op)

    # -- lists -----------------------------------------------------------------
    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        return await self.extend(key, [value], ttl)

    async def extend(self, key: str, values: list[bytes], ttl: float | None = None) -> int:
        return await self._write(lambda db: self._extend(db, key, values, ttl))

    @classmethod
    def _extend(cls, db: sqlite3.Connection, key: str, values: list[bytes],
                ttl: float | None) -> int:
        live = cls._live(db, key, "list", purge=True)
        if live is None:
            db.execute("INSERT INTO keys (key, kind, n, expires) VALUES (?, 'list', 0, ?)",
                       (key, _expires(ttl)))
            n = 0
        else:
            n = live[1]
        db.executemany("INSERT INTO items (key, idx, value) VALUES (?, ?, ?)",
                       [(key, n + i, bytes(v)) for i, v in enumerate(values)])
        n += len(values)
        if ttl is None:
            db.execute("UPDATE keys SET n = ? WHERE key = ?", (n, key))
        else:
            db.execute("UPDATE keys SET n = ?, expires = ? WHERE key = ?",
                       (n, _expires(ttl), key))
        return n

    async def write_many(self, extends: list[tuple[str, list[bytes], float | None]],
                         sets: list[tuple[str, bytes, float | None]]) -> None:
        def op(db: sqlite3.Connection) -> None:
            for key, values, ttl in extends:
                self._extend(db, key, values, ttl)
            for key, value, ttl in sets:
                self._set(db, key, value, ttl)
        await self._write(op)

    async def range(self, key: str, start: int = 0) -> list[bytes]:
        def op(db: sqlite3.Connection) -> list[bytes]:
            if self._live(db, key, "list") is None:
                return []
            rows = db.execute("SELECT value FROM items WHERE key = ? AND idx >= ? ORDER BY idx",
                              (key, max(start, 0))).fetchall()
            return [bytes(r[0]) for r in rows]
        return await self._run(op)

    # -- hashes ----------------------------------------------------------------
    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        def op(db: sqlite3.Connection) -> None:
            if self._live(db, key, "hash", purge=True) is None:
                db.execute("INSERT INTO keys (key, kind, n, expires) VALUES (?, 'hash', 0, ?)",
                           (key, _expires(ttl)))
            elif ttl is not None:
                db.execute("UPDATE keys SET expires = ? WHERE key = ?", (_expires(ttl), key))
            db.execute("INSERT OR REPLACE INTO fields (key, field, value) VALUES (?, ?, ?)",
                       (key, field, bytes(value)))
        await self._write(op)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        def op(db: sqlite3.Connection) -> dict[str, bytes]:
            if self._live(db, key, "hash") is None:
                return {}
            rows = db.execute("SELECT field, value FROM fields WHERE key = ?", (key,)).fetchall()
            return {r[0]: bytes(r[1]) for r in rows}
        return await self._run(op)

    async def hdel(self, key: str, field: str) -> None:
        def op(db: sqlite3.Connection) -> None:
            if self._live(db, key, "hash", purge=True) is None:
                return
            db.execute("DELETE FROM fields WHERE key = ? AND field = ?", (key, field))
            if db.execute("SELECT 1 FROM fields WHERE key = ? LIMIT 1", (key,)).fetchone() is None:
                self._drop(db, key)
        await self._write(op)

    async def close(self) -> None:
        def shut(_: sqlite3.Connection | None = None) -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        finally:
            self._executor.shutdown(wait=True)
