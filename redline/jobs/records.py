"""Durable records for jobs, batches and files, with one atomic primitive.

Why not `redline.store.Store`: a job's state machine needs compare-and-set (claim a
queued job, finish only the attempt that holds the lease, send a notification once),
which the Store protocol does not offer. `transact` gives it on both backends: an
IMMEDIATE transaction on SQLite (the embedded default), WATCH/MULTI on Redis.

Indexes are ordered sets (name → member → score) written in the same transaction as
the record, so "which jobs are running" never disagrees with the records.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Write:
    """What a transaction writes: the new value, and index changes (score, or None to
    remove the member from that index)."""

    value: bytes
    indexes: dict[str, float | None] = field(default_factory=dict)


Txn = Callable[[bytes | None], Write | None]  # None: write nothing


class RecordStore(Protocol):
    url: str

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...

    def transact(self, key: str, fn: Txn) -> Write | None:
        """Read `key`, call `fn(old)`, write what it returns, atomically. `fn` may be
        called more than once (Redis retries on conflict): keep it pure."""
        ...

    def members(self, index: str) -> list[tuple[str, float]]:
        """Every member of `index`, lowest score first."""
        ...

    def page(self, index: str, limit: int, after: str | None = None) -> list[tuple[str, float]]:
        """Up to `limit` members of `index`, highest score first (newest first for a
        created_at index), starting after member `after` (none when `after` is not in
        the index). Costs the page, not the index: lists read one page of a tenant's
        index, never every record."""
        ...

    def count(self, index: str) -> int: ...

    def close(self) -> None: ...


def shared_secret(records: RecordStore, key: str) -> bytes:
    """A random key every process sharing `records` agrees on: made once by whichever
    comes first (a transaction, so two first comers cannot each keep their own)."""
    fresh = secrets.token_bytes(32)
    records.transact(key, lambda old: None if old is not None else Write(fresh))
    return records.get(key) or fresh


def open_records(url: str | None, sqlite_path: str, durable: bool = True,
                 timeout_s: float = 2.0) -> RecordStore:
    """redis://… or rediss://… share records between machines; anything else is SQLite.
    `durable`: SQLite fsyncs each commit; `timeout_s`: Redis connect and read timeout."""
    if url and url.startswith(("redis://", "rediss://", "unix://")):
        from redline.jobs.records_redis import RedisRecords

        return RedisRecords(url, timeout_s)
    from redline.jobs.records_sqlite import SQLiteRecords

    return SQLiteRecords(sqlite_path, durable)
