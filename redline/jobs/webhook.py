"""Webhook delivery: POST a JSON event, signed the Standard Webhooks way with the job
tenant's own secret (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64
HMAC-SHA256 over "id.timestamp.body">`), retried with exponential backoff.

A server-side request forgery guard: the host is resolved once per delivery, every
address it resolves to must be globally routable (`ipaddress.is_global`, and the IPv4
address inside IPv4-mapped, 6to4 and NAT64 forms too), and the request connects to the
address that was checked: the URL's host is replaced by that address (Host header and
TLS server name keep the name), so a DNS answer that changes between the check and the
connect (rebinding) is never followed. `jobs.webhook_allow_private` lifts the check,
not the pinning. Failures are recorded in a few fixed words (the client reads them on
the job); the details go to the log, with the URL's query left out."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from redline.config import JobsConfig
from redline.errors import InvalidRequest

log = logging.getLogger(__name__)

RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolve = Callable[[str, int], Awaitable[Sequence[str]]]  # (host, port) → addresses
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: never global


def sign(secret: str, body: bytes) -> str:
    """The legacy X-Redline-Signature (one server-wide key, body only)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def tenant_secret(master: bytes, tenant: str) -> str:
    """The tenant's Standard Webhooks secret (`whsec_<base64>`), derived from the
    server's key so that every replica signs alike and no table of secrets is kept; a
    tenant reads its own from GET /v1/webhook_secret."""
    raw = hmac.new(master, b"webhook-secret\0" + tenant.encode(), hashlib.sha256).digest()
    return "whsec_" + base64.b64encode(raw).decode()


def standard_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def refused(ip: IP) -> bool:
    """Not an address a webhook may reach: anything not globally routable, looking
    through the forms that carry an IPv4 address inside an IPv6 one."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is None and ip in NAT64:
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None:
            return refused(inner)
        if ip in NAT64_LOCAL:
            return True
    return not ip.is_global or ip.is_multicast


def redact(url: httpx.URL) -> str:
    """The URL for the log: no query (it often carries a token), no user info."""
    port = f":{url.port}" if url.port else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"


async def system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class Target:
    """Where a webhook goes: the URL, and the one address it will connect to."""

    url: httpx.URL
    address: str

    def pinned(self) -> httpx.URL:
        return self.url.copy_with(host=self.address)


class WebhookSender:
    def __init__(self, cfg: JobsConfig, resolve: Resolve = system_resolve,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """`resolve` and `transport`: the DNS lookup and the HTTP connection (tests put a
        changing resolver and a recording transport here)."""
        self.cfg = cfg
        self.resolve, self.transport = resolve, transport

    async def target(self, url: str) -> Target:
        """Check `url` and resolve its host once: InvalidRequest (param notify.webhook)
        for a URL this server does not call."""
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise InvalidRequest("notify.webhook is not a valid URL.",
                                 param="notify.webhook") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise InvalidRequest("notify.webhook must be an http(s) URL with a host",
                                 param="notify.webhook")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            literal: IP | None = ipaddress.ip_address(parsed.host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses: Sequence[str] = [str(literal)]
        else:
            try:
                addresses = await asyncio.wait_for(self.resolve(parsed.host, port), timeout=5)
            except (OSError, TimeoutError) as exc:
                raise InvalidRequest(f"notify.webhook host {parsed.host!r} does not resolve",
                                     param="notify.webhook") from exc
        ips = []
        for a in addresses:
            try:
                ips.append(ipaddress.ip_address(a.split("%", 1)[0]))
            except ValueError:
                continue
        if not ips:
            raise InvalidRequest(f"notify.webhook host {parsed.host!r} does not resolve",
                                 param="notify.webhook")
        if not self.cfg.webhook_allow_private and any(refused(ip) for ip in ips):
            raise InvalidRequest("notify.webhook points to an address that is not publicly "
                                 "routable, which this server does not call",
                                 param="notify.webhook")
        return Target(parsed, str(ips[0]))

    async def check(self, url: str) -> None:
        """Refuse a URL we will not call (at acceptance: a 400 for the client)."""
        await self.target(url)

    async def send(self, url: str, event: dict[str, Any], key: str, secret: str,
                   renew: Callable[[], Awaitable[None]] | None = None) -> str:
        """Deliver with retries; the outcome ("sent" or "failed: …") is recorded on the job
        and shown to its tenant, so it says what happened in fixed words only."""
        try:
            target = await self.target(url)  # again, at sending: DNS may have changed
        except InvalidRequest as exc:
            log.warning("webhook %s for %s refused: %s", _safe(url), key, exc.message)
            return "failed: refused"
        body = json.dumps(event, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": key,
                   "Host": target.url.netloc.decode("ascii", "replace"),
                   "X-Redline-Event": str(event.get("type", ""))}
        if self.cfg.webhook_secret:
            headers["X-Redline-Signature"] = sign(self.cfg.webhook_secret, body)
        extensions = {"sni_hostname": target.url.host} if target.url.scheme == "https" else {}
        why = "no attempt"
        async with httpx.AsyncClient(timeout=self.cfg.webhook_timeout_s, follow_redirects=False,
                                     transport=self.transport, trust_env=False) as client:
            for attempt in range(self.cfg.webhook_attempts):
                if attempt:
                    if renew is not None:
                        await renew()
                    await asyncio.sleep(self.cfg.webhook_backoff_s * 2 ** (attempt - 1))
                now = int(time.time())  # per try: receivers refuse stale timestamps
                headers.update({"webhook-id": key, "webhook-timestamp": str(now),
                                "webhook-signature": standard_signature(secret, key, now, body)})
                try:
                    resp = await client.post(target.pinned(), content=body, headers=headers,
                                             extensions=extensions)
                except httpx.TimeoutException as exc:
                    log.warning("webhook %s for %s: %s", redact(target.url), key, exc)
                    why = "timed out"
                    continue
                except httpx.HTTPError as exc:
                    log.warning("webhook %s for %s: %s", redact(target.url), key, exc)
                    why = "could not connect"
                    continue
                if resp.status_code < 300:
                    return "sent"
                why = f"HTTP {resp.status_code}"
                if resp.status_code not in RETRY_STATUS:
                    break
        log.warning("webhook %s for %s failed: %s", redact(target.url), key, why)
        return f"failed: {why}"

    def attempt_s(self) -> float:
        """How long one try may take (with its backoff): the claim on sending lasts this."""
        n = self.cfg.webhook_attempts
        return self.cfg.webhook_timeout_s + self.cfg.webhook_backoff_s * 2.0 ** (n - 1) + 5


def _safe(url: str) -> str:
    try:
        return redact(httpx.URL(url))
    except (httpx.InvalidURL, TypeError):
        return "<invalid url>"
