"""The one place that knows where state lives.

Caches, stream journals, jobs metadata and rate-limit counters use only this
interface, never a driver. Three implementations: `MemoryStore` (in-process,
LRU + TTL), `SQLiteStore` (the embedded default, survives restart, WAL) and
`RedisStore` (shared by every replica). `open_store(url)` picks one by URL:
`memory://`, `sqlite:///path/to/file.db`, `redis://host:port/db`.

Keys are str, values bytes. TTLs are seconds (None = no expiry). Every method is
async. A store failure raises `StoreUnavailable` (callers fail open where they can).
"""

from __future__ import annotations

from typing import Protocol

from redline.errors import RedlineError


class StoreUnavailable(RedlineError):
    status = 503
    type = "overloaded_error"
    code = "store_unavailable"


class Store(Protocol):
    url: str

    # -- plain values ---------------------------------------------------------
    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        """Atomically add `amount`; the TTL is set when the key is created."""
        ...

    # -- append-only lists (stream journals) ----------------------------------
    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        """Append to the list at `key`; returns its new length. TTL refreshed."""
        ...

    async def extend(self, key: str, values: list[bytes], ttl: float | None = None) -> int:
        """Append several items in one write (one transaction, one round trip)."""
        ...

    async def range(self, key: str, start: int = 0) -> list[bytes]:
        """Items from index `start` (0-based) to the end; [] when the key is absent."""
        ...

    async def write_many(self, extends: list[tuple[str, list[bytes], float | None]],
                         sets: list[tuple[str, bytes, float | None]]) -> None:
        """List extends, then value sets, in one write (one transaction, one round trip):
        the stream journal's group commit of every stream's new events."""
        ...

    # -- hashes (a record with fields: vectors index, job meta) ----------------
    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None: ...

    async def hgetall(self, key: str) -> dict[str, bytes]: ...

    async def hdel(self, key: str, field: str) -> None: ...

    async def close(self) -> None: ...
