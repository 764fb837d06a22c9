"""Per-tenant rate limits on requests and tokens per window, with the `limits` library.

Requests are counted when they arrive (sliding-window counter: no burst at the window
edge). Tokens are counted when a completion ends, from its real usage, on a fixed
window: a fixed window's counter always adds the cost, so a request that overshoots
still fills the window (a sliding counter refuses the add and the tenant would never
be stopped). A request is admitted while its tenant's token window is not full.

Reservations (`reserve`, called once a completion request's body is read): the request's
`max_tokens` plus an estimate of its prompt is taken from the token window at admission,
atomically (the counter is added to first; an add that would overrun is taken back and
refused), and the unused part is returned when the completion ends, as OpenAI counts
it. So twenty requests admitted at once cannot overrun a small budget. A request that
fails before its first token keeps its reservation until the window rolls over.

Whose budget (`limit_key`): with API keys, the key's tenant; on an open server (no
keys), the client's address, for the request count and the tokens alike, so a client
that rotates bearer tokens (each a tenant of its own for the cache) gets no fresh budget.

Counters live in memory, or in Redis when `limits.storage_url` (or `store.url`) is
redis://, so replicas share them. The limiter fails open: if Redis errors, a breaker
(redline/breaker.py) opens and this replica counts in memory until Redis answers again; a
request is never refused because the counter store is down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from limits import RateLimitItem, RateLimitItemPerSecond
from limits.aio.strategies import (
    FixedWindowRateLimiter,
    RateLimiter,
    SlidingWindowCounterRateLimiter,
)
from limits.storage import storage_from_string
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from redline.api import anthropic
from redline.api.middleware import send_error
from redline.breaker import CircuitBreaker
from redline.config import ApiKey, LimitsConfig
from redline.errors import RateLimited
from redline.types import Finished

log = logging.getLogger(__name__)

REDIS_TIMEOUT_S = 0.25  # a counter that takes longer than this is not worth waiting for
BREAKER_TTL_S = 5.0


@dataclass(frozen=True)
class Quota:
    rpm: int | None
    tpm: int | None


@dataclass(frozen=True)
class Reservation:
    key: str  # whose window (see limit_key)
    tokens: int
    until: float  # the window's reset time: after it, there is nothing to give back


def limit_key(scope: Scope, keyed: bool) -> str:
    """Whose budget a request draws on: the key's tenant where keys are configured (a
    managed key with limits of its own: that key), else the client's address (an open
    server)."""
    if keyed:
        state = scope.get("state", {})
        key, key_id = state.get("api_key"), state.get("key_id")
        if key_id and key is not None and (key.rpm or key.tpm or key.max_concurrent):
            return "key:" + str(key_id)
        return str(state.get("tenant", "anonymous"))
    client = scope.get("client")
    return "addr:" + (str(client[0]) if client else "unknown")


def estimate_tokens(gen: Any) -> int:
    """What a request may cost: its max_tokens and ~4 characters a token of prompt."""
    chars = (sum(len(p) for p in gen.prompts or (gen.prompt or "",))
             + sum(len(m.content) for m in gen.messages or ()))
    ids = sum(len(p) for p in gen.prompt_ids)  # token-id prompts: their count is known
    return int(gen.sampling.max_tokens) + chars // 4 + ids + 1


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: float = 0.0
    message: str = ""
    headers: tuple[tuple[bytes, bytes], ...] = ()


def storage_url(config: LimitsConfig, store_url: str | None) -> str:
    url = config.storage_url or (store_url if store_url and store_url.startswith(("redis://",
                                                                                 "rediss://")) else None)
    if url is None or url.startswith("memory://"):
        return "async+memory://"
    return url if url.startswith("async+") else "async+" + url


class _Counters:
    """The two limiters over one storage."""

    def __init__(self, url: str) -> None:
        options: dict[str, Any] = {}
        if "redis" in url:
            options = {"implementation": "redispy", "socket_timeout": REDIS_TIMEOUT_S,
                       "socket_connect_timeout": REDIS_TIMEOUT_S}
        self.storage = storage_from_string(url, **options)
        self.requests: RateLimiter = SlidingWindowCounterRateLimiter(self.storage)
        self.tokens: RateLimiter = FixedWindowRateLimiter(self.storage)


class TenantLimiter:
    """Admission (`admit`) and token accounting (`charge`) for every tenant."""

    def __init__(self, config: LimitsConfig, keys: Sequence[ApiKey], store_url: str | None = None) -> None:
        self.window = config.window_s
        self.default = Quota(config.rpm, config.tpm)
        self.quotas = {k.name: Quota(k.rpm or config.rpm, k.tpm or config.tpm) for k in keys}
        self.url = storage_url(config, store_url)
        self.shared = _Counters(self.url)
        self.local = self.shared if self.url == "async+memory://" else _Counters("async+memory://")
        # one failure opens it; then the shared counters get one try at a time
        self.breaker = CircuitBreaker(threshold=1, ttl_s=BREAKER_TTL_S)
        self.pending: set[asyncio.Task[None]] = set()
        self.keyed = bool(keys)
        self.reserved: dict[str, Reservation] = {}  # request id → its reservation

    @property
    def enabled(self) -> bool:
        return any(q.rpm or q.tpm for q in (self.default, *self.quotas.values()))

    def quota(self, tenant: str) -> Quota:
        return self.quotas.get(tenant, self.default)

    def learn(self, scope: Scope) -> None:
        """A managed key's own limits, under its limit_key (they change only by rotation
        or a new key, so one entry per key, refreshed by each of its requests)."""
        state = scope.get("state", {})
        if state.get("key_id") and state.get("api_key") is not None:
            self.learn_key(str(state["key_id"]), state["api_key"])

    def learn_key(self, key_id: str, key: ApiKey) -> None:
        if key.rpm or key.tpm:
            self.quotas["key:" + key_id] = Quota(key.rpm or self.default.rpm,
                                                 key.tpm or self.default.tpm)

    def _item(self, amount: int) -> RateLimitItem:
        return RateLimitItemPerSecond(amount, self.window)

    def _counters(self) -> _Counters:
        if self.shared is self.local:
            return self.local
        return self.shared if self.breaker.acquire() else self.local

    def _settle(self, counters: _Counters, exc: BaseException | None) -> None:
        """Report a call on `counters` to the breaker (the local ones are not behind it)."""
        if counters is self.local:
            return
        if exc is None:
            self.breaker.success()
        elif isinstance(exc, Exception):
            if not self.breaker.is_open:
                log.warning("rate-limit store failed (%s); counting in memory for %.0f s",
                            type(exc).__name__, BREAKER_TTL_S)
            self.breaker.failure()
        else:  # cancelled: proved nothing
            self.breaker.release()

    @property
    def broken(self) -> bool:
        """Counting in memory now: the shared counters' breaker is open."""
        return self.breaker.opened_at is not None

    async def admit(self, tenant: str) -> Verdict:
        quota = self.quota(tenant)
        if not (quota.rpm or quota.tpm):
            return Verdict(True)
        counters = self._counters()
        try:
            verdict = await self._admit(counters, tenant, quota)
        except BaseException as exc:  # the counter store is down: fail open, count locally
            self._settle(counters, exc)
            if counters is self.local or not isinstance(exc, Exception):
                raise
            return await self._admit(self.local, tenant, quota)
        self._settle(counters, None)
        return verdict

    async def _admit(self, c: _Counters, tenant: str, quota: Quota) -> Verdict:
        headers: list[tuple[bytes, bytes]] = []
        if quota.tpm:
            item = self._item(quota.tpm)
            stats = await c.tokens.get_window_stats(item, "tok", tenant)
            headers += _headers("tokens", quota.tpm, stats.remaining, stats.reset_time)
            if stats.remaining <= 0:
                return _refused("tokens", quota.tpm, self.window, stats.reset_time, headers)
        if quota.rpm:
            item = self._item(quota.rpm)
            if not await c.requests.hit(item, "req", tenant):
                stats = await c.requests.get_window_stats(item, "req", tenant)
                headers += _headers("requests", quota.rpm, 0, stats.reset_time)
                return _refused("requests", quota.rpm, self.window, stats.reset_time, headers)
            stats = await c.requests.get_window_stats(item, "req", tenant)
            headers += _headers("requests", quota.rpm, stats.remaining, stats.reset_time)
        return Verdict(True, headers=tuple(headers))

    async def reserve(self, key: str, request_id: str, tokens: int) -> Verdict:
        """Take `tokens` from `key`'s token window now, or refuse (nothing taken)."""
        quota = self.quota(key)
        if not quota.tpm:
            return Verdict(True)
        self._forget_old()
        counters = self._counters()
        try:
            verdict = await self._reserve(counters, key, request_id, tokens, quota.tpm)
        except BaseException as exc:  # fail open, as admission does
            self._settle(counters, exc)
            if counters is self.local or not isinstance(exc, Exception):
                raise
            return await self._reserve(self.local, key, request_id, tokens, quota.tpm)
        self._settle(counters, None)
        return verdict

    async def _reserve(self, c: _Counters, key: str, request_id: str, tokens: int,
                       tpm: int) -> Verdict:
        item = self._item(tpm)
        if await c.tokens.hit(item, "tok", key, cost=tokens):
            stats = await c.tokens.get_window_stats(item, "tok", key)
            self.reserved[request_id] = Reservation(key, tokens, stats.reset_time)
            return Verdict(True)
        await _add(c, item, key, -tokens)
        stats = await c.tokens.get_window_stats(item, "tok", key)
        return _refused("tokens", tpm, self.window, stats.reset_time,
                        _headers("tokens", tpm, stats.remaining, stats.reset_time))

    async def settle(self, r: Reservation, used: int) -> None:
        """The completion ended having used `used` tokens: give back the rest of its
        reservation (or charge the overshoot), in the window it was taken from."""
        quota = self.quota(r.key)
        if not quota.tpm or used == r.tokens:
            return
        if used > r.tokens:
            await self.charge(r.key, used - r.tokens)
            return
        if time.time() >= r.until:
            return  # the window rolled over: its count is gone already
        item = self._item(quota.tpm)
        counters = self._counters()
        try:
            await _add(counters, item, r.key, used - r.tokens)
        except BaseException as exc:
            self._settle(counters, exc)
            if counters is self.local or not isinstance(exc, Exception):
                raise
            return
        self._settle(counters, None)

    def _forget_old(self) -> None:
        """Reservations of requests that failed before a first token never settle: drop
        them once their window is over (their count went with it)."""
        if len(self.reserved) < 1024:
            return
        now = time.time()
        for rid in [rid for rid, r in self.reserved.items() if r.until <= now]:
            del self.reserved[rid]

    async def count_request(self, key: str) -> Verdict:
        """One request against `key`'s request window only (its tokens are reserved)."""
        quota = self.quota(key)
        if not quota.rpm:
            return Verdict(True)
        counters = self._counters()
        item = self._item(quota.rpm)
        try:
            allowed = await counters.requests.hit(item, "req", key)
            stats = await counters.requests.get_window_stats(item, "req", key)
        except BaseException as exc:
            self._settle(counters, exc)
            if counters is self.local or not isinstance(exc, Exception):
                raise
            return await self.count_request(key)
        self._settle(counters, None)
        if allowed:
            return Verdict(True)
        return _refused("requests", quota.rpm, self.window, stats.reset_time, [])

    async def charge(self, tenant: str, tokens: int) -> None:
        quota = self.quota(tenant)
        if not quota.tpm or tokens <= 0:
            return
        counters = self._counters()
        try:
            await counters.tokens.hit(self._item(quota.tpm), "tok", tenant, cost=tokens)
        except BaseException as exc:
            self._settle(counters, exc)
            if counters is self.local or not isinstance(exc, Exception):
                raise
            await self.local.tokens.hit(self._item(quota.tpm), "tok", tenant, cost=tokens)
            return
        self._settle(counters, None)

    # -- a pipeline observer: charge each finished completion's tokens -----------------
    def on_finish(self, completion: Finished) -> None:
        usage = completion.usage
        tokens = usage.total_tokens if usage is not None else completion.output_tokens
        r = self.reserved.pop(completion.request.id, None)
        # reserved at admission: settle in the same budget; else (a job, a batch line)
        # charged to the tenant it runs for
        task = asyncio.get_running_loop().create_task(
            self.settle(r, tokens) if r is not None else self.charge(completion.request.tenant, tokens))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def close(self) -> None:
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)


