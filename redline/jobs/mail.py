"""E-mail delivery over SMTP (aiosmtplib): STARTTLS, implicit TLS or plain, with the
same retry schedule as webhooks. The Message-ID is the job's, so a mail client can
fold a resend after a crash into the first message."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from email.message import EmailMessage

import aiosmtplib

from redline.config import JobsConfig
from redline.errors import InvalidRequest

log = logging.getLogger(__name__)

_ADDRESS = re.compile(r"^[^@\s<>,;]+@[^@\s<>,;]+\.[^@\s<>,;]+$|^[^@\s<>,;]+@localhost$")


class Mailer:
    def __init__(self, cfg: JobsConfig) -> None:
        self.cfg = cfg
        self.smtp = cfg.smtp

    def check(self, address: str) -> None:
        if not self.smtp.host:
            raise InvalidRequest("e-mail notification is not configured on this server "
                                 "(jobs.smtp.host)", param="notify.email")
        if not _ADDRESS.match(address) or len(address) > 254:
            raise InvalidRequest("notify.email is not an e-mail address", param="notify.email")

    async def send(self, to: str, subject: str, text: str, message_id: str,
                   renew: Callable[[], Awaitable[None]] | None = None) -> str:
        msg = EmailMessage()
        msg["From"] = self.smtp.sender
        msg["To"] = to
        msg["Subject"] = subject
        msg["Message-ID"] = f"<{message_id}@redline>"
        msg.set_content(text)
        why = "no attempt"
        for attempt in range(self.cfg.webhook_attempts):
            if attempt:
                await asyncio.sleep(self.cfg.webhook_backoff_s * 2 ** (attempt - 1))
                if renew is not None:
                    await renew()
            try:
                await aiosmtplib.send(
                    msg, hostname=self.smtp.host, port=self.smtp.port,
                    username=self.smtp.username, password=self.smtp.password,
                    use_tls=self.smtp.tls == "tls", start_tls=self.smtp.tls == "starttls",
                    timeout=self.smtp.timeout_s)
                return "sent"
            except aiosmtplib.SMTPRecipientsRefused as exc:
                why = f"refused: {exc}"
                break  # a bad address does not get better
            except (aiosmtplib.SMTPException, OSError) as exc:
                why = f"{type(exc).__name__}: {exc}"
        log.warning("mail to %s for %s failed: %s", to, message_id, why)
        return f"failed: {why}"

    def attempt_s(self) -> float:
        """How long one try may take (with its backoff): the claim on sending lasts this."""
        n = self.cfg.webhook_attempts
        return self.smtp.timeout_s + self.cfg.webhook_backoff_s * 2.0 ** (n - 1) + 5
