"""Webhooks that cannot reach inside: every address that is not globally routable is
refused (directly, by a name, or inside an IPv6 form), the connection goes to the
address that was checked (a DNS answer that changes is not followed), failures show
fixed words and the log has no query; the tenant's Standard Webhooks signature; and a
slow endpoint holds neither a job worker nor a DELETE."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from jobs_support import wait_job, wait_until

from redline.api.app import create_app
from redline.api.auth import digest
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.config import JobsConfig, load_config
from redline.errors import InvalidRequest
from redline.jobs.webhook import WebhookSender

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "write a report"}],
        "max_tokens": 5}
PUBLIC = "93.184.216.34"

REFUSED = [
    "http://127.0.0.1/h", "http://127.1.2.3:8080/h", "http://[::1]/h", "http://0.0.0.0/h",
    "http://[::]/h", "http://10.0.0.1/h", "http://172.16.5.4/h", "http://192.168.1.1/h",
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata (link-local)
    "http://[fe80::1]/h", "http://[fd00::1]/h",  # link-local, unique-local IPv6
    "http://100.64.0.1/h", "http://100.127.255.254/h",  # CGNAT (shared address space)
    "http://[::ffff:127.0.0.1]/h", "http://[::ffff:169.254.169.254]/h",  # IPv4-mapped
    "http://[2002:7f00:1::]/h", "http://[2002:a00:1::1]/h",  # 6to4 of 127.0.0.1, 10.0.0.1
    "http://[64:ff9b::7f00:1]/h", "http://[64:ff9b::a9fe:a9fe]/h",  # NAT64 of inside ones
    "http://[64:ff9b:1::1]/h",  # local-use NAT64
    "http://224.0.0.1/h", "http://198.18.0.1/h", "http://192.0.2.1/h",  # multicast, bench, doc
    "http://localhost/h",  # a name that resolves to loopback (the system resolver)
    "http://inside.test/h", "http://mixed.test/h",  # names (below) to private addresses
]
NAMES = {"inside.test": ["10.9.8.7"], "mixed.test": [PUBLIC, "127.0.0.1"],
         "public.test": [PUBLIC]}


class Resolver:
    """A DNS answer per name; `answers` changes the answer on each lookup (rebinding)."""

    def __init__(self, answers: dict[str, list[list[str]]] | None = None) -> None:
        self.answers = answers or {}
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        if host in self.answers:
            return self.answers[host][min(len(self.lookups), len(self.answers[host])) - 1]
        if host in NAMES:
            return NAMES[host]
        infos = await asyncio.get_running_loop().getaddrinfo(host, port)
        return [str(i[4][0]) for i in infos]


class Recorder(httpx.AsyncBaseTransport):
    """The outgoing connection, recorded instead of made (the address is public)."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200)


def sender(resolver: Resolver, transport: httpx.AsyncBaseTransport | None = None,
           **cfg: Any) -> WebhookSender:
    return WebhookSender(JobsConfig(webhook_backoff_s=0, **cfg), resolve=resolver,
                         transport=transport)


