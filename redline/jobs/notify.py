"""One notification per finished job and channel. The job book records each channel's
state durably (pending → sending → sent | failed); a sender that dies mid-send leaves a
lease that expires, and the reaper sends again with the same idempotency key."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redline.config import JobsConfig
from redline.jobs.book import JobBook
from redline.jobs.mail import Mailer
from redline.jobs.model import Job
from redline.jobs.webhook import WebhookSender

Describe = Callable[[Job], dict[str, Any]]
Renew = Callable[[], Awaitable[None]]


def event(job: Job, describe: Describe) -> dict[str, Any]:
    return {"id": f"evt_{job.id}", "object": "event", "type": f"{job.kind}.{job.status}",
            "created_at": int(job.finished_at or time.time()), "data": describe(job)}


class Notifier:
    def __init__(self, cfg: JobsConfig, book: JobBook, describe: Describe) -> None:
        self.book = book
        self.describe = describe
        self.webhook = WebhookSender(cfg)
        self.mail = Mailer(cfg)

    async def check(self, notify: dict[str, str]) -> None:
        """Validate the targets when the job is accepted (400 for bad ones)."""
        if "webhook" in notify:
            await self.webhook.check(notify["webhook"])
        if "email" in notify:
            self.mail.check(notify["email"])

    async def deliver(self, job: Job) -> None:
        for channel in list(job.notify):
            if job.notified.get(channel) not in ("pending", "sending"):
                continue
            # the claim covers one try; each retry extends it, so a sender that dies is
            # replaced within one try's timeout, not after the whole retry schedule
            lease = (self.webhook if channel == "webhook" else self.mail).attempt_s()
            claimed = await self.book.claim_notification(job.id, channel, time.time() + lease)
            if claimed is None:
                continue  # sent, or another process is sending it now

            async def renew(ch: str = channel, s: float = lease) -> None:
                await self.book.extend_notification(job.id, ch, time.time() + s)

            outcome = await self._send(channel, claimed, renew)
            await self.book.settle_notification(job.id, channel, outcome)

    async def _send(self, channel: str, job: Job, renew: Renew) -> str:
        ev = event(job, self.describe)
        target = job.notify[channel]
        if channel == "webhook":
            return await self.webhook.send(target, ev, key=job.id, renew=renew)
        subject = f"[redline] {job.kind} {job.id} {job.status}"
        text = (f"Your {job.kind} {job.id} finished: {job.status}.\n\n"
                + json.dumps(ev["data"], indent=2) + "\n")
        return await self.mail.send(target, subject, text, message_id=job.id, renew=renew)
