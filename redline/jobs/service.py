"""The async tier, assembled: job book, huey queue, files, notifier, worker, schedule.
The API submits and reads through it; the app's lifespan starts and stops it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from redline.config import JobsConfig
from redline.errors import InvalidRequest
from redline.jobs.batch import (
    BatchRunner,
    Decode,
    RunContext,
    count_lines,
    describe_batch,
    parse_input,
)
from redline.jobs.book import JobBook
from redline.jobs.files import FileStore
from redline.jobs.model import STATUSES, Job, tenant_index
from redline.jobs.notify import Notifier
from redline.jobs.queue import JobQueue, open_huey
from redline.jobs.records import open_records, shared_secret
from redline.jobs.runner import Gate, Shapes, run_request
from redline.jobs.schedule import Scheduler
from redline.jobs.spec import JobSpec
from redline.jobs.worker import Outcome, Run, Worker
from redline.pipeline import Pipeline
from redline.store.base import StoreUnavailable
from redline.types import new_id

log = logging.getLogger(__name__)

ERRORS_INLINE = 10  # validation errors shown in the batch object; all are in its error file


def describe(job: Job) -> dict[str, Any]:
    return describe_batch(job) if job.kind == "batch" else job.public()


class JobService:
    def __init__(self, cfg: JobsConfig, data_dir: Path, store_url: str | None,
                 pipeline: Pipeline, gauge: Any, decode: Decode, shapes: Shapes,
                 gate: Gate | None = None, respond: Run | None = None) -> None:
        """`gauge`: the `redline_jobs{status}` gauge (Metrics.jobs); `gate`: the tenants'
        rate limits, which every job and batch line counts against as it runs; `respond`:
        runs a background response of the Responses API (a job of kind "response");
        `decode` and `shapes` are the api's reading of a request body and its answer
        (api/job_body.py, jobs/runner.py)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        self.cfg, self.pipeline, self.decode = cfg, pipeline, decode
        self.records = open_records(store_url, str(data_dir / "jobs.db"), cfg.durable,
                                    cfg.redis_timeout_s)
        self.book = JobBook(self.records)
        self.queue = JobQueue(open_huey(store_url, str(data_dir / "jobs-queue.db"),
                                        cfg.durable, cfg.redis_timeout_s))
        self.files = FileStore(self.records)
        self.notifier = Notifier(cfg, self.book, describe)
        self.gate = gate
        self.respond = respond
        self.shapes = shapes
        self.batches = BatchRunner(pipeline, self.files, self.records, decode,
                                   shapes, cfg.batch_concurrency, gate)
        self.worker = Worker(cfg, self.book, self.queue, self.notifier, self._run,
                             ready=lambda: pipeline.ready)
        self.scheduler: Scheduler | None = None  # made at start: its secret is in the records
        self.gauge = gauge
        self._tasks: list[asyncio.Task[None]] = []
        self._idem_secret: bytes | None = None
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
    async def submit(self, spec: JobSpec, notify: dict[str, str] | None = None,
                     idempotency_key: str | None = None) -> Job:
        """Accept a job: once this returns, the job is durable and will run. With an
        `idempotency_key`, a retry of the same submission returns the first job."""
        notify = {k: v for k, v in (notify or {}).items() if v}
        await self.notifier.check(notify)
        job_id = await self._job_id("job", spec.tenant, idempotency_key)
        job = Job(id=job_id, kind="completion", spec=spec.to_dict(), notify=notify,
                  tenant=spec.tenant)
        return await self._accept_once(job) if idempotency_key else await self._accepted(job)

    async def _accepted(self, job: Job) -> Job:
        await self._accept(job)
        return job

    async def _job_id(self, prefix: str, tenant: str, idempotency_key: str | None) -> str:
        """A fresh random id, or the one id a tenant's idempotency key stands for (keyed
        with a secret the replicas share: unguessable, and the same on every replica)."""
        if not idempotency_key:
            return new_id(prefix)
        if self._idem_secret is None:
            self._idem_secret = await asyncio.to_thread(shared_secret, self.records,
                                                        "idempotency:secret")
        mac = hmac.new(self._idem_secret, f"{tenant}\0{idempotency_key}".encode(),
                       hashlib.sha256).hexdigest()[:24]
        return f"{prefix}-{mac}"

    async def _accept_once(self, job: Job) -> Job:
        """Accept `job` unless its idempotency key made one already: then that one."""
        try:
            await self._accept(job)
            return job
        except InvalidRequest:
            return await self._first(job)

    async def _first(self, job: Job) -> Job:
        """The job an idempotency key made first, if it was the same request (a key
        reused for another request is a 400, as Stripe answers it)."""
        first = await self.book.get(job.id)
        if first is None:
            raise InvalidRequest(f"a job with id {job.id} exists")
        if first.spec != json.loads(json.dumps(job.spec)) or first.tenant != job.tenant:
            raise InvalidRequest("This Idempotency-Key was used for a different request.",
                                 code="idempotency_key_reused")
        return first

    async def submit_response(self, response_id: str, tenant: str, spec: dict[str, Any],
                              notify: dict[str, str] | None = None) -> Job:
        """Accept a background response (its job has the response's id): durable once
        this returns, run once by `respond` on whichever worker claims it."""
        if self.respond is None:
            raise InvalidRequest("background responses are not served by this server.",
                                 param="background")
        notify = {k: v for k, v in (notify or {}).items() if v}
        await self.notifier.check(notify)
        return await self._accepted(Job(id=response_id, kind="response", spec=spec,
                                         notify=notify, tenant=tenant))

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
        except RedisError as exc:  # the queue's Redis down: 503, never 202 for a job not kept
            raise StoreUnavailable("The job queue is unavailable; the job was not accepted. "
                                   "Retry shortly.", retry_after=1) from exc
        self.worker.wake()

    async def submit_batch(self, input_file_id: str, endpoint: str, completion_window: str,
                           metadata: dict[str, str] | None, tenant: str = "anonymous",
                           notify: dict[str, str] | None = None,
                           idempotency_key: str | None = None, key: str | None = None) -> Job:
        """`key`: the API key that makes it, charged for each line as it runs."""
        meta_file = await self.files.get(input_file_id, tenant)
        if meta_file is None:  # another tenant's file is not found either
            raise InvalidRequest(f"No such File object: {input_file_id}", param="input_file_id",
                                 code="not_found")
        if meta_file["purpose"] != "batch":
            raise InvalidRequest("The input file must have purpose 'batch'.",
                                 param="input_file_id")
        if meta_file["bytes"] > self.cfg.batch_max_bytes:
            raise InvalidRequest(f"The input file has {meta_file['bytes']} bytes; a batch takes "
                                 f"at most {self.cfg.batch_max_bytes}.", param="input_file_id",
                                 code="file_too_large")
        notify = {k: v for k, v in (notify or {}).items() if v}
        await self.notifier.check(notify)
        content = await self.files.content(input_file_id, tenant) or b""
        n = await asyncio.to_thread(count_lines, content)  # before parsing any of them
        if n > self.cfg.batch_max_lines:
            raise InvalidRequest(f"The input file has {n} requests; a batch takes at most "
                                 f"{self.cfg.batch_max_lines}.", param="input_file_id",
                                 code="too_many_requests_in_batch")
        lines, errors = await asyncio.to_thread(parse_input, content, endpoint, self.decode)
        job_id = (await self._job_id("batch", tenant, idempotency_key)).replace("-", "_")
        job = Job(id=job_id, kind="batch", notify=notify, tenant=tenant,
                  spec={"input_file_id": input_file_id, "endpoint": endpoint,
                        "completion_window": completion_window, "metadata": metadata,
                        "tenant": tenant, "key": key,
                        "total": len(lines) + len(errors)})
        if errors:  # OpenAI's way: the batch exists, and failed validation
            now = time.time()
            job.status, job.finished_at = "failed", now
            # every error in an error file; the batch object (rewritten on each change of
            # the record) keeps the first few, however bad the file
            f = await self.files.create(f"file-{job.id}-errors",
                                        b"".join(json.dumps(e).encode() + b"\n" for e in errors),
                                        f"{job.id}_errors.jsonl", "batch_output", tenant)
            job.meta.update(errors=errors[:ERRORS_INLINE], errors_total=len(errors),
                            error_file_id=f["id"])
            job.notified = {ch: "pending" for ch in notify}
            if not await self.book.create(job):
                return await self._first(job)
            return job
        return await self._accept_once(job) if idempotency_key else await self._accepted(job)

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
            return Outcome(status, meta=meta)
        if job.kind == "response" and self.respond is not None:
            return await self.respond(job, ctx)
        result = await run_request(self.pipeline, JobSpec.from_dict(job.spec), self.shapes,
                                   self.gate)
        return Outcome("succeeded", result=result)

    async def _gauges_forever(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                counts = await self.book.counts()
                for status in STATUSES:
                    self.gauge.labels(status).set(counts.get(status, 0))
            await asyncio.sleep(2.0)
