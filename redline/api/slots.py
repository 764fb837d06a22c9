"""Generation slots: how many generations each owner (a key, a tenant, a client address)
has in flight, for the per-tenant cap `limits.max_concurrent` (api/gate.py).

`Slots` counts on this replica. `GenerationSlots` is what the gate uses: on its own it is
`Slots`; given leases in Redis (store/leases.py, when the limits live in Redis) the cap
is counted there, across replicas: each slot is a lease that this replica renews every
third of its ttl while the generation runs and removes when it ends, so the cap holds
for the whole deployment and a crashed replica's slots come back within the ttl. If
Redis cannot be reached the cap fails open to this replica's own count (as the rate
limits do): a request is never refused because the counter store is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from redline.store.base import StoreUnavailable
from redline.store.leases import RedisLeases

log = logging.getLogger(__name__)


class Slots:
    """Generations in flight per owner on this replica (request id -> since when)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.held: dict[str, dict[str, float]] = {}
        self.owner: dict[str, str] = {}  # request id -> whose slot

    def count(self, who: str) -> int:
        held = self.held.get(who, {})
        old = [rid for rid, since in held.items() if time.monotonic() - since > self.lease_s]
        for rid in old:
            self.release(rid)
        return len(held)

    def acquire(self, who: str, request_id: str, cap: int) -> bool:
        if self.count(who) >= cap:
            return False
        self.hold(who, request_id)
        return True

    def hold(self, who: str, request_id: str) -> None:
        """Count it, whatever the cap (it was taken elsewhere: a lease)."""
        self.held.setdefault(who, {})[request_id] = time.monotonic()
        self.owner[request_id] = who

    def live(self) -> list[tuple[str, str]]:
        """(owner, request id) of every slot held, those past `lease_s` dropped first."""
        for who in list(self.held):
            self.count(who)
        return [(who, rid) for who, held in self.held.items() for rid in held]

    def release(self, request_id: str) -> str | None:
        """Give the slot back; whose it was (None: not held)."""
        who = self.owner.pop(request_id, None)
        if who is None:
            return None
        held = self.held.get(who)
        if held is not None:
            held.pop(request_id, None)
            if not held:
                del self.held[who]
        return who


class GenerationSlots:
    """`acquire` (async: it may ask Redis), `release` (from a pipeline observer: sync, the
    lease is removed in a task) and `close`."""

    def __init__(self, lease_s: float, leases: RedisLeases | None = None) -> None:
        """`lease_s`: a slot whose end is never reported is dropped after it (and its
        lease, no longer renewed, ends a ttl later)."""
        self.local = Slots(lease_s)
        self.leases = leases
        self.renewer: asyncio.Task[None] | None = None
        self.pending: set[asyncio.Task[None]] = set()

    async def acquire(self, who: str, request_id: str, cap: int) -> bool:
        if self.leases is None:
            return self.local.acquire(who, request_id, cap)
        try:
            taken = await self.leases.acquire(who, request_id, cap)
        except StoreUnavailable as exc:
            log.warning("concurrency leases unavailable (%s); counting on this replica", exc)
            return self.local.acquire(who, request_id, cap)
        if taken:
            self.local.hold(who, request_id)
            if self.renewer is None or self.renewer.done():
                self.renewer = asyncio.get_running_loop().create_task(self._renew_forever())
        return taken

    def release(self, request_id: str) -> None:
        who = self.local.release(request_id)
        if who is None or self.leases is None:
            return
        task = asyncio.get_running_loop().create_task(self._release(who, request_id))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _release(self, who: str, request_id: str) -> None:
        if self.leases is not None:
            with contextlib.suppress(StoreUnavailable):  # not removed: it ends with its ttl
                await self.leases.release(who, request_id)

    async def _renew_forever(self) -> None:
        leases = self.leases
        if leases is None:
            return
        while True:
            await asyncio.sleep(leases.ttl_s / 3)
            held = self.local.live()
            if not held:
                return  # the next acquire starts it again
            try:
                await leases.renew(held)
            except StoreUnavailable as exc:
                log.warning("concurrency leases not renewed (%s)", exc)

    async def close(self) -> None:
        """Stop renewing and give back every lease still held (the generations end with
        the server)."""
        if self.renewer is not None:
            self.renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.renewer
        for _, rid in self.local.live():
            self.release(rid)
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)
        if self.leases is not None:
            await self.leases.close()


__all__ = ["GenerationSlots", "Slots"]
