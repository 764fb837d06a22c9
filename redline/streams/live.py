"""The in-process side of one stream: the events produced so far, and the futures
that readers wait on. The producer appends; readers (HTTP responses, api/sse.py) only
read, each from its own position, so any number of them (the first client, its
resumes) can follow. Nothing here knows of a connection: a reader wakes for what came,
and its response writes it through the ASGI `send` like any other body."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from redline.types import Presence


class LiveStream:
    def __init__(self, stream_id: str, tenant: str = "anonymous",
                 presence: Presence | None = None) -> None:
        self.id = stream_id
        self.tenant = tenant
        # the request's flag: gone while nobody reads (the engine lets it yield its slot)
        self.presence = presence
        self.events: list[bytes] = []  # event seq N at index N-1
        self.done = False  # no more events will come
        self.aborted = False  # ended early: nobody came back within the grace period
        self.readers = 0
        self.left_at: float | None = None  # when the last reader went away
        self._waiters: list[asyncio.Future[None]] = []  # readers waiting for more
        self.producer: asyncio.Task[None] | None = None
        self.grace: asyncio.Task[None] | None = None
        self.detached = False  # a background run: goes on with no reader (never abandoned)
        # the journal's side (streams/manager.py writes it): events written so far, the
        # meta written, and True/False once the whole stream is journalled or failed
        self.journaled = 0
        self.wanted = False  # a reader on another replica follows it through the journal
        self.journal_opened = False
        self.journal_done: asyncio.Future[bool] | None = None

    # one event loop, no await between a check and a wait: plain futures, no lock
    # (an asyncio.Condition costs a lock round trip per event and per reader)
    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def push(self, event: bytes) -> None:
        self.events.append(event)
        self._wake()

    def end(self, aborted: bool = False) -> None:
        self.done = True
        self.aborted = aborted
        self._wake()

    async def follow(self, after: int,
                     left: Callable[[bool, bool], None] | None = None) -> AsyncIterator[bytes]:
        """One reader: the events with seq > `after` as they come, until the stream is
        done; whatever came since the last piece as one piece (the same bytes: a
        reader that woke late writes all it missed at once, in order). It counts as a
        reader while it runs; when it stops, `left(finished, last)` says whether it
        read to the end and whether it was the last reader."""
        self.join()
        finished = False
        try:
            i = after
            loop = asyncio.get_running_loop()
            while True:
                while i >= len(self.events) and not self.done:
                    waiter = loop.create_future()  # woken by the next push or the end
                    self._waiters.append(waiter)
                    await waiter
                n, done = len(self.events), self.done
                if n > i:
                    yield self.events[i] if n == i + 1 else b"".join(self.events[i:n])
                    i = n
                if done and i >= len(self.events):
                    finished = True
                    return
        finally:
            last = self.leave()
            if left is not None:
                left(finished, last)

    def join(self) -> None:
        self.readers += 1
        self.left_at = None
        if self.presence is not None:
            self.presence.gone = False
        if self.grace is not None:
            self.grace.cancel()
            self.grace = None

    def leave(self) -> bool:
        """Returns True when that was the last reader."""
        self.readers -= 1
        if self.readers == 0:
            self.left_at = time.monotonic()
            if self.presence is not None and not self.done:
                self.presence.gone = True
            return True
        return False

