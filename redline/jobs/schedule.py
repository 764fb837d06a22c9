"""Scheduled precompute: the config's {name, cron, endpoint, body} entries become jobs
at their minute, answered ahead of time so the cache holds a fresh answer when users
ask. Every worker runs this clock; the job id follows from the entry's name and minute,
so two workers create one job, keyed with a secret every worker shares (kept in the job
records) so that nobody outside can guess it and read the job."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from huey import crontab

from redline.config import ScheduledJob
from redline.errors import RedlineError
from redline.jobs.spec import ENDPOINTS, JobSpec

log = logging.getLogger(__name__)

Decode = Callable[[str, dict[str, Any]], JobSpec]
Submit = Callable[[str, JobSpec], Awaitable[bool]]  # (job id, spec) → created


def matcher(cron: str) -> Callable[[dt.datetime], bool]:
    fields = cron.split()
    if len(fields) != 5:
        raise ValueError(f"cron {cron!r}: 5 fields are needed (minute hour day month weekday)")
    minute, hour, day, month, weekday = fields
    return crontab(minute, hour, day, month, weekday)  # type: ignore[no-any-return]  # huey is untyped


class Scheduler:
    def __init__(self, entries: list[ScheduledJob], decode: Decode, submit: Submit,
                 secret: bytes) -> None:
        self.entries = [(e, matcher(e.cron)) for e in entries]
        self.decode, self.submit, self.secret = decode, submit, secret

    def job_id(self, name: str, minute: dt.datetime) -> str:
        """The same on every worker that shares the secret; unguessable without it."""
        mac = hmac.new(self.secret, f"{name}\0{minute:%Y%m%d%H%M}".encode(), hashlib.sha256)
        return "job-sched-" + mac.hexdigest()[:32]

    async def run_forever(self) -> None:
        while True:
            now = dt.datetime.now()
            nxt = (now + dt.timedelta(minutes=1)).replace(second=0, microsecond=0)
            await asyncio.sleep((nxt - now).total_seconds() + 0.05)
            await self.tick(nxt)

    async def tick(self, minute: dt.datetime) -> list[str]:
        """Enqueue the entries due at `minute`; returns the ids created here."""
        created = []
        for entry, due in self.entries:
            if not due(minute):
                continue
            try:
                spec = self.decode(entry.endpoint, entry.body)
            except RedlineError as exc:
                log.error("scheduled job %s: bad body: %s", entry.name, exc.message)
                continue
            if spec.body is not None:  # tools, logprobs, n...: answers the cache cannot hold
                log.error("scheduled job %s: only a plain text request can be precomputed "
                          "into the response cache", entry.name)
                continue
            # a refresh: skip the cache lookup so the answer is new, and store it
            spec = JobSpec(**{**spec.to_dict(), "use_cache": False, "refresh_cache": True,
                              "tier": "B"})
            job_id = self.job_id(entry.name, minute)
            if await self.submit(job_id, spec):
                created.append(job_id)
        return created


__all__ = ["ENDPOINTS", "Scheduler", "matcher"]
