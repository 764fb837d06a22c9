"""The in-process side of one stream: the events produced so far, and a condition
that readers wait on. The producer appends; HTTP responses only read, each from its
own position, so any number of them (the first client, its resumes) can follow.

Writing through: a reader that is the stream's only one, has caught up, and whose
connection can take a write at once (`write_now`, from the HTTP server) hands that
function to the stream and sleeps; the producer's `push` then writes each event to the
client itself. Per relayed token that saves the reader's task a wake-up and a trip
through the event loop (and the chain of generators between the two). The first write
the client cannot take at once (it reads slowly: its transport is paused), the end of
the stream, or the reader's leaving (cancelled) hands the events back to the reader,
which goes on from the last event written: none is lost or sent twice."""

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
        # writing through (see the module's docstring): the reader's write function,
        # how many events it has had, and the future that reader sleeps on
        self._through: Callable[[bytes], bool] | None = None
        self._through_at = 0
        self._through_waiter: asyncio.Future[None] | None = None
        self.producer: asyncio.Task[None] | None = None
        self.grace: asyncio.Task[None] | None = None
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
        if self._through is not None:
            try:
                written = self._through(event)
            except Exception:  # the connection broke: its reader finds out the regular way
                written = False
            if written:
                self._through_at = len(self.events)
            else:  # the client can't take it now: its reader sends it the regular way
                self._hand_back()
        self._wake()

    def end(self, aborted: bool = False) -> None:
        self.done = True
        self.aborted = aborted
        self._hand_back()
        self._wake()

    def _hand_back(self) -> None:
        self._through = None
        waiter, self._through_waiter = self._through_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _write_through(self, write_now: Callable[[bytes], bool], at: int) -> int:
        """Let the producer write the events after `at` (all there are so far) with
        `write_now` until it hands them back; returns how many events the client has."""
        self._through, self._through_at = write_now, at
        self._through_waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            if self._through_waiter is waiter:  # cancelled (the client left)
                self._through, self._through_waiter = None, None
        return self._through_at

    async def _more(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    async def read(self, after: int) -> AsyncIterator[bytes]:
        """Events with seq > `after`, as they come, until the stream is done."""
        async for batch in self.batches(after):
            for event in batch:
                yield event

    async def batches(self, after: int, through: WriteThrough | None = None,
                      ) -> AsyncIterator[list[bytes]]:
        """The same, as lists of whatever has come since the last one. `through`: this
        reader's way to write through (see the module's docstring), once it has one."""
        i = after
        while True:
            while i >= len(self.events) and not self.done:
                write_now = through.write_now if through is not None else None
                if write_now is not None and self.readers == 1 and self._through is None:
                    i = await self._write_through(write_now, i)
                else:
                    await self._more()
            batch = self.events[i:]
            done = self.done
            if batch:
                i += len(batch)
                yield batch
            if done and i >= len(self.events):
                return

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


class WriteThrough:
    """A reader's way to write through: its HTTP response offers the server's
    `write_now` once the response has started (api/sse.py, EventStream's `on_started`)."""

    __slots__ = ("write_now",)

    def __init__(self) -> None:
        self.write_now: Callable[[bytes], bool] | None = None

    def offer(self, write_now: Callable[[bytes], bool]) -> None:
        self.write_now = write_now
