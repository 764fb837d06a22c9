"""The async tier, assembled: job book, huey queue, files, notifier, worker, schedule.
The API submits and reads through it; the app's lifespan starts and stops it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from redline.config import JobsConfig
from redline.errors import InvalidRequest
from redline.jobs.batch import BatchRunner, Decode, RunContext, describe_batch, parse_input
from redline.jobs.book import JobBook
from redline.jobs.files import FileStore
from redline.jobs.model import STATUSES, Job, tenant_index
from redline.jobs.notify import Notifier
from redline.jobs.queue import JobQueue, open_huey
from redline.jobs.records import open_records, shared_secret
from redline.jobs.runner import run_request
from redline.jobs.schedule import Scheduler
from redline.jobs.spec import JobSpec
from redline.jobs.worker import Outcome, Worker
from redline.pipeline import Pipeline
from redline.store.base import StoreUnavailable
from redline.types import new_id

log = logging.getLogger(__name__)


def describe(job: Job) -> dict[str, Any]:
    return describe_batch(job) if job.kind == "batch" else job.public()


class JobService:
    def __init__(self, cfg: JobsConfig, data_dir: Path, store_url: str | None,
                 pipeline: Pipeline, gauge: Any, decode: Decode) -> None:
        """`gauge`: the `redline_jobs{status}` gauge (Metrics.jobs)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        self.cfg, self.pipeline, self.decode = cfg, pipeline, decode
        self.records = open_records(store_url, str(data_dir / "jobs.db"))
        self.book = JobBook(self.records)
        self.queue = JobQueue(open_huey(store_url, str(data_dir / "jobs-queue.db")))
        self.files = FileStore(self.records)
        self.notifier = Notifier(cfg, self.book, describe)
        self.batches = BatchRunner(pipeline, self.files, self.records, decode,
                                   cfg.batch_concurrency)
        self.worker = Worker(cfg, self.book, self.queue, self.notifier, self._run,
                             ready=lambda: pipeline.ready)
        self.scheduler: Scheduler | None = None  # made at start: its secret is in the records
        self.gauge = gauge
        self._tasks: list[asyncio.Task[None]] = []
        self.worker_running = False

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, run_worker: bool) -> None:
        self._tasks.append(asyncio.create_task(self._gauges_forever(), name="jobs-gauges"))
        if run_worker:
            await self.worker.start()
            self.worker_running = True
            if self.cfg.schedule:
                secret = await asyncio.to_thread(shared_secret, self.records, "schedule:secret")
                self.scheduler = Scheduler(self.cfg.schedule, self.decode,
                                           self._submit_scheduled, secret)
                self._tasks.append(asyncio.create_task(self.scheduler.run_forever(),
                                                       name="jobs-schedule"))

    async def stop(self) -> None:
        if self.worker_running:
            await self.worker.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.queue.close()
        self.records.close()

    # -- submitting --------------------------------------------------------------------------
    async def submit(self, spec: JobSpec, notify: dict[str, str] | None = None) -> Job:
        """Accept a job: once this returns, the job is durable and will run."""
        notify = {k: v for k, v in (notify or {}).items() if v}
        await self.notifier.check(notify)
        job = Job(id=new_id("job"), kind="completion", spec=spec.to_dict(), notify=notify,
                  tenant=spec.tenant)
        await self._accept(job)
        return job

    async def _submit_scheduled(self, job_id: str, spec: JobSpec) -> bool:
        job = Job(id=job_id, kind="completion", spec=spec.to_dict(), tenant=spec.tenant)
        if not await self.book.create(job):
            return False
        await self.queue.push(job.id)
        self.worker.wake()
        return True

    async def _accept(self, job: Job) -> None:
        try:
            if not await self.book.create(job):
                raise InvalidRequest(f"a job with id {job.id} exists")
            await self.queue.push(job.id)
        except RedisError as exc:  # Redis down: refuse (503), never 202 for a job we cannot keep
            raise StoreUnavailable("The job queue is unavailable; the job was not accepted. "
                                   "Retry shortly.", retry_after=1) from exc
        self.worker.wake()

    async def submit_batch(self, input_file_id: str, endpoint: str, completion_window: str,
                           metadata: dict[str, str] | None, tenant: str = "anonymous",
                           notify: dict[str, str] | None = None) -> Job:
        meta_file = await self.files.get(input_file_id, tenant)
        if meta_file is None:  # another tenant's file is not found either
            raise InvalidRequest(f"No such File object: {input_file_id}", param="input_file_id",
                                 code="not_found")
        if meta_file["purpose"] != "batch":
            raise InvalidRequest("The input file must have purpose 'batch'.",
                                 param="input_file_id")
        notify = {k: v for k, v in (notify or {}).items() if v}
        await self.notifier.check(notify)
        content = await self.files.content(input_file_id, tenant) or b""
        lines, errors = await asyncio.to_thread(parse_input, content, endpoint, self.decode)
        job = Job(id=new_id("batch").replace("-", "_"), kind="batch", notify=notify,
                  tenant=tenant,
                  spec={"input_file_id": input_file_id, "endpoint": endpoint,
                        "completion_window": completion_window, "metadata": metadata,
                        "tenant": tenant,
                        "total": len(lines) + len(errors)})
        if errors:  # OpenAI's way: the batch exists, and failed validation
            now = time.time()
            job.status, job.finished_at = "failed", now
            job.meta["errors"] = errors
            job.notified = {ch: "pending" for ch in notify}
            if not await self.book.create(job):
                raise InvalidRequest(f"a batch with id {job.id} exists")
            return job
        await self._accept(job)
        return job

    # -- reading and cancelling ---------------------------------------------------------------
    async def get(self, job_id: str, tenant: str) -> Job | None:
        """The job, or None when `tenant` has none with this id (another tenant's job is
        not found: its existence is not disclosed)."""
        job = await self.book.get(job_id)
        return job if job is not None and job.tenant == tenant else None

    async def cancel(self, job_id: str, tenant: str) -> Job | None:
        job = await self.book.cancel(job_id, tenant)
        if job is not None and job.final and job.notified:
            self.notifier.enqueue(job)  # the DELETE does not wait for the endpoint
        return job

    async def list_batches(self, tenant: str, after: str | None,
                           limit: int) -> tuple[list[Job], bool]:
        """One page of `tenant`'s batches, newest first, and whether more follow."""
        ids = await self.book.page(tenant_index(tenant, "batches"), limit + 1, after)
        out = []
        for job_id in ids[:limit]:
            job = await self.get(job_id, tenant)
            if job is not None:
                out.append(job)
        return out, len(ids) > limit

    # -- running -------------------------------------------------------------------------------
    async def _run(self, job: Job, ctx: RunContext) -> Outcome:
        if job.kind == "batch":
            status, meta = await self.batches.run(job, ctx)
            return Outcome(status, meta=meta)  # type: ignore[arg-type]
        result = await run_request(self.pipeline, JobSpec.from_dict(job.spec))
        return Outcome("succeeded", result=result)

    async def _gauges_forever(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                counts = await self.book.counts()
                for status in STATUSES:
                    self.gauge.labels(status).set(counts.get(status, 0))
            await asyncio.sleep(2.0)
