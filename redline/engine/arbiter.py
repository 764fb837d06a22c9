"""One budget for the cores: the local engines of a process take turns to step.

Each embedded engine steps a llama.cpp thread team sized to every core (one team for
all of them: their forward passes run on one compute thread, engine/compute.py). Two
teams stepping at once on the same cores do not share them gracefully: each step waits
at barriers for its slowest thread, and a thread preempted by the other team's holds
every thread of its own team, so both engines slow down by more than the 2× that
sharing costs. The arbiter lets one engine step at a time.

Fair by time, not by turn: among the engines waiting, the one that has had the least
core time (its virtual time, as in Linux's CFS) steps next, so a model in long prefill
steps does not make another's short decode steps wait one long step each. An engine
coming back from idle starts level with the others (no banked credit); one that just
stepped and is still behind its share keeps the turn for a moment (`grace_s`), because
it asks again only after handing its tokens out.

For the planner, `slowdown(member)` is what sharing costs that engine now: each engine
with work steps back to back, so with k others holding work it gets about 1/(k+1) of
the cores. An answer lasts seconds, and under a steady mixed load the others' work
comes and goes many times meanwhile, so the planner also wants what sharing cost over
the last `RECENT_S` seconds: from the share of the cores the others used
(`recent_slowdown`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(eq=False)
class Member:
    """One engine's place at the arbiter (only the arbiter changes its fields)."""

    name: str
    work: Callable[[], int]  # sequences queued or running in that engine
    vtime: float = 0.0  # core time had, seconds (caught up when it returns from idle)
    idle: bool = True  # had no work after its last step
    started: float = field(default=0.0, repr=False)  # its turn began, or was last charged
    recent_s: float = 0.0  # core time, decaying with RECENT_S (a moving rate's numerator)
    recent_at: float = 0.0  # when recent_s was last brought up to date (monotonic)


RECENT_S = 10.0  # the window of `recent_slowdown`: a few answers long


def _decayed(member: Member, now: float) -> float:
    return member.recent_s * math.exp(-max(0.0, now - member.recent_at) / RECENT_S)


def _share(members: list[Member]) -> float:
    """The share of the cores `members` used over the last RECENT_S seconds."""
    now = time.monotonic()
    return sum(_decayed(m, now) for m in members) / RECENT_S


class StepArbiter:
    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 grace_s: float = 0.002) -> None:
        self._clock = clock  # the core time each step is charged (injected by tests)
        self._grace_s = grace_s
        self._cond = threading.Condition()
        self._members: list[Member] = []
        self._waiting: list[Member] = []
        self._holder: Member | None = None
        self._reserved: Member | None = None  # keeps the turn until `_reserved_until`
        self._reserved_until = 0.0
        self.max_holders_seen = 0  # a check for tests: 1 unless two steps overlapped
        self._holders = 0

    # ---- membership -----------------------------------------------------------
    def join(self, name: str, work: Callable[[], int]) -> Member:
        member = Member(name, work)
        with self._cond:
            member.vtime = self._floor()
            self._members.append(member)
        return member

    def leave(self, member: Member) -> None:
        with self._cond:
            if member in self._members:
                self._members.remove(member)
            if self._reserved is member:
                self._reserved = None
            self._cond.notify_all()

    @property
    def members(self) -> list[Member]:
        return list(self._members)

    # ---- turns ----------------------------------------------------------------
    @contextmanager
    def turn(self, member: Member) -> Iterator[None]:
        """Hold the cores for one step of `member`'s engine."""
        self.acquire(member)
        try:
            yield
        finally:
            self.release(member)

    def acquire(self, member: Member) -> None:
        with self._cond:
            if member.idle:
                # back from idle: level with the others, not ahead of them by its idle time
                member.vtime = max(member.vtime, self._floor(exclude=member))
                member.idle = False
            self._waiting.append(member)
            while not self._may_go(member):
                self._cond.wait(timeout=self._wait_for())
            self._waiting.remove(member)
            self._holder = member
            if self._reserved is member:
                self._reserved = None
            self._holders += 1
            self.max_holders_seen = max(self.max_holders_seen, self._holders)
        member.started = self._clock()

    def charge(self, member: Member) -> None:
        """Count the core time `member` has had since its turn began (or since it was
        last charged) while it keeps the turn for more steps (`Engine._steps`): what it
        uses shows in `utilization` and the others' `recent_slowdown` as it goes, not
        only once it hands the turn on."""
        with self._cond:
            self._charge(member)

    def _charge(self, member: Member) -> None:
        now_clock = self._clock()
        took = max(0.0, now_clock - member.started)
        member.started = now_clock
        member.vtime += took
        now = time.monotonic()
        member.recent_s = _decayed(member, now) + took
        member.recent_at = now

    def release(self, member: Member) -> None:
        with self._cond:
            self._holders -= 1
            self._holder = None
            self._charge(member)
            rivals = [m.vtime for m in self._waiting]
            member.idle = member.work() == 0
            if rivals and member.vtime < min(rivals) and not member.idle:
                self._reserved = member  # still behind: its next step comes before theirs
                self._reserved_until = time.monotonic() + self._grace_s
            self._cond.notify_all()

    def contended(self, member: Member) -> bool:
        """Whether an engine other than `member` (which holds the turn) waits for it."""
        return any(m is not member for m in self._waiting)

    def _may_go(self, member: Member) -> bool:
        if self._holder is not None:
            return False
        reserved = self._reserved
        if reserved is not None and reserved is not member:
            if time.monotonic() < self._reserved_until:
                return False
            self._reserved = None  # it did not come back in time
        return member is min(self._waiting, key=lambda m: m.vtime)

    def _wait_for(self) -> float | None:
        if self._reserved is None:
            return None
        return max(0.0, self._reserved_until - time.monotonic()) + 1e-4

    def _floor(self, exclude: Member | None = None) -> float:
        """The least virtual time among engines that hold work now (0 if none)."""
        busy = [m.vtime for m in self._members
                if m is not exclude and (m is self._holder or m in self._waiting or m.work() > 0)]
        return min(busy) if busy else 0.0

    # ---- what sharing costs ---------------------------------------------------
    def slowdown(self, member: Member) -> float:
        """How much longer `member`'s work takes now than alone: k other engines with
        work queued or running each step back to back and take a fair share."""
        others = sum(1 for m in list(self._members) if m is not member and m.work() > 0)
        return 1.0 + others

    def utilization(self) -> float:
        """The share of the cores all engines used over the last RECENT_S seconds."""
        return min(1.0, _share(list(self._members)))

    def recent_slowdown(self, member: Member) -> float:
        """What sharing cost `member` over the last RECENT_S seconds: the others used a
        share U of the cores, so with fair turns it could have had at least 1 − U of them
        (never less than an equal share among the k + 1 engines)."""
        others = [m for m in list(self._members) if m is not member]
        if not others:
            return 1.0
        used = _share(others)
        k = len(others)
        return 1.0 / (1.0 - min(used, k / (k + 1)))
