"""Background responses (`background: true`): the response is accepted as `queued` and
runs as a durable job of kind "response" (redline/jobs: it survives `kill -9`, a worker
of any replica claims it, it runs once). The worker produces it the way the POST route
does (api/responses_run.py), through the stream manager under the response's id, so it
can be followed and resumed (`starting_after`) from any replica while it runs, and then
replayed from its journal. Its record moves queued → in_progress → completed | failed |
incomplete | cancelled.

The job book is the truth about whether it is still running: a response whose job
ended without writing its end (its attempts used up by crashes) reads as `failed` with
the job's error, never `in_progress` forever. A retry after a crash runs it again from
the start: its stream starts again too (the events of the dead attempt are dropped)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from redline.api import responses_request as rq
from redline.api import responses_truncation as truncation
from redline.api.responses_output import DONE, Output
from redline.api.responses_run import FINAL, OPEN, Run, context_of
from redline.errors import NotFound, Overloaded, RedlineError
from redline.jobs.batch import RunContext
from redline.jobs.model import Job, Status
from redline.jobs.runner import Gate
from redline.jobs.service import JobService
from redline.jobs.worker import Outcome
from redline.pipeline import Pipeline
from redline.responses import ResponseRecord, ResponseRecords
from redline.store.base import Store
from redline.streams import StreamManager

_JOB: dict[str, Status] = {"completed": "succeeded", "incomplete": "succeeded", "failed": "failed",
        "cancelled": "cancelled"}
WAIT_MIN_S, WAIT_MAX_S = 0.005, 0.1  # polling for a queued response's stream to begin


def spec(snapshot: dict[str, Any], body: rq.ResponsesRequest, items: list[dict[str, Any]],
         context: list[dict[str, Any]], tier: str | None, no_cache: bool,
         key: str | None = None) -> dict[str, Any]:
    """What the job carries: the request as it came, its items, the queued Response
    (the job book keeps it durable even where the store is memory) and the API key it
    was made with (charged for it)."""
    return {"response": snapshot, "body": body.model_dump(mode="json", exclude_none=True),
            "items": items, "context": context, "tier": tier, "no_cache": no_cache, "key": key}


def view(job: Job | None, response: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Response as the record and the job know it together: the job's result once
    it is final (it outlives a memory store), its failure when it ended without one."""
    if job is None or job.kind != "response":
        return response
    if job.result is not None:
        return job.result
    base = response or job.spec["response"]
    if job.status == "queued":
        return base if response is not None else {**base, "status": "queued"}
    if job.status == "running":
        return base if base["status"] != "queued" else {**base, "status": "in_progress"}
    if base["status"] not in OPEN:
        return base
    if job.status == "cancelled":
        return {**base, "status": "cancelled"}
    error = job.error or {}
    return {**base, "status": "failed", "usage": None, "error": {
        "code": "server_error",
        "message": str(error.get("message") or "the background response did not finish")}}


class Background:
    """Runs the jobs of kind "response" (JobService's `respond`)."""

    def __init__(self, pipeline: Pipeline, streams: StreamManager, store: Store,
                 ttl_s: float, gate: Gate | None) -> None:
        self.pipeline, self.streams, self.gate = pipeline, streams, gate
        self.records = ResponseRecords(store, ttl_s)

    async def run(self, job: Job, ctx: RunContext) -> Outcome:
        s = job.spec
        body = rq.ResponsesRequest.model_validate(s["body"])
        snapshot: dict[str, Any] = s["response"]
        items, context = s["items"], s["context"]
        if ctx.attempt > 1:  # a crashed attempt's events: this run's stream replaces them
            await self.streams.journal.drop(job.id)
        try:
            if rq.conversation_of(body) is not None:  # as it is now, with what ran since
                context = await context_of(self.records, body, job.tenant)
            gen = rq.generation(body, context + items, s["tier"], job.tenant, s["no_cache"])
            if self.gate is not None:  # counts against its tenant's limits, as jobs do
                await self.gate.enter(job.tenant, gen, s.get("key"))
            completion = await truncation.complete(
                self.pipeline, gen, body.truncation, context + items,
                lambda chain: rq.generation(body, chain, s["tier"], job.tenant, s["no_cache"]))
        except Overloaded:
            raise  # the worker queues it again, no attempt spent
        except RedlineError as exc:  # it cannot run: it failed, with the reason
            failed = {**snapshot, "status": "failed", "error": {
                "code": exc.code or "server_error", "message": exc.message}}
            await self._end(job, failed, items, context)
            return Outcome("failed", result=failed, error=failed["error"])
        run = Run(body, job.id, completion, self.records, items, context,
                  created_at=snapshot["created_at"], first="queued")
        progress = self.streams.progress(gen, completion.model, completion.tier)
        live = self.streams.start(job.id, run.events(progress), tenant=job.tenant,
                                  detached=True)
        producer = live.producer
        if producer is None:  # start() makes it: a bug, not the request
            raise RuntimeError("the stream of a background response did not start")
        try:
            await asyncio.shield(producer)
        except asyncio.CancelledError:
            if not ctx.cancel.is_set() or ctx.lost:  # shutting down, or no longer ours
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
                raise
            run.stopping = True  # POST .../cancel: the run ends as `cancelled`
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
        answer = run.answer
        if answer is None:  # its record could not be written: tried again
            raise RedlineError("the background response could not be stored")
        return Outcome(_JOB[answer["status"]], result=answer, error=answer.get("error"))

    async def _end(self, job: Job, answer: dict[str, Any], items: list[dict[str, Any]],
                   context: list[dict[str, Any]]) -> None:
        """Store a response that ended before it ran, and give it a stream that says so."""
        await self.records.put(ResponseRecord(job.tenant, answer, items, context))
        await self.streams.journal.drop(job.id)
        live = self.streams.start(job.id, _ended(answer), tenant=job.tenant, detached=True)
        if live.producer is not None:
            await asyncio.gather(live.producer, return_exceptions=True)


async def _ended(answer: dict[str, Any]) -> AsyncGenerator[bytes, None]:
    """The stream of a response that ended without output: created, then its end."""
    out = Output()
    yield out.event("response.created", {"response": {**answer, "status": "queued",
                                                       "error": None}})
    yield out.event(FINAL[answer["status"]], {"response": answer})
    yield DONE


async def follow(streams: StreamManager, jobs: JobService, records: ResponseRecords,
                 response_id: str, tenant: str, after: int) -> AsyncIterator[bytes]:
    """The events of a background response after `after` (events counted from 1):
    waits while it is queued (its stream begins when a worker takes it), then follows
    it on whichever replica runs it. Ends at once when it ended without a stream."""
    wait = WAIT_MIN_S
    while True:
        try:
            events = await streams.open(response_id, after, tenant=tenant)
        except NotFound:
            job = await jobs.get(response_id, tenant)
            if job is None or job.final:
                record = await records.get(response_id, tenant)
                final = view(job, None if record is None else record.response)
                if final is None:
                    raise
                if after == 0:  # its end as the one event there is (cancelled while queued)
                    yield Output().event(FINAL.get(final["status"], "response.failed"),
                                         {"response": final})
                yield DONE
                return
            await asyncio.sleep(wait)
            wait = min(WAIT_MAX_S, wait * 2)
            continue
        async for event in events:
            yield event
        return
