"""The circuit breaker: one state machine for every remote dependency (an upstream
replica in routing/breaker.py, Redis in store/redis_store.py, the rate-limit counters in
api/limits.py).

    closed ──`threshold` consecutive failures──► open ──`ttl_s` later──► half-open
      ▲                                                                  │
      └──────────── the probe succeeds ◄── one probe at a time ◄─────────┘
                    (it fails: open again for `ttl_s`)

A caller asks `acquire()` before its call and reports `success()`, `failure()` or, for a
call that proved nothing (cancelled, a user's bad request), `release()`. Half-open lets
exactly one call through at a time: letting every request through, as a plain half-open
state does, makes a breaker flap under a steady error rate. Plain data and a clock: no
locks (one event loop), no I/O, so it sits below every layer that uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

State = Literal["closed", "open", "half-open"]


class CircuitBreaker:
    __slots__ = ("threshold", "ttl_s", "failures", "opened_at", "probing", "clock")

    def __init__(self, threshold: int = 5, ttl_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if threshold < 1 or ttl_s < 0:
            raise ValueError("a breaker needs threshold >= 1 and ttl_s >= 0")
        self.threshold, self.ttl_s, self.clock = threshold, ttl_s, clock
        self.failures = 0  # consecutive, while closed
        self.opened_at: float | None = None  # None: closed
        self.probing = False  # a half-open probe is in flight

    @property
    def state(self) -> State:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() >= self.opened_at + self.ttl_s else "open"

    @property
    def is_open(self) -> bool:
        """Would refuse a call now: open and not yet due, or due with its one probe out."""
        state = self.state
        return state == "open" or (state == "half-open" and self.probing)

    def acquire(self) -> bool:
        """May a call go now? A call let through half-open is the probe: the caller must
        end it with success(), failure() or release()."""
        state = self.state
        if state == "closed":
            return True
        if state == "open" or self.probing:
            return False
        self.probing = True
        return True

    def success(self) -> None:
        self.failures, self.opened_at, self.probing = 0, None, False

    def failure(self) -> None:
        self.probing = False
        if self.opened_at is not None:  # the probe failed (or a call from before it opened)
            self.opened_at = self.clock()
            return
        self.failures += 1
        if self.failures >= self.threshold:
            self.opened_at = self.clock()

    def release(self) -> None:
        """The call proved nothing either way: a probe's turn passes to the next call."""
        self.probing = False


__all__ = ["CircuitBreaker", "State"]