async def _add(c: _Counters, item: RateLimitItem, key: str, amount: int) -> None:
    """Add `amount` (negative: give back) to `key`'s token window as it stands."""
    storage: Any = c.storage  # the async storage (storage_from_string's type is a union)
    await storage.incr(item.key_for("tok", key), item.get_expiry(), amount=amount)


def _headers(kind: str, limit: int, remaining: int, reset_time: float) -> list[tuple[bytes, bytes]]:
    # OpenAI's x-ratelimit-* headers; reset as seconds ("1.5s")
    reset = max(0.0, reset_time - time.time())
    return [(f"x-ratelimit-limit-{kind}".encode(), str(limit).encode()),
            (f"x-ratelimit-remaining-{kind}".encode(), str(max(0, remaining)).encode()),
            (f"x-ratelimit-reset-{kind}".encode(), f"{reset:.3g}s".encode())]


def _refused(kind: str, limit: int, window: int, reset_time: float,
             headers: list[tuple[bytes, bytes]]) -> Verdict:
    wait = max(0.001, reset_time - time.time())
    per = "min" if window == 60 else f"{window} s"
    unit = "RPM" if kind == "requests" else "TPM"
    msg = (f"Rate limit reached for {kind} per {per} ({unit}): Limit {limit}. "
           f"Please try again in {wait:.3g}s.")
    return Verdict(False, wait, msg, tuple(headers))


