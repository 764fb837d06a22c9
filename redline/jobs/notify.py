"""One notification per finished job and channel. The job book records each channel's
state durably (pending → sending → sent | failed); a sender that dies mid-send leaves a
lease that expires, and the reaper sends again with the same idempotency key.

Sending has a queue and lanes of its own (`jobs.notify_lanes`): a finished job or a
DELETE only puts the job on it, so a slow or silent endpoint holds a sending lane,
never a job worker's slot or a client's request. The queue is in memory; what it holds
is `pending` in the book, so a queue lost with its process is sent by a reaper."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redline.config import JobsConfig
from redline.jobs.book import JobBook
from redline.jobs.mail import Mailer
from redline.jobs.model import Job
from redline.jobs.records import shared_secret
from redline.jobs.webhook import WebhookSender, tenant_secret

log = logging.getLogger(__name__)

Describe = Callable[[Job], dict[str, Any]]
Renew = Callable[[], Awaitable[None]]


def event(job: Job, describe: Describe) -> dict[str, Any]:
    return {"id": f"evt_{job.id}", "object": "event", "type": f"{job.kind}.{job.status}",
            "created_at": int(job.finished_at or time.time()), "data": describe(job)}


class Notifier:
    def __init__(self, cfg: JobsConfig, book: JobBook, describe: Describe,
                 webhook: WebhookSender | None = None) -> None:
        self.cfg, self.book = cfg, book
        self.describe = describe
        self.webhook = webhook or WebhookSender(cfg)
        self.mail = Mailer(cfg)
        self._master: bytes | None = None
        self._queue: asyncio.Queue[Job] | None = None  # None: not sending in this process
        self._queued: set[str] = set()  # job ids on the queue or being sent
        self._lanes: list[asyncio.Task[None]] = []

    # -- the sending queue ------------------------------------------------------------
    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._lanes = [asyncio.create_task(self._lane(), name=f"notify-{i}")
                       for i in range(self.cfg.notify_lanes)]

    async def stop(self) -> None:
        for t in self._lanes:
            t.cancel()
        await asyncio.gather(*self._lanes, return_exceptions=True)
        self._lanes, self._queue = [], None

    def enqueue(self, job: Job) -> None:
        """Send the job's pending notifications soon, without waiting for them. Where
        this process does not send (no worker here), a worker's reaper sends them."""
        if self._queue is None or job.id in self._queued or not job.notified:
            return
        self._queued.add(job.id)
        self._queue.put_nowait(job)

    def busy(self, job_id: str) -> bool:
        return job_id in self._queued

    async def _lane(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            job = await queue.get()
            try:
                await self.deliver(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # the book's store failed: the reaper tries again
                log.exception("job %s: notification failed", job.id)
            finally:
                self._queued.discard(job.id)

    async def secret(self, tenant: str) -> str:
        """The tenant's webhook signing secret (whsec_…), the same on every replica."""
        if self._master is None:
            configured = self.cfg.webhook_secret
            self._master = (configured.encode() if configured else
                            await asyncio.to_thread(shared_secret, self.book.records,
                                                    "webhook:secret"))
        return tenant_secret(self._master, tenant)

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
            return await self.webhook.send(target, ev, key=job.id,
                                           secret=await self.secret(job.tenant), renew=renew)
        subject = f"[redline] {job.kind} {job.id} {job.status}"
        text = (f"Your {job.kind} {job.id} finished: {job.status}.\n\n"
                + json.dumps(ev["data"], indent=2) + "\n")
        return await self.mail.send(target, subject, text, message_id=job.id, renew=renew)
