"""`RedisStore`: state shared by every replica (redis.asyncio).

Each protocol method is one round trip; the ones that set a TTL alongside a write use a
MULTI/EXEC pipeline so the TTL can never be lost between two commands. Connection and
timeout failures become `StoreUnavailable`, so callers can fail open; after one, a
breaker (redline/breaker.py) answers `StoreUnavailable` at once for `BREAKER_S`, then lets
one call at a time try Redis, instead of trying it on every call (a dead or unreachable
Redis would otherwise cost each request a connect).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from redline.breaker import CircuitBreaker
from redline.store.base import StoreUnavailable

T = TypeVar("T")

BREAKER_S = 2.0


def ms(seconds: float) -> int:
    """A TTL in Redis's milliseconds (at least one)."""
    return max(1, int(seconds * 1000))


async def guarded(breaker: CircuitBreaker, what: str, aw: Awaitable[T]) -> T:
    """Await one Redis call behind `breaker`: open, it answers `StoreUnavailable` at once
    (and closes the never-awaited coroutine); a connection or timeout failure opens it; a
    command error proves Redis is up; a cancellation proves nothing."""
    if not breaker.acquire():
        if inspect.iscoroutine(aw):
            aw.close()
        raise StoreUnavailable(f"{what}: unavailable (breaker open)")
    try:
        result = await aw
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        breaker.failure()
        raise StoreUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
    except RedisError as exc:  # Redis answered (a command error): it is up
        breaker.success()
        raise StoreUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        breaker.release()
        raise
    breaker.success()
    return result


class RedisStore:
    def __init__(self, url: str) -> None:
        self.url = url
        # URL query parameters (e.g. ?socket_timeout=5) win over these defaults
        self._r = aioredis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=2.0,
                                          health_check_interval=30)
        # one failed connection opens it: a dead Redis fails each call fast after that
        self.breaker = CircuitBreaker(threshold=1, ttl_s=BREAKER_S)

    @property
    def available(self) -> bool:
        return not self.breaker.is_open

    async def _call(self, aw: Awaitable[T]) -> T:
        return await guarded(self.breaker, "redis store", aw)

    async def _tx(self, build: Callable[[Any], object]) -> list[Any]:
        """Run the commands that `build` queues on a MULTI/EXEC pipeline."""
        pipe = self._r.pipeline(transaction=True)
        build(pipe)
        return await self._call(pipe.execute())

    async def get(self, key: str) -> bytes | None:
        value = await self._call(self._r.get(key))
        return value.encode() if isinstance(value, str) else value  # bytes: no decode_responses

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self._call(self._r.set(key, value, px=None if ttl is None else ms(ttl)))

    async def delete(self, key: str) -> None:
        await self._call(self._r.delete(key))

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        if ttl is None:
            return int(await self._call(self._r.incrby(key, amount)))
        # create with the TTL only if absent, then add: the TTL is set exactly once
        out = await self._tx(lambda p: p.set(key, b"0", px=ms(ttl), nx=True).incrby(key, amount))
        return int(out[-1])

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        return await self.extend(key, [value], ttl)

    async def extend(self, key: str, values: list[bytes], ttl: float | None = None) -> int:
        if ttl is None:
            return int(await self._call(self._r.rpush(key, *values)))
        out = await self._tx(lambda p: p.rpush(key, *values).pexpire(key, ms(ttl)))
        return int(out[0])

    async def write_many(self, extends: list[tuple[str, list[bytes], float | None]],
                         sets: list[tuple[str, bytes, float | None]]) -> None:
        def build(p: Any) -> None:
            for key, values, ttl in extends:
                p.rpush(key, *values)
                if ttl is not None:
                    p.pexpire(key, ms(ttl))
            for key, value, ttl in sets:
                p.set(key, value, px=None if ttl is None else ms(ttl))
        if extends or sets:
            await self._tx(build)

    async def range(self, key: str, start: int = 0) -> list[bytes]:
        # no decode_responses: every reply is bytes (redis-py types them bytes | str)
        replies = cast("Awaitable[list[bytes]]", self._r.lrange(key, max(start, 0), -1))
        return list(await self._call(replies))

    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        if ttl is None:
            await self._call(self._r.hset(key, field, value))
        else:
            await self._tx(lambda p: p.hset(key, field, value).pexpire(key, ms(ttl)))

    async def hgetall(self, key: str) -> dict[str, bytes]:
        raw = await self._call(cast("Awaitable[dict[bytes, bytes]]", self._r.hgetall(key)))
        return {k.decode(): v for k, v in raw.items()}

    async def hdel(self, key: str, field: str) -> None:
        await self._call(self._r.hdel(key, field))

    async def ping(self) -> bool:
        return bool(await self._call(self._r.ping()))

    async def close(self) -> None:
        await self._r.aclose()
