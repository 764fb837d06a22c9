"""Streams decoupled from HTTP connections.

    POST /v1/chat/completions ─► start(): a producer task runs the encoded events
        ├─► LiveStream (this process; readers wait on a future)
        └─► Journal (the store; other replicas and finished streams read it), written
            by one task for all streams: every `journal_flush_s`, one write (a group
            commit: one transaction, one round trip, however many streams) opens the
            new streams' metas, and takes the events of those that finished (one
            segment each), of those that nobody reads here any more (their client
            left: a resume may come through another replica, which follows the
            journal) and of those that another replica asked for (Journal.want)
    every response ─► follow(): reads from a seq on, never touches generation

A stream whose client is still reading here is not journalled token by token: its
client has those events already, and a resume through this replica reads the live
buffer. Writing every event as it came was a third of the gateway's CPU at 64 streams
(a row per token in SQLite) and most of its p99 added TTFT. A resume through another
replica asks this one (the meta names it) to journal the stream as it goes, so it gets
the events within a group write even when this replica still thinks its client is
there (a half-open connection).

When the last reader of an unfinished stream goes away, generation goes on for
`resume_grace_s`; if nobody resumes by then (here, or on another replica that
shares the store) the producer is cancelled, which closes the chunk iterator and
frees the engine sequence, and the journal is dropped (a late resume gets 404).
With `resume_grace_s = 0` a disconnect cancels at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable

from redline.closing import aclose
from redline.config import StreamsConfig
from redline.errors import NotFound
from redline.store.base import Store, StoreUnavailable
from redline.store.memory import MemoryStore
from redline.streams.history import LengthHistory
from redline.streams.journal import Journal, StreamMeta, is_done
from redline.streams.live import LiveStream
from redline.streams.progress import Progress
from redline.streams.takeover import ALIVE_TTL_S, Handover
from redline.telemetry.metrics import Metrics
from redline.types import GenerationRequest, Presence

log = logging.getLogger(__name__)

READER_TTL_S = 3.0  # a remote follower refreshes its mark every READER_TTL_S / 3
# how often the owner reads which of its streams other replicas follow (a half-open first
# connection): a store round trip from the flusher, so not at each group write
WANTED_POLL_S = 0.2
POLL_MIN_S, POLL_MAX_S = 0.002, 0.05  # journal polling backoff for remote followers


class StreamManager:
    def __init__(self, cfg: StreamsConfig, metrics: Metrics,
                 store: Callable[[], Store | None] = lambda: None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self._store = store  # resolved late: the app may open or replace its store later
        self._fallback: Store | None = None
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{id(self):x}"
        self.live: dict[str, LiveStream] = {}
        self.history = LengthHistory()  # the app adds it to the pipeline's observers
        self._journaling: dict[str, LiveStream] = {}  # streams not yet wholly journalled
        self._flusher: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[bool] | None = None  # the group write in flight

    @property
    def journal(self) -> Journal:
        store = self._store()
        if store is None:
            if self._fallback is None:
                self._fallback = MemoryStore()  # an app without a store: this process only
            store = self._fallback
        return Journal(store, self.cfg.journal_ttl_s)

    def progress(self, request: GenerationRequest, model: str, tier: str) -> Progress | None:
        """The progress tracker for a stream about to start (None when turned off)."""
        if not self.cfg.progress:
            return None
        return Progress(self.history.predict(request, model, tier))

    # ---- producing ------------------------------------------------------------
    def start(self, stream_id: str, events: AsyncIterator[bytes],
              tenant: str = "anonymous", first: list[bytes] | None = None,
              detached: bool = False, presence: Presence | None = None) -> LiveStream:
        """Run `events` (the encoded SSE events of one completion) to the end, or until
        abandoned. Returns at once; read it with `follow`. `first`: events the caller
        already took from `events` (they are the stream's first ones). `detached`: it
        runs to its end whoever reads it (a background response), never abandoned.
        `presence`: the request's flag, set while nobody reads here (an engine lets such
        work yield)."""
        live = LiveStream(stream_id, tenant, presence)
        live.detached = detached
        for event in first or ():
            live.push(event)
        self.live[stream_id] = live
        live.journal_done = asyncio.get_running_loop().create_future()
        self._journaling[stream_id] = live
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_journal(), name="stream journal")
        live.producer = asyncio.create_task(self._produce(live, events), name=f"stream {stream_id}")
        return live

    async def _produce(self, live: LiveStream, events: AsyncIterator[bytes]) -> None:
        # the journal is written by the flusher task, following the live buffers:
        # readers here never wait on the store, and a slow store only delays the journal
        aborted = True
        try:
            async for event in events:
                live.push(event)
            aborted = False
        except asyncio.CancelledError:
            pass  # abandoned (grace over) or shutting down
        except Exception:  # the event source guards itself; this is a bug, not user input
            log.exception("stream %s: producer failed", live.id)
        finally:
            with contextlib.suppress(Exception):
                await aclose(events)  # frees the engine sequence if still running
            live.end(aborted=aborted)
            journaled = False
            if aborted:
                self._settle(live, False)
                if self._writing is not None:  # a write with its events may be in flight
                    await asyncio.gather(asyncio.shield(self._writing), return_exceptions=True)
                await self.journal.drop(live.id)
            elif live.journal_done is not None:
                journaled = (await asyncio.gather(asyncio.shield(live.journal_done),
                                                  return_exceptions=True))[0] is True
            # finished: later resumes replay from the journal; without a working
            # journal, keep the live copy until the journal TTL would have run out
            if aborted or journaled:
                self.live.pop(live.id, None)
            else:
                asyncio.get_running_loop().call_later(
                    self.cfg.journal_ttl_s, self.live.pop, live.id, None)

    @property
    def handover(self) -> Handover:
        return Handover(self.journal.store, self.cfg.journal_ttl_s)

    def adopt(self, stream_id: str, journaled: list[bytes], events: AsyncIterator[bytes],
              tenant: str) -> LiveStream:
        """Produce the rest of a stream whose gateway died (streams/takeover.py): its
        journalled events first (already in the store), then `events`, numbered on; the
        first group write names this replica its owner."""
        live = self.start(stream_id, events, tenant=tenant, first=journaled)
        live.journaled = len(journaled)
        return live

    def _settle(self, live: LiveStream, journaled: bool) -> None:
        self._journaling.pop(live.id, None)
        if live.journal_done is not None and not live.journal_done.done():
            live.journal_done.set_result(journaled)

    async def _flush_journal(self) -> None:
        """The group commit: while streams are being journalled, one write every
        `journal_flush_s` with the new events of the streams that need them (see the
        module's docstring); a new stream's first write opens its meta, a finished
        one's last write records its length."""
        loop = asyncio.get_running_loop()
        ask_every = max(self.cfg.journal_flush_s, WANTED_POLL_S)
        next_ask = next_beat = 0.0
        while self._journaling:
            if self.cfg.journal_live and loop.time() >= next_beat:  # alive: nobody takes over
                next_beat = loop.time() + ALIVE_TTL_S / 3
                await self.handover.beat(self.owner)
            if loop.time() >= next_ask:  # a store round trip: not at every group write
                next_ask = loop.time() + ask_every
                for stream_id in await self.journal.take_wanted(self.owner):
                    wanted = self._journaling.get(stream_id)
                    if wanted is not None:
                        wanted.wanted = True
            appends: list[tuple[str, list[bytes]]] = []
            metas: list[tuple[str, StreamMeta]] = []
            taken: list[tuple[LiveStream, int, bool]] = []
            for live in list(self._journaling.values()):
                finished = live.done and not live.aborted
                # a stream read here is journalled when it ends (one segment); one that
                # nobody reads here any more (its client left, maybe to resume on
                # another replica), or that another replica follows, as it goes
                going = live.left_at is not None or live.wanted or self.cfg.journal_live
                n = len(live.events) if finished or going else live.journaled
                if n > live.journaled:
                    appends.append((live.id, live.events[live.journaled:n]))
                if finished:
                    metas.append((live.id, StreamMeta(live.tenant, self.owner, n)))
                elif not live.journal_opened:
                    metas.append((live.id, StreamMeta(live.tenant, self.owner)))
                if n > live.journaled or finished or not live.journal_opened:
                    taken.append((live, n, finished))
            if taken:
                self._writing = asyncio.get_running_loop().create_future()
                try:
                    ok = await self.journal.commit(appends, metas)
                except Exception:  # a bug, not the store (that fails open in commit)
                    log.exception("stream journal: group write failed")
                    ok = False
                finally:
                    self._writing.set_result(True)
                    self._writing = None
                for live, n, finished in taken:
                    if live.aborted:
                        continue
                    if not ok:
                        self._settle(live, False)  # fails open: resume from the live copy
                        continue
                    live.journaled, live.journal_opened = n, True
                    if finished:
                        self._settle(live, True)
            await asyncio.sleep(self.cfg.journal_flush_s)

    # ---- reading --------------------------------------------------------------
    async def open(self, stream_id: str, after: int,
                   tenant: str = "anonymous") -> AsyncIterator[bytes]:
        """A resume: the events after `after`, then live ones, then [DONE].
        Raises NotFound for an unknown, expired or abandoned stream, and for one of
        another tenant (whose existence is not revealed)."""
        live = self.live.get(stream_id)
        if live is not None and not live.aborted:
            known = live.tenant == tenant
        else:
            live = None
            try:
                meta = await self.journal.meta(stream_id)
            except StoreUnavailable:
                meta = None
            known = meta is not None and meta.tenant == tenant
        if not known:
            raise NotFound(f"No stream with id '{stream_id}' (unknown, expired or abandoned).",
                           param="stream_id")
        self.metrics.stream_resumes.inc()
        if live is not None:
            return self.follow(live, after)
        return self._follow_journal(stream_id, after)

    def follow(self, live: LiveStream, after: int = 0) -> AsyncIterator[bytes]:
        """Follow a stream of this process (what came since the last write goes out as
        one write). Leaving early (the client went away) starts the grace period when
        it was the last reader."""
        return live.follow(after, functools.partial(self._left, live))

    def _left(self, live: LiveStream, finished: bool, last: bool) -> None:
        if not finished:  # left before the end (generation may be over)
            self.metrics.stream_interruptions.inc()
        if last and not live.done:
            self._abandon(live)

    def _abandon(self, live: LiveStream) -> None:
        if live.detached:
            return
        if self.cfg.resume_grace_s <= 0:
            if live.producer is not None:
                live.producer.cancel()
            return
        live.grace = asyncio.create_task(self._grace(live), name=f"grace {live.id}")

    async def _grace(self, live: LiveStream) -> None:
        """Cancel the producer once nobody has read for `resume_grace_s`, counting
        followers on other replicas (their mark in the store)."""
        grace = self.cfg.resume_grace_s
        last_seen = time.monotonic()
        journal = self.journal
        while True:
            await asyncio.sleep(max(0.0, min(grace, READER_TTL_S / 3, last_seen + grace - time.monotonic())))
            if live.done or live.readers:
                return
            if await journal.has_reader(live.id):
                last_seen = time.monotonic()
            elif time.monotonic() - last_seen >= grace:
                break
        log.info("stream %s: nobody resumed within %.1f s, aborting", live.id, grace)
        if live.producer is not None:
            live.producer.cancel()

    async def _follow_journal(self, stream_id: str, after: int) -> AsyncIterator[bytes]:
        """Follow a stream produced by another replica through the shared journal,
        until its [DONE] event (or until it stalls or is dropped)."""
        journal = self.journal
        seq = after
        poll = POLL_MIN_S
        last_event = last_mark = time.monotonic()
        await journal.mark_reader(stream_id, READER_TTL_S)
        finished = False
        try:
            meta = await journal.meta(stream_id)
            if _past_end(meta, seq):
                finished = True  # nothing after `after`: the [DONE] event is behind it
                return
            if meta is not None and meta.events is None:
                await journal.want(meta.owner, stream_id)  # its owner: journal it as it goes
            segment, skip = 0, seq  # the journal's segments read; events still before `after`
            while True:
                events, segment = await journal.tail(stream_id, segment)
                if skip:
                    cut = min(skip, len(events))
                    events, skip = events[cut:], skip - cut
                now = time.monotonic()
                for event in events:
                    seq += 1
                    yield event
                    if is_done(event):
                        finished = True
                        return
                if events:
                    poll, last_event = POLL_MIN_S, now
                    continue
                if now - last_mark >= READER_TTL_S / 3:
                    last_mark = now
                    await journal.mark_reader(stream_id, READER_TTL_S)
                    meta = await journal.meta(stream_id)
                    if _past_end(meta, seq):
                        finished = meta is not None  # else abandoned by its producer
                        return
                if now - last_event > self.cfg.follow_stall_s:
                    log.warning("stream %s: no event for %.0f s, giving up", stream_id,
                                self.cfg.follow_stall_s)
                    return
                await asyncio.sleep(poll)
                poll = min(POLL_MAX_S, poll * 2)
        finally:
            if not finished:
                self.metrics.stream_interruptions.inc()

    async def close(self) -> None:
        """Shutting down: abort what is still generating."""
        tasks = [live.producer for live in self.live.values() if live.producer is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)


def _past_end(meta: StreamMeta | None, seq: int) -> bool:
    """No event after `seq` will ever come: the stream is gone, or finished before it."""
    return meta is None or (meta.events is not None and seq >= meta.events)