@pytest.mark.parametrize("url", REFUSED)
def test_addresses_that_are_not_global_are_refused(url: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(sender(Resolver()).check(url))
    assert refused.value.param == "notify.webhook"
    assert refused.value.status == 400


def test_public_addresses_pass_and_allow_private_lifts_the_check() -> None:
    for url in (f"http://{PUBLIC}/h", "https://public.test/h", "http://[2606:4700::1111]/h",
                "http://[64:ff9b::808:808]/h"):  # NAT64 of a public address
        asyncio.run(sender(Resolver()).check(url))
    asyncio.run(sender(Resolver(), webhook_allow_private=True).check("http://10.0.0.1/h"))


def test_a_changing_dns_answer_is_not_followed() -> None:
    """The name answers a public address, then loopback: the one lookup of the send is
    checked and connected to; the second answer is never used."""
    resolver = Resolver({"rebind.test": [[PUBLIC], ["127.0.0.1"]]})
    transport = Recorder()
    out = asyncio.run(sender(resolver, transport).send(
        "https://rebind.test:8443/hook?token=abc", {"type": "x"}, key="job-1",
        secret="whsec_" + base64.b64encode(b"k" * 32).decode()))
    assert out == "sent"
    assert resolver.lookups == ["rebind.test"]  # one lookup for the send, none by httpx
    (request,) = transport.requests
    assert request.url.host == PUBLIC and request.url.port == 8443
    assert request.url.query == b"token=abc"
    assert request.headers["host"] == "rebind.test:8443"
    assert request.extensions["sni_hostname"] == "rebind.test"  # TLS checks the name
    # the next send looks up again and finds loopback: refused, nothing connected
    out = asyncio.run(sender(resolver, transport).send(
        "https://rebind.test:8443/hook", {"type": "x"}, key="job-1", secret="whsec_AAAA"))
    assert out == "failed: refused" and len(transport.requests) == 1


def test_failures_say_fixed_words_and_the_log_has_no_query(
        caplog: pytest.LogCaptureFixture) -> None:
    import socket

    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    caplog.set_level(logging.WARNING)
    out = asyncio.run(sender(Resolver(), webhook_allow_private=True, webhook_attempts=1).send(
        f"http://127.0.0.1:{port}/hook?token=very-secret", {"type": "x"}, key="job-2",
        secret="whsec_AAAA"))
    assert out == "failed: could not connect"
    assert "very-secret" not in caplog.text and f"127.0.0.1:{port}/hook" in caplog.text
    out = asyncio.run(sender(Resolver()).send("http://inside.test/h?token=very-secret",
                                              {"type": "x"}, key="job-3", secret="whsec_AAAA"))
    assert out == "failed: refused" and "very-secret" not in caplog.text


# -- through the server ----------------------------------------------------------------
class SlowHook:
    """A real HTTP endpoint that holds every request until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[tuple[dict[str, str], bytes]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                hook.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                hook.release.wait(30)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


KEYS = {"a": "sk-tenant-a", "b": "sk-tenant-b"}


def h(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


@pytest.fixture
def hook() -> Iterator[SlowHook]:
    slow = SlowHook()
    yield slow
    slow.close()


def make_client(tmp_path: Path, **jobs: Any) -> TestClient:
    keys = [{"name": f"tenant-{k}", "sha256": digest(v)} for k, v in KEYS.items()]
    cfg = load_config(server={"data_dir": str(tmp_path / "data")}, routing={"classifier": "off"},
                      cache={"enabled": False}, auth={"keys": keys},
                      jobs={"lease_s": 3, "concurrency": 1, **jobs})
    return TestClient(create_app(cfg, backends={"fake": FakeBackend()}))


def test_the_api_refuses_inside_addresses_without_detail(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        for url in ("http://localhost:9/x", "http://169.254.169.254/x", "http://[::ffff:10.0.0.1]/x",
                    "http://100.64.1.1/x"):
            r = c.post("/v1/chat/completions", headers=h("a"),
                       json={**CHAT, "background": True, "notify": {"webhook": url}})
            assert r.status_code == 400, url
            err = r.json()["error"]
            assert err["param"] == "notify.webhook" and err["type"] == "invalid_request_error"
            assert "Errno" not in err["message"] and "Error" not in err["message"]


def test_a_slow_endpoint_holds_no_worker_and_no_delete(tmp_path: Path, hook: SlowHook) -> None:
    """One job slot (concurrency 1): while the first job's webhook is held open by its
    endpoint, the next job still runs, and a DELETE answers at once."""
    with make_client(tmp_path, webhook_allow_private=True) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        first = c.post("/v1/chat/completions", headers=h("a"),
                       json={**CHAT, "background": True, "notify": {"webhook": hook.url}}).json()
        wait_until(lambda: len(hook.calls) == 1)  # the endpoint holds the delivery now
        second = c.post("/v1/chat/completions", headers=h("a"),
                        json={**CHAT, "background": True}).json()
        assert wait_job(_As(c, "a"), second["id"])["status"] == "succeeded"
        assert c.get(f"/v1/jobs/{first['id']}", headers=h("a")).json()["notifications"] == {
            "webhook": "sending"}
        # a queued job with a webhook, cancelled: the DELETE answers while its webhook waits
        services_of(c.app).jobs.worker.ready = lambda: False
        third = c.post("/v1/chat/completions", headers=h("a"),
                       json={**CHAT, "background": True, "notify": {"webhook": hook.url}}).json()
        r = c.delete(f"/v1/jobs/{third['id']}", headers=h("a"))
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        assert r.json()["notifications"]["webhook"] in ("pending", "sending")
        hook.release.set()
        wait_until(lambda: c.get(f"/v1/jobs/{third['id']}", headers=h("a")).json()
                   ["notifications"] == {"webhook": "sent"})


def test_standard_webhooks_signature_per_tenant(tmp_path: Path, hook: SlowHook) -> None:
    hook.release.set()
    with make_client(tmp_path, webhook_allow_private=True) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        secret_a = c.get("/v1/webhook_secret", headers=h("a")).json()["secret"]
        secret_b = c.get("/v1/webhook_secret", headers=h("b")).json()["secret"]
        assert secret_a.startswith("whsec_") and secret_a != secret_b
        job = c.post("/v1/chat/completions", headers=h("a"),
                     json={**CHAT, "background": True, "notify": {"webhook": hook.url}}).json()
        wait_until(lambda: len(hook.calls) == 1)
        headers, body = hook.calls[0]
        msg = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
        key = base64.b64decode(secret_a.removeprefix("whsec_"))
        want = base64.b64encode(hmac.new(key, msg, hashlib.sha256).digest()).decode()
        assert headers["webhook-signature"] == "v1," + want
        assert headers["webhook-id"] == job["id"]
        other = base64.b64decode(secret_b.removeprefix("whsec_"))
        assert hmac.new(other, msg, hashlib.sha256).digest() != base64.b64decode(want)


class _As:
    def __init__(self, c: TestClient, who: str) -> None:
        self.c, self.who = c, who

    def get(self, path: str) -> Any:
        return self.c.get(path, headers=h(self.who))
