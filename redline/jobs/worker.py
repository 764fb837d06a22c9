"""The worker: takes job ids off the queue, claims each job, runs it under a lease it
keeps alive with heartbeats, records the one result, then notifies. The reaper finds
what crashes left behind: running jobs whose lease expired, queued jobs whose queue
entry was lost, notifications a dead process was sending. Any number of workers may
run at once (in the server, in `redline worker` processes): the job book's atomic
transitions make sure each job is finished, and announced, once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redline.config import JobsConfig
from redline.errors import Overloaded, RedlineError
from redline.jobs.batch import RunContext
from redline.jobs.book import JobBook
from redline.jobs.model import NOTIFY_INDEX, Job, Status
from redline.jobs.notify import Notifier
from redline.jobs.queue import JobQueue

log = logging.getLogger(__name__)

QUEUED_GRACE_S = 5.0  # a queued job this old, with the queue empty, lost its entry
REQUEUE_S = 300.0  # re-enqueue any queued job this old (its entry may be lost behind a backlog)


@dataclass
class Outcome:
    status: Status
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


Run = Callable[[Job, RunContext], Awaitable[Outcome]]


class Worker:
    def __init__(self, cfg: JobsConfig, book: JobBook, queue: JobQueue, notifier: Notifier,
                 run: Run, ready: Callable[[], bool]) -> None:
        self.cfg, self.book, self.queue, self.notifier = cfg, book, queue, notifier
        self.run, self.ready = run, ready
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.beat_s = min(cfg.lease_s / 3, 1.0)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[None]] = set()
        self._stopping = False

    def wake(self) -> None:
        """A job was just enqueued in this process: skip the poll wait."""
        self._wake.set()

    async def start(self) -> None:
        self.notifier.start()
        self._tasks = [asyncio.create_task(self._dispatch(), name="jobs-dispatch"),
                       asyncio.create_task(self._reap_forever(), name="jobs-reaper")]

    async def stop(self) -> None:
        """Stop taking jobs; jobs still running go back to the queue for the next worker."""
        self._stopping = True
        for t in [*self._tasks, *self._running]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._running, return_exceptions=True)
        await self.notifier.stop()

    # -- taking jobs ------------------------------------------------------------------
    async def _dispatch(self) -> None:
        slots = asyncio.Semaphore(self.cfg.concurrency)
        while True:
            await slots.acquire()
            job_id = None
            try:
                if self.ready():
                    job_id = await self.queue.pop()
            except Exception:  # the queue's store is down: back off, keep the worker alive
                log.exception("dequeue failed")
            if job_id is None:
                slots.release()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.cfg.poll_s)
                continue
            task = asyncio.create_task(self._execute(job_id))
            self._running.add(task)
            task.add_done_callback(self._done(slots))

    def _done(self, slots: asyncio.Semaphore) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            self._running.discard(task)
            slots.release()
        return done

    async def _execute(self, job_id: str) -> None:
        try:
            await self._execute_claimed(job_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("job %s: worker error", job_id)

    async def _execute_claimed(self, job_id: str) -> None:
        job = await self.book.claim(job_id, self.owner, self.cfg.lease_s, self.cfg.max_attempts)
        if job is None:  # someone else's, or final (maybe failed just now for max attempts)
            done = await self.book.get(job_id)
            if done is not None and done.final and done.notified:
                self.notifier.enqueue(done)
            return
        ctx = RunContext(job.attempts)
        work: asyncio.Task[Outcome] = asyncio.ensure_future(self.run(job, ctx))
        beat = asyncio.create_task(self._heartbeat(job, ctx, work))
        outcome: Outcome | None
        try:
            outcome = await work
        except asyncio.CancelledError:
            if ctx.lost:
                return  # the lease went to another worker: its result is the one
            if ctx.cancel.is_set() and not self._stopping:
                outcome = Outcome("cancelled")
            else:  # shutting down: give the job back
                beat.cancel()
                if await self.book.release(job_id, ctx.attempt, refund=True) is not None:
                    await self.queue.push(job_id)
                raise
        except Overloaded as exc:  # shed by admission control: try later, no attempt spent
            await asyncio.sleep(min(30.0, exc.retry_after or 1.0))
            if await self.book.release(job_id, ctx.attempt, refund=True) is not None:
                await self.queue.push(job_id)
            return
        except RedlineError as exc:
            error: Any = exc.to_dict()["error"]
            outcome = await self._failure(job, ctx, exc.status, error)
        except Exception as exc:
            log.exception("job %s failed", job_id)
            outcome = await self._failure(job, ctx, 500, {
                "message": f"the job failed: {type(exc).__name__}", "type": "server_error",
                "code": None, "param": None})
        finally:
            beat.cancel()
        if outcome is None:
            return
        final = await self.book.finish(job_id, ctx.attempt, outcome.status, outcome.result,
                                       outcome.error, outcome.meta, ctx.progress or None)
        if final is not None:
            self.notifier.enqueue(final)  # sent on the notifier's lanes, not in this slot

    async def _failure(self, job: Job, ctx: RunContext, status: int,
                       error: dict[str, Any]) -> Outcome | None:
        """Server errors are tried again (up to max_attempts); request errors fail at once."""
        if status >= 500 and ctx.attempt < self.cfg.max_attempts:
            await asyncio.sleep(min(30.0, 0.5 * 2 ** ctx.attempt))
            if await self.book.release(job.id, ctx.attempt) is not None:
                await self.queue.push(job.id)
            return None
        return Outcome("failed", error=error)

    async def _heartbeat(self, job: Job, ctx: RunContext, work: asyncio.Task[Outcome]) -> None:
        while True:
            await asyncio.sleep(self.beat_s)
            try:
                now = await self.book.heartbeat(job.id, ctx.attempt, self.cfg.lease_s,
                                                dict(ctx.progress) or None)
            except Exception:
                log.exception("job %s: heartbeat failed", job.id)
                continue
            if now is None:
                ctx.lost = True
                work.cancel()
                return
            if now.cancel_requested and not ctx.cancel.is_set():
                ctx.cancel.set()
                if job.kind != "batch":  # a batch stops itself and keeps its partial output
                    work.cancel()

    # -- what crashes left behind -------------------------------------------------
    async def _reap_forever(self) -> None:
        while True:
            try:
                await self.reap()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reaper pass failed")
            await asyncio.sleep(self.beat_s)

    async def reap(self) -> None:
        now = time.time()
        for job_id, _ in await self.book.ids("status:running"):
            if await self.book.release(job_id) is not None:  # only if its lease expired
                log.warning("job %s: its worker died; queued again", job_id)
                await self.queue.push(job_id)
        queued = await self.book.ids("status:queued")
        if queued:
            empty = await self.queue.size() == 0
            cutoff = now - (QUEUED_GRACE_S if empty else REQUEUE_S)
            for job_id, _ in queued:
                if await self.book.requeued(job_id, older_than=cutoff) is not None:
                    await self.queue.push(job_id)
        for job_id, _ in await self.book.ids(NOTIFY_INDEX):
            if self.notifier.busy(job_id):
                continue
            job = await self.book.get(job_id)
            if job is not None and job.final:
                self.notifier.enqueue(job)
