"""The job book: every state change of a job is one atomic transaction on its record
(see model.py for the states). Async methods run the store's calls on threads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from redline.jobs.model import NOTIFY_INDEX, STATUSES, Job, Status, tenant_index
from redline.jobs.records import RecordStore, Write

JOB = "job:"


def _key(job_id: str) -> str:
    return JOB + job_id


def _write(job: Job, old: Status | None) -> Write:
    idx: dict[str, float | None] = {}
    if old is not None and old != job.status:
        idx[f"status:{old}"] = None
    idx[f"status:{job.status}"] = job.created_at
    if job.kind == "batch":
        idx[tenant_index(job.tenant, "batches")] = job.created_at
    unsettled = any(s in ("pending", "sending") for s in job.notified.values())
    idx[NOTIFY_INDEX] = (job.finished_at or job.created_at) if unsettled else None
    return Write(job.dumps(), idx)


def _finalize(job: Job, status: Status, now: float) -> None:
    job.status = status
    job.finished_at = now
    job.owner = None
    job.lease_until = 0.0
    job.notified = {ch: "pending" for ch in job.notify}


class JobBook:
    def __init__(self, records: RecordStore) -> None:
        self.records = records

    async def _change(self, job_id: str, fn: Callable[[Job], bool]) -> Job | None:
        """Apply `fn` to the job atomically; `fn` returns False to write nothing.
        Returns the job as written, or None when nothing was written."""
        out: list[Job] = []

        def txn(raw: bytes | None) -> Write | None:
            out.clear()
            if raw is None:
                return None
            job = Job.loads(raw)
            old = job.status
            if not fn(job):
                return None
            out.append(job)
            return _write(job, old)

        write = await asyncio.to_thread(self.records.transact, _key(job_id), txn)
        return out[0] if write is not None and out else None

    async def create(self, job: Job) -> bool:
        """Store a new job; False if one with this id exists (scheduled runs dedupe so)."""
        def txn(raw: bytes | None) -> Write | None:
            return None if raw is not None else _write(job, None)

        return await asyncio.to_thread(self.records.transact, _key(job.id), txn) is not None

    async def get(self, job_id: str) -> Job | None:
        raw = await asyncio.to_thread(self.records.get, _key(job_id))
        return None if raw is None else Job.loads(raw)

    async def page(self, index: str, limit: int, after: str | None = None) -> list[str]:
        """Up to `limit` job ids of `index`, newest first, after job `after`."""
        rows = await asyncio.to_thread(self.records.page, index, limit,
                                       None if after is None else _key(after))
        return [k[len(JOB):] for k, _ in rows if k.startswith(JOB)]

    async def ids(self, index: str) -> list[tuple[str, float]]:
        rows = await asyncio.to_thread(self.records.members, index)
        return [(k[len(JOB):], s) for k, s in rows if k.startswith(JOB)]

    async def counts(self) -> dict[str, int]:
        def count() -> dict[str, int]:
            return {s: self.records.count(f"status:{s}") for s in STATUSES}
        return await asyncio.to_thread(count)

    # -- the worker's side --------------------------------------------------------
    async def claim(self, job_id: str, owner: str, lease_s: float, max_attempts: int) -> Job | None:
        """queued → running under a fresh attempt; None if the job is not ours to run.
        A job that has used up its attempts (it kept killing its worker) fails here."""
        now = time.time()

        def fn(job: Job) -> bool:
            if job.status != "queued":
                return False
            if job.attempts >= max_attempts:
                _finalize(job, "failed", now)
                job.error = {"code": "max_attempts",
                             "message": f"the job was tried {job.attempts} times without finishing"}
                return True
            job.status = "running"
            job.attempts += 1
            job.owner = owner
            job.lease_until = now + lease_s
            job.started_at = job.started_at or now
            return True

        job = await self._change(job_id, fn)
        return job if job is not None and job.status == "running" else None

    async def heartbeat(self, job_id: str, attempt: int, lease_s: float,
                        progress: dict[str, Any] | None = None) -> Job | None:
        """Extend the lease; None when this attempt has lost the job."""
        now = time.time()

        def fn(job: Job) -> bool:
            if job.status != "running" or job.attempts != attempt:
                return False
            job.lease_until = now + lease_s
            if progress is not None:
                job.progress = progress
            return True

        return await self._change(job_id, fn)

    async def finish(self, job_id: str, attempt: int, status: Status,
                     result: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
                     meta: dict[str, Any] | None = None,
                     progress: dict[str, Any] | None = None) -> Job | None:
        """running → final, only for the attempt that holds the job: one result, ever."""
        now = time.time()

        def fn(job: Job) -> bool:
            if job.status != "running" or job.attempts != attempt:
                return False
            job.meta["worker"] = job.owner  # who ran it (operations; the tests check it)
            _finalize(job, status, now)
            job.result, job.error = result, error
            if meta:
                job.meta.update(meta)
            if progress is not None:
                job.progress = progress
            if status == "cancelled":
                job.cancelled_at = job.cancelled_at or now
            return True

        return await self._change(job_id, fn)

    async def release(self, job_id: str, attempt: int | None = None,
                      refund: bool = False) -> Job | None:
        """running → queued: the worker stops (shutdown, retryable error) or died (lease
        expired; attempt None). The caller enqueues the id again. `refund`: the attempt
        does not count (the job was shed before it started)."""
        now = time.time()

        def fn(job: Job) -> bool:
            if job.status != "running":
                return False
            if attempt is not None and job.attempts != attempt:
                return False
            if attempt is None and job.lease_until > now:
                return False
            job.status, job.owner, job.lease_until, job.enqueued_at = "queued", None, 0.0, now
            if refund:
                job.attempts -= 1
            return True

        return await self._change(job_id, fn)

    async def requeued(self, job_id: str, older_than: float) -> Job | None:
        """Mark a queued job enqueued again (its queue entry may be lost)."""
        now = time.time()

        def fn(job: Job) -> bool:
            if job.status != "queued" or job.enqueued_at > older_than:
                return False
            job.enqueued_at = now
            return True

        return await self._change(job_id, fn)

    # -- the user's side -------------------------------------------------------------
    async def cancel(self, job_id: str, tenant: str) -> Job | None:
        """A queued job is cancelled at once; a running one is asked to stop (its worker
        sees the flag on its next heartbeat). None if there is no such job of `tenant`."""
        now = time.time()

        def fn(job: Job) -> bool:
            if job.tenant != tenant:
                return False
            if job.status == "queued":
                _finalize(job, "cancelled", now)
                job.cancelled_at = now
                return True
            if job.status == "running" and not job.cancel_requested:
                job.cancel_requested = True
                job.cancelled_at = now
                return True
            return False

        changed = await self._change(job_id, fn)
        if changed is not None:
            return changed
        job = await self.get(job_id)
        return job if job is not None and job.tenant == tenant else None

    # -- notifications ------------------------------------------------------------------
    async def claim_notification(self, job_id: str, channel: str, until: float) -> Job | None:
        """pending (or sending whose sender died) → sending until `until`."""
        now = time.time()

        def fn(job: Job) -> bool:
            state = job.notified.get(channel)
            if state == "pending" or (state == "sending" and job.sending_until.get(channel, 0) < now):
                job.notified[channel] = "sending"
                job.sending_until[channel] = until
                return True
            return False

        return await self._change(job_id, fn)

    async def extend_notification(self, job_id: str, channel: str, until: float) -> None:
        """The sender is alive and tries again: keep its claim."""
        def fn(job: Job) -> bool:
            if job.notified.get(channel) != "sending":
                return False
            job.sending_until[channel] = until
            return True

        await self._change(job_id, fn)

    async def settle_notification(self, job_id: str, channel: str, state: str) -> None:
        def fn(job: Job) -> bool:
            if job.notified.get(channel) != "sending":
                return False
            job.notified[channel] = state
            job.sending_until.pop(channel, None)
            return True

        await self._change(job_id, fn)
