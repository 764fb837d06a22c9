"""Job records in Redis: shared by every server and `redline worker` on any machine.
Redis must persist (AOF or RDB) for jobs to outlive a Redis restart."""

from __future__ import annotations

from typing import Any

import redis

from redline.jobs.records import Txn, Write

PREFIX = "redline:jobs:"


class RedisRecords:
    def __init__(self, url: str) -> None:
        self.url = url
        self._r = redis.Redis.from_url(url)

    def _k(self, key: str) -> str:
        return PREFIX + "kv:" + key

    def _i(self, name: str) -> str:
        return PREFIX + "idx:" + name

    def get(self, key: str) -> bytes | None:
        value = self._r.get(self._k(key))
        return None if value is None else bytes(value)  # type: ignore[arg-type]

    def put(self, key: str, value: bytes) -> None:
        self._r.set(self._k(key), value)

    def delete(self, key: str) -> None:
        self._r.delete(self._k(key))

    def transact(self, key: str, fn: Txn) -> Write | None:
        k = self._k(key)
        with self._r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(k)  # type: ignore[no-untyped-call]
                    old = pipe.get(k)
                    write = fn(None if old is None else bytes(old))  # type: ignore[arg-type]
                    if write is None:
                        pipe.unwatch()
                        return None
                    pipe.multi()
                    pipe.set(k, write.value)
                    for name, score in write.indexes.items():
                        if score is None:
                            pipe.zrem(self._i(name), key)
                        else:
                            pipe.zadd(self._i(name), {key: score})
                    pipe.execute()
                    return write
                except redis.WatchError:
                    continue  # another writer won the race: read again

    def members(self, index: str) -> list[tuple[str, float]]:
        rows: Any = self._r.zrange(self._i(index), 0, -1, withscores=True)
        return _scored(rows)

    def page(self, index: str, limit: int, after: str | None = None) -> list[tuple[str, float]]:
        start = 0
        if after is not None:
            rank: Any = self._r.zrevrank(self._i(index), after)
            if rank is None:
                return []
            start = int(rank) + 1
        # equal scores come in reverse member order, as SQLite's `member desc`
        rows: Any = self._r.zrevrange(self._i(index), start, start + limit - 1, withscores=True)
        return _scored(rows)

    def count(self, index: str) -> int:
        n: Any = self._r.zcard(self._i(index))
        return int(n)

    def close(self) -> None:
        self._r.close()


def _scored(rows: list[tuple[bytes | str, float]]) -> list[tuple[str, float]]:
    return [(m.decode() if isinstance(m, bytes) else str(m), float(s)) for m, s in rows]
