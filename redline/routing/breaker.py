"""Circuit breakers per backend replica, on purgatory's state machine: `threshold`
consecutive failures open a breaker, it refuses traffic for `ttl_s`, then lets requests
through half-open and closes on the first success. Only upstream faults count; a user's
bad request (InvalidRequest) or a cancelled call (a client left, a hedge lost) is
not a failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from purgatory import AsyncCircuitBreakerFactory
from purgatory.domain.model import OpenedState

from redline.errors import BackendError, InvalidRequest


class Breakers:
    def __init__(self, threshold: int = 5, ttl_s: float = 10.0,
                 on_change: Callable[[str, bool], None] | None = None) -> None:
        self._factory = AsyncCircuitBreakerFactory(default_threshold=threshold, default_ttl=ttl_s,
                                                   exclude=[InvalidRequest, asyncio.CancelledError,
                                                            GeneratorExit])
        self.ttl_s = ttl_s
        self._breakers: dict[str, Any] = {}
        self._probing: set[str] = set()
        self.on_change = on_change

    def is_open(self, name: str) -> bool:
        """Open and not yet due for a try, or due and one probe already in flight
        (purgatory's half-open state would let every request through, and reopen on the
        first failure of any: under a steady error rate it flaps)."""
        brk = self._breakers.get(name)
        if brk is None:
            return False
        ctx = brk.context
        if ctx.state == "closed":
            return False
        due = ctx.state == "half-opened" or time.time() >= (ctx.opened_at or 0) + self.ttl_s
        return not due or name in self._probing

    @asynccontextmanager
    async def guard(self, name: str) -> AsyncIterator[None]:
        """Wrap the part of a call that decides success (up to the first token).
        Raises BackendError at once when the breaker is open."""
        brk = self._breakers.get(name)
        if brk is None:
            brk = self._breakers[name] = await self._factory.get_breaker(name)
        was_open = brk.context.state == "opened"
        probe = brk.context.state != "closed" and name not in self._probing
        if probe:
            self._probing.add(name)
        try:
            async with brk:
                yield
        except OpenedState as exc:
            raise BackendError(f"{name}: circuit open") from exc
        finally:
            if probe:
                self._probing.discard(name)
            now_open = brk.context.state == "opened"
            if self.on_change is not None and now_open != was_open:
                self.on_change(name, now_open)
