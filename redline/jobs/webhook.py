"""Webhook delivery: POST a JSON event, signed with HMAC-SHA256 over the exact body
bytes (`X-Redline-Signature: sha256=<hex>`), with the job's idempotency key, retried
with exponential backoff. Private, loopback and link-local hosts are refused unless
the config allows them (a server-side request forgery guard)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from redline.config import JobsConfig
from redline.errors import InvalidRequest

log = logging.getLogger(__name__)

RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _blocked(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved
            or ip.is_multicast or ip.is_unspecified)


class WebhookSender:
    def __init__(self, cfg: JobsConfig) -> None:
        self.cfg = cfg

    async def check(self, url: str) -> None:
        """Refuse a URL we will not call (InvalidRequest, param notify.webhook)."""
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise InvalidRequest(f"notify.webhook is not a valid URL: {exc}",
                                 param="notify.webhook") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise InvalidRequest("notify.webhook must be an http(s) URL with a host",
                                 param="notify.webhook")
        if self.cfg.webhook_allow_private:
            return
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
                parsed.host, port, type=socket.SOCK_STREAM), timeout=5)
        except (OSError, TimeoutError) as exc:
            raise InvalidRequest(f"notify.webhook host {parsed.host!r} does not resolve",
                                 param="notify.webhook") from exc
        if any(_blocked(str(info[4][0])) for info in infos):
            raise InvalidRequest("notify.webhook points to a private or loopback address, "
                                 "which this server does not call", param="notify.webhook")

    async def send(self, url: str, event: dict[str, Any], key: str,
                   renew: Callable[[], Awaitable[None]] | None = None) -> str:
        """Deliver with retries; the outcome ("sent" or "failed: …") is recorded."""
        try:
            await self.check(url)  # again: DNS may have changed since the job was accepted
        except InvalidRequest as exc:
            return f"failed: {exc.message}"
        body = json.dumps(event, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": key,
                   "webhook-id": key, "webhook-timestamp": str(int(time.time())),
                   "X-Redline-Event": str(event.get("type", ""))}
        if self.cfg.webhook_secret:
            headers["X-Redline-Signature"] = sign(self.cfg.webhook_secret, body)
        why = "no attempt"
        async with httpx.AsyncClient(timeout=self.cfg.webhook_timeout_s,
                                     follow_redirects=False) as client:
            for attempt in range(self.cfg.webhook_attempts):
                if attempt:
                    await asyncio.sleep(self.cfg.webhook_backoff_s * 2 ** (attempt - 1))
                try:
                    resp = await client.post(url, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    why = f"{type(exc).__name__}: {exc}"
                    continue
                if resp.status_code < 300:
                    return "sent"
                why = f"HTTP {resp.status_code}"
                if resp.status_code not in RETRY_STATUS:
                    break
        log.warning("webhook %s for %s failed: %s", url, key, why)
        return f"failed: {why}"

    def attempt_s(self) -> float:
        """How long one try may take (with its backoff): the claim on sending lasts this."""
        n = self.cfg.webhook_attempts
        return self.cfg.webhook_timeout_s + self.cfg.webhook_backoff_s * 2 ** (n - 1) + 5