class RateLimit:
    """ASGI middleware: 429 + Retry-After on /v1/* when the tenant is over its quota;
    OpenAI's x-ratelimit-* headers on the answers it lets through."""

    def __init__(self, app: ASGIApp, limiter: TenantLimiter) -> None:
        self.app, self.limiter = app, limiter

    def applies(self, scope: Scope) -> bool:
        return scope["path"].startswith("/v1/") and self.limiter.enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.limiter.learn(scope)
        if scope["type"] != "http" or not self.applies(scope):
            await self.app(scope, receive, send)
            return
        admitted = await self.admit(scope, send)
        if admitted is not None:
            await self.app(scope, receive, admitted)

    async def admit(self, scope: Scope, send: Send) -> Send | None:
        """Charge the scope's tenant one request: None where it is over its quota (the
        429 is sent), else the `send` that adds the x-ratelimit-* headers."""
        verdict = await self.limiter.admit(limit_key(scope, self.limiter.keyed))
        if not verdict.allowed:
            err = RateLimited(verdict.message, retry_after=verdict.retry_after)
            if scope["path"].startswith("/v1/messages"):  # Anthropic's clients read its shape
                await anthropic.send_error(send, err, verdict.headers)
            else:
                await send_error(send, err, headers=list(verdict.headers))
            return None

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *verdict.headers]}
            await send(message)

        return with_headers


__all__ = ["Quota", "RateLimit", "Reservation", "TenantLimiter", "Verdict", "estimate_tokens",
           "limit_key", "storage_url"]
