"""Job records in Redis: shared by every server and `redline worker` on any machine.
Redis must persist (AOF or RDB) for jobs to outlive a Redis restart."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import redis

from redline.jobs.records import Txn, Write
from redline.store.base import StoreUnavailable

P = ParamSpec("P")
R = TypeVar("R")


def _unavailable(fn: Callable[P, R]) -> Callable[P, R]:
    """A Redis failure (down, paused past the timeout) is the store's 503 to whoever
    asked: a job not accepted, a read refused, never a 500 or a hang."""
    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except redis.RedisError as exc:
            raise StoreUnavailable("The job records are unavailable; retry shortly.",
                                   retry_after=1) from exc
    return call

PREFIX = "redline:jobs:"


class RedisRecords:
    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url = url
        # timeouts like the store's and the limiter's: a paused or unreachable Redis
        # fails the call in seconds (a 503), instead of holding a thread and a request
        self._r = redis.Redis.from_url(url, socket_connect_timeout=timeout_s,
                                       socket_timeout=timeout_s)

    def _k(self, key: str) -> str:
        return PREFIX + "kv:" + key

    def _i(self, name: str) -> str:
        return PREFIX + "idx:" + name

    @_unavailable
    def get(self, key: str) -> bytes | None:
        value = self._r.get(self._k(key))
        return None if value is None else bytes(value)  # type: ignore[arg-type]  # redis-py types replies loosely

    @_unavailable
    def put(self, key: str, value: bytes) -> None:
        self._r.set(self._k(key), value)

    @_unavailable
    def delete(self, key: str) -> None:
        self._r.delete(self._k(key))

    @_unavailable
    def transact(self, key: str, fn: Txn) -> Write | None:
        k = self._k(key)
        with self._r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(k)  # type: ignore[no-untyped-call]  # redis-py's pipeline is untyped
                    old = pipe.get(k)
                    write = fn(None if old is None else bytes(old))  # type: ignore[arg-type]  # as in get()
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

    @_unavailable
    def members(self, index: str) -> list[tuple[str, float]]:
        rows: Any = self._r.zrange(self._i(index), 0, -1, withscores=True)
        return _scored(rows)

    @_unavailable
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

    @_unavailable
    def count(self, index: str) -> int:
        n: Any = self._r.zcard(self._i(index))
        return int(n)

    def close(self) -> None:
        self._r.close()


def _scored(rows: list[tuple[bytes | str, float]]) -> list[tuple[str, float]]:
    return [(m.decode() if isinstance(m, bytes) else str(m), float(s)) for m, s in rows]
