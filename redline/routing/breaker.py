"""Circuit breakers per backend replica, on purgatory's state machine: `threshold`
consecutive failures open a breaker, it refuses traffic for `ttl_s`, then lets requests
through half-open and closes on the first success. Only upstream faults count; a user's
bad request (InvalidRequest) or a cancelled call (a client left, a hedge lost) is
not a failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType
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

    def guard(self, name: str) -> _Guard:
        """Wrap the part of a call that decides success (up to the first token):
        `async with breakers.guard(name):`. Raises BackendError at once when the breaker
        is open."""
        return _Guard(self, name)


class _Guard:
    """Breakers.guard's context manager, as a class: it is on every request's path to
    its upstream, and @asynccontextmanager costs a generator and a wrapper per use."""

    __slots__ = ("breakers", "name", "brk", "was_open", "probe")

    def __init__(self, breakers: Breakers, name: str) -> None:
        self.breakers, self.name = breakers, name
        self.brk: Any = None
        self.was_open = self.probe = False

    async def __aenter__(self) -> None:
        b, name = self.breakers, self.name
        brk = b._breakers.get(name)
        if brk is None:
            brk = b._breakers[name] = await b._factory.get_breaker(name)
        self.brk = brk
        self.was_open = brk.context.state == "opened"
        self.probe = brk.context.state != "closed" and name not in b._probing
        if self.probe:
            b._probing.add(name)
        try:
            await brk.__aenter__()
        except OpenedState as exc:
            self._settle()
            raise BackendError(f"{name}: circuit open") from exc
        except BaseException:
            self._settle()
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self.brk.__aexit__(exc_type, exc, tb)  # the failure that opens it raises
        except OpenedState as opened:
            raise BackendError(f"{self.name}: circuit open") from opened
        finally:
            self._settle()

    def _settle(self) -> None:
        b, name = self.breakers, self.name
        if self.probe:
            b._probing.discard(name)
        now_open = self.brk.context.state == "opened"
        if b.on_change is not None and now_open != self.was_open:
            b.on_change(name, now_open)
