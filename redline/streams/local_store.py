"""A stand-in journal store for an app that has no `app.state.store`: in this
process only, with TTLs, just the calls the journal makes. The app's store
(memory, SQLite or Redis, see redline/store) replaces it whenever there is one."""

from __future__ import annotations

import time


class LocalJournalStore:
    url = "local://streams"

    def __init__(self) -> None:
        self._values: dict[str, tuple[object, float | None]] = {}

    def _live(self, key: str) -> object | None:
        item = self._values.get(key)
        if item is None:
            return None
        value, expires = item
        if expires is not None and expires <= time.monotonic():
            del self._values[key]
            return None
        return value

    def _sweep(self) -> None:
        now = time.monotonic()
        for key in [k for k, (_, exp) in self._values.items() if exp is not None and exp <= now]:
            del self._values[key]

    @staticmethod
    def _expiry(ttl: float | None) -> float | None:
        return None if ttl is None else time.monotonic() + ttl

    async def get(self, key: str) -> bytes | None:
        value = self._live(key)
        return value if isinstance(value, bytes) else None

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        if len(self._values) % 256 == 0:
            self._sweep()
        self._values[key] = (value, self._expiry(ttl))

    async def delete(self, key: str) -> None:
        self._values.pop(key, None)

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        items = self._live(key)
        if not isinstance(items, list):
            items = []
        items.append(value)
        self._values[key] = (items, self._expiry(ttl))
        return len(items)

    async def range(self, key: str, start: int = 0) -> list[bytes]:
        items = self._live(key)
        return list(items[start:]) if isinstance(items, list) else []

    async def close(self) -> None:
        self._values.clear()
