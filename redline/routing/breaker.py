"""Circuit breakers per backend replica, one `CircuitBreaker` (redline/breaker.py) each:
`threshold` consecutive failures open a breaker, it refuses traffic for `ttl_s`, then lets
one probe through at a time and closes on its success. Only upstream faults count; a
user's bad request (InvalidRequest) or a cancelled call (a client left, a hedge lost) is
not a failure."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from redline.breaker import CircuitBreaker
from redline.errors import BackendError, InvalidRequest

# what ends a call without saying anything about the upstream's health
_NEUTRAL = (InvalidRequest, asyncio.CancelledError, GeneratorExit)


class Breakers:
    def __init__(self, threshold: int = 5, ttl_s: float = 10.0,
                 on_change: Callable[[str, bool], None] | None = None) -> None:
        self.threshold, self.ttl_s = threshold, ttl_s
        self._breakers: dict[str, CircuitBreaker] = {}
        self.on_change = on_change  # (name, now open): the backend_up gauge

    def of(self, name: str) -> CircuitBreaker:
        brk = self._breakers.get(name)
        if brk is None:
            brk = self._breakers[name] = CircuitBreaker(self.threshold, self.ttl_s)
        return brk

    def is_open(self, name: str) -> bool:
        """Open and not yet due for a try, or due and one probe already in flight."""
        brk = self._breakers.get(name)
        return brk is not None and brk.is_open

    def failed(self, name: str) -> None:
        """A call that had begun well failed later (an upstream that died mid-stream)."""
        brk = self.of(name)
        was_open = brk.opened_at is not None
        brk.failure()
        if self.on_change is not None and (brk.opened_at is not None) != was_open:
            self.on_change(name, True)

    def guard(self, name: str) -> _Guard:
        """Wrap the part of a call that decides success (up to the first token):
        `async with breakers.guard(name):`. Raises BackendError at once when the breaker
        is open."""
        return _Guard(self, name)


class _Guard:
    """Breakers.guard's context manager, as a class: it is on every request's path to
    its upstream, and @asynccontextmanager costs a generator and a wrapper per use."""

    __slots__ = ("breakers", "name", "brk", "was_open")

    def __init__(self, breakers: Breakers, name: str) -> None:
        self.breakers, self.name = breakers, name
        self.brk = breakers.of(name)
        self.was_open = False

    async def __aenter__(self) -> None:
        brk = self.brk
        self.was_open = brk.opened_at is not None
        if not brk.acquire():
            raise BackendError(f"{self.name}: circuit open")

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        brk = self.brk
        if exc is None:
            brk.success()
        elif isinstance(exc, _NEUTRAL):
            brk.release()
        else:
            brk.failure()
        now_open = brk.opened_at is not None
        if self.breakers.on_change is not None and now_open != self.was_open:
            self.breakers.on_change(self.name, now_open)
