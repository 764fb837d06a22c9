"""`MemoryStore`: state in this process only, LRU-bounded with per-key TTL (cachetools).

For one replica and for tests. Values, lists and hashes share one key space, as in
Redis; a key of the wrong kind raises `TypeError` (a programming error, not a user one).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from cachetools import TLRUCache

DEFAULT_MAX_KEYS = 100_000


@dataclass
class _Item:
    value: Any  # bytes | list[bytes] | dict[str, bytes]
    expires: float  # time.monotonic() deadline; inf = never


def _ttu(_key: str, item: _Item, _now: float) -> float:
    return item.expires


def _deadline(ttl: float | None) -> float:
    return math.inf if ttl is None else time.monotonic() + ttl


class MemoryStore:
    def __init__(self, url: str = "memory://", max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.url = url
        self._data: TLRUCache[str, _Item] = TLRUCache(maxsize=max_keys, ttu=_ttu,
                                                      timer=time.monotonic)

    def _get(self, key: str, kind: type) -> _Item | None:
        item = self._data.get(key)
        if item is not None and not isinstance(item.value, kind):
            raise TypeError(f"store key {key!r} holds a {type(item.value).__name__}")
        return item

    async def get(self, key: str) -> bytes | None:
        item = self._get(key, bytes)
        return None if item is None else bytes(item.value)

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        self._data[key] = _Item(bytes(value), _deadline(ttl))

    async def delete(self, key: str) -> None:
        self._data.pop(key, None)

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        item = self._get(key, bytes)
        if item is None:
            item = _Item(b"0", _deadline(ttl))
        n = int(item.value) + amount
        item.value = str(n).encode()
        self._data[key] = item
        return n

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        return await self.extend(key, [value], ttl)

    async def extend(self, key: str, values: list[bytes], ttl: float | None = None) -> int:
        item = self._get(key, list) or _Item([], _deadline(ttl))
        item.value.extend(bytes(v) for v in values)
        if ttl is not None:
            item.expires = _deadline(ttl)
        self._data[key] = item  # re-insert: refreshes LRU order and TTL
        return len(item.value)

    async def write_many(self, extends: list[tuple[str, list[bytes], float | None]],
                         sets: list[tuple[str, bytes, float | None]]) -> None:
        for key, values, ttl in extends:  # no await in between: one step of the loop
            await self.extend(key, values, ttl)
        for key, value, ttl in sets:
            await self.set(key, value, ttl)

    async def range(self, key: str, start: int = 0) -> list[bytes]:
        item = self._get(key, list)
        return [] if item is None else list(item.value[max(start, 0):])

    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        item = self._get(key, dict) or _Item({}, _deadline(ttl))
        item.value[field] = bytes(value)
        if ttl is not None:
            item.expires = _deadline(ttl)
        self._data[key] = item

    async def hgetall(self, key: str) -> dict[str, bytes]:
        item = self._get(key, dict)
        return {} if item is None else dict(item.value)

    async def hdel(self, key: str, field: str) -> None:
        item = self._get(key, dict)
        if item is not None:
            item.value.pop(field, None)
            if not item.value:
                self._data.pop(key, None)

    async def close(self) -> None:
        self._data.clear()
