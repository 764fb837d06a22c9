"""Counted leases in Redis: the per-tenant cap on concurrent generations, held across
replicas (api/slots.py uses it when the limits live in Redis).

One sorted set per owner, `slots:<who>`: member = a request id, score = when its lease
ends (Redis server time in ms, so the replicas' clocks do not matter). Taking a lease
drops the ended members and adds the new one only while fewer than `cap` remain, in one
script (atomic: two replicas cannot both take the last slot). The holder renews its
leases while the generation runs and removes each one when it ends; a replica that
crashes stops renewing, so its leases end within `ttl_s` and the slots come back.

Every failure to reach Redis raises `StoreUnavailable` (the caller fails open); after
one, a breaker answers at once for `BREAKER_S` instead of costing each request a connect.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis

from redline.breaker import CircuitBreaker
from redline.store.redis_store import guarded, ms

T = TypeVar("T")

TIMEOUT_S = 0.25  # an admission check that takes longer is not worth waiting for
BREAKER_S = 5.0
PREFIX = "slots:"

# KEYS[1] the owner's set; ARGV: ttl ms, cap, request id. 1: taken (or held already), 0: full
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[3])
   and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
"""

# KEYS: one owner's set per lease; ARGV[1] ttl ms, ARGV[1 + i] the request id of KEYS[i].
# XX: a lease released (or ended) meanwhile is not brought back.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + ttl, ARGV[i + 1])
  redis.call('PEXPIRE', key, ttl)
end
return #KEYS
"""


class RedisLeases:
    """`acquire`, `renew`, `release` and `count` of leases lasting `ttl_s` unless renewed."""

    def __init__(self, url: str, ttl_s: float) -> None:
        self.url, self.ttl_s = url, ttl_s
        self._r = aioredis.Redis.from_url(url, socket_timeout=TIMEOUT_S,
                                          socket_connect_timeout=TIMEOUT_S)
        self._acquire = self._r.register_script(_ACQUIRE)
        self._renew = self._r.register_script(_RENEW)
        self.breaker = CircuitBreaker(threshold=1, ttl_s=BREAKER_S)

    async def _call(self, aw: Awaitable[T]) -> T:
        return await guarded(self.breaker, "redis leases", aw)

    async def acquire(self, who: str, lease_id: str, cap: int) -> bool:
        """Take a lease for `lease_id` unless `who` holds `cap` live ones already."""
        taken: Any = await self._call(self._acquire(keys=[PREFIX + who],
                                                    args=[ms(self.ttl_s), cap, lease_id]))
        return bool(int(taken))

    async def renew(self, held: Sequence[tuple[str, str]]) -> None:
        """Extend each (who, lease id) still held by `ttl_s` from now, in one call."""
        if held:
            await self._call(self._renew(keys=[PREFIX + who for who, _ in held],
                                         args=[ms(self.ttl_s), *(rid for _, rid in held)]))

    async def release(self, who: str, lease_id: str) -> None:
        await self._call(self._r.zrem(PREFIX + who, lease_id))

    async def count(self, who: str) -> int:
        """`who`'s live leases (for tests and the operator: admission uses `acquire`)."""
        key = PREFIX + who
        pipe = self._r.pipeline(transaction=True)
        pipe.time()
        pipe.zrange(key, 0, -1, withscores=True)
        now_s, members = await self._call(pipe.execute())
        now_ms = now_s[0] * 1000 + now_s[1] // 1000
        return sum(1 for _, score in members if score > now_ms)

    async def close(self) -> None:
        await self._r.aclose()


__all__ = ["RedisLeases"]
