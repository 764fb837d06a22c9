"""The OpenAI Batch API on the job queue: a batch is one job whose run answers every
line of its input file through the pipeline. Each answered line is stored as it ends,
so a batch taken over after a crash answers only the lines still missing; the output
and error files are assembled once, in input order, one line per custom_id."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redline.errors import RedlineError
from redline.jobs.files import FileStore
from redline.jobs.model import Job, Status
from redline.jobs.records import RecordStore
from redline.jobs.runner import Gate, Shapes, run_request
from redline.jobs.spec import JobSpec
from redline.pipeline import Pipeline

Decode = Callable[[str, dict[str, Any]], JobSpec]  # (url, body) → spec; raises RedlineError
LINE_TRIES = 3  # a line that fails with a server error is tried again, this many times in all


@dataclass
class BatchLine:
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass
class RunContext:
    """What a running job shares with its heartbeat."""

    attempt: int
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    progress: dict[str, Any] = field(default_factory=dict)
    lost: bool = False


def count_lines(content: bytes) -> int:
    """Requests in an input file: its lines that are not blank."""
    return sum(1 for raw in content.splitlines() if raw.strip())


def parse_input(content: bytes, endpoint: str,
                decode: Decode) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The lines of an input file, and OpenAI-shaped errors for the bad ones."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()

    def bad(n: int, code: str, message: str, param: str | None = None) -> None:
        errors.append({"code": code, "message": message, "param": param, "line": n})

    for n, raw in enumerate(content.decode("utf-8", errors="replace").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            bad(n, "invalid_json", "This line is not valid JSON.")
            continue
        if not isinstance(obj, dict):
            bad(n, "invalid_request", "Each line must be a JSON object.")
            continue
        cid, url, body = obj.get("custom_id"), obj.get("url"), obj.get("body")
        if not isinstance(cid, str) or not cid:
            bad(n, "missing_required_parameter", "custom_id is required.", "custom_id")
        elif cid in seen:
            bad(n, "duplicate_custom_id", f"The custom_id {cid!r} is used more than once.",
                "custom_id")
        elif obj.get("method", "POST") != "POST":
            bad(n, "invalid_method", "Only POST is supported.", "method")
        elif url != endpoint:
            bad(n, "mismatched_endpoint", f"The url {url!r} does not match the batch's "
                f"endpoint {endpoint!r}.", "url")
        elif not isinstance(body, dict):
            bad(n, "missing_required_parameter", "body must be an object.", "body")
        else:
            try:
                decode(url, body)
            except RedlineError as exc:
                bad(n, exc.code or "invalid_request", exc.message, exc.param)
                continue
            seen.add(cid)
            lines.append(BatchLine(cid, url, body))
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "The input file has no requests.",
                       "param": None, "line": None})
    return lines, errors


def _line_id(batch_id: str, i: int) -> str:
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{i}".encode()).hexdigest()[:24]


class BatchRunner:
    def __init__(self, pipeline: Pipeline, files: FileStore, records: RecordStore,
                 decode: Decode, shapes: Shapes, concurrency: int,
                 gate: Gate | None = None) -> None:
        self.pipeline, self.files, self.records = pipeline, files, records
        self.decode, self.concurrency, self.gate = decode, concurrency, gate
        self.shapes = shapes

    def _key(self, batch_id: str, i: int) -> str:
        return f"bline:{batch_id}:{i}"

    async def run(self, job: Job, ctx: RunContext) -> tuple[Status, dict[str, Any]]:
        """Answer the lines still missing, then write the files. Returns the final status
        ("succeeded" or "cancelled") and the batch meta to record."""
        content = await self.files.content(job.spec["input_file_id"], job.tenant) or b""
        # off the event loop: 50,000 lines take seconds to validate
        lines, _ = await asyncio.to_thread(parse_input, content, job.spec["endpoint"],
                                           self.decode)
        done: dict[int, dict[str, Any]] = {}
        for i in range(len(lines)):
            raw = await asyncio.to_thread(self.records.get, self._key(job.id, i))
            if raw is not None:
                done[i] = json.loads(raw)
        todo = [i for i in range(len(lines)) if i not in done]
        self._count(ctx, len(lines), done)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in todo:
            queue.put_nowait(i)

        async def lane() -> None:
            while not queue.empty() and not ctx.cancel.is_set():
                i = queue.get_nowait()
                out = await self._answer(job.id, i, lines[i], job.tenant, job.spec.get("key"))
                await asyncio.to_thread(self.records.put, self._key(job.id, i),
                                        json.dumps(out).encode())
                done[i] = out
                self._count(ctx, len(lines), done)

        await asyncio.gather(*(lane() for _ in range(min(self.concurrency, max(1, len(todo))))))
        meta = await self._finalize(job, lines, done)
        return ("cancelled" if ctx.cancel.is_set() else "succeeded"), meta

    def _count(self, ctx: RunContext, total: int, done: dict[int, dict[str, Any]]) -> None:
        failed = sum(1 for o in done.values() if o.get("error") is not None
                     or (o.get("response") or {}).get("status_code", 200) >= 400)
        ctx.progress.update(total=total, completed=len(done) - failed, failed=failed)

    async def _answer(self, batch_id: str, i: int, line: BatchLine, tenant: str,
                      key: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": _line_id(batch_id, i), "custom_id": line.custom_id}
        for attempt in range(LINE_TRIES):
            try:
                spec = self.decode(line.url, line.body)
                # the batch's tenant, and the key that made it (charged for each line)
                spec = JobSpec(**{**spec.to_dict(), "tenant": tenant, "key": key})
                body = await run_request(self.pipeline, spec, self.shapes, self.gate)
                return out | {"response": {"status_code": 200, "request_id": body.get("id"),
                                           "body": body}, "error": None}
            except RedlineError as exc:
                if exc.status < 500 or attempt == LINE_TRIES - 1:
                    return out | {"response": {"status_code": exc.status, "request_id": None,
                                               "body": exc.to_dict()}, "error": None}
                await asyncio.sleep(0.5 * 2 ** attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _finalize(self, job: Job, lines: list[BatchLine],
                        done: dict[int, dict[str, Any]]) -> dict[str, Any]:
        ok = [json.dumps(done[i]) for i in sorted(done) if done[i]["response"]["status_code"] < 400]
        bad = [json.dumps(done[i]) for i in sorted(done) if done[i]["response"]["status_code"] >= 400]
        meta: dict[str, Any] = {"output_file_id": None, "error_file_id": None}
        # ids follow from the batch id: finalising twice (a crash right here) writes one
        # file; they are guessable, so they belong to the batch's tenant like any file
        if ok:
            f = await self.files.create(f"file-{job.id}-output", ("\n".join(ok) + "\n").encode(),
                                        f"{job.id}_output.jsonl", "batch_output", job.tenant)
            meta["output_file_id"] = f["id"]
        if bad:
            f = await self.files.create(f"file-{job.id}-errors", ("\n".join(bad) + "\n").encode(),
                                        f"{job.id}_errors.jsonl", "batch_output", job.tenant)
            meta["error_file_id"] = f["id"]
        return meta


_STATUS = {"queued": "in_progress", "running": "in_progress", "succeeded": "completed",
           "failed": "failed", "cancelled": "cancelled"}


def describe_batch(job: Job) -> dict[str, Any]:
    """The OpenAI batch object for a batch job."""
    s, m = job.spec, job.meta
    status = _STATUS[job.status]
    if job.status in ("queued", "running") and job.cancel_requested:
        status = "cancelling"
    created = int(job.created_at)
    fin = None if job.finished_at is None else int(job.finished_at)
    counts = {"total": job.progress.get("total", s.get("total", 0)),
              "completed": job.progress.get("completed", 0),
              "failed": job.progress.get("failed", 0)}
    errors = None
    if m.get("errors"):
        errors = {"object": "list", "data": m["errors"]}
    elif job.status == "failed" and job.error:
        errors = {"object": "list", "data": [{**job.error, "param": None, "line": None}]}
    return {
        "id": job.id, "object": "batch", "endpoint": s["endpoint"], "errors": errors,
        "input_file_id": s["input_file_id"], "completion_window": s["completion_window"],
        "status": status, "output_file_id": m.get("output_file_id"),
        "error_file_id": m.get("error_file_id"), "created_at": created,
        "in_progress_at": created if not m.get("errors") else None,
        "expires_at": created + 24 * 3600, "finalizing_at": None,
        "completed_at": fin if job.status == "succeeded" else None,
        "failed_at": fin if job.status == "failed" else None, "expired_at": None,
        "cancelling_at": None if job.cancelled_at is None else int(job.cancelled_at),
        "cancelled_at": fin if job.status == "cancelled" else None,
        "request_counts": counts, "metadata": s.get("metadata"),
    }
