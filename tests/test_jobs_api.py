"""The async tier in process, on a FakeBackend: 202 + job object, GET/DELETE,
notifications to a real webhook receiver and a real SMTP server, scheduled jobs."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jobs_support import WebhookReceiver, smtp_server, wait_job, wait_until

from redline.api.app import create_app
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.config import load_config

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "write a report"}],
        "max_tokens": 5}


def make_client(tmp_path: Path, backend: FakeBackend | None = None, **jobs: Any) -> TestClient:
    cfg = load_config(server={"data_dir": str(tmp_path / "data")}, routing={"classifier": "off"},
                      cache={"semantic": False},
                      jobs={"lease_s": 3, "webhook_backoff_s": 0.05, **jobs})
    app = create_app(cfg, backends={"fake": backend or FakeBackend()})
    return TestClient(app)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        yield c


def test_background_answers_202_then_the_result(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "background": True})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] in ("queued", "running") and job["result"] is None
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    done = wait_job(client, job["id"])
    assert done["status"] == "succeeded"
    assert done["finished_at"] >= done["created_at"]
    assert done["result"]["object"] == "chat.completion"
    assert done["result"]["choices"][0]["message"]["content"] == "lorem ipsum dolor sit amet"
    assert done["result"]["usage"]["completion_tokens"] == 5


def test_allow_background_degrades_a_request_that_would_miss_to_a_job(tmp_path: Path) -> None:
    backend = FakeBackend()
    with make_client(tmp_path, backend) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        r = c.post("/v1/chat/completions", json={**CHAT, "tier": "S", "allow_background": True})
        assert r.status_code == 200  # no history yet: nothing predicts a miss
        router = services_of(c.app).pipeline.router
        for _ in range(10):  # the replica is now seen as 2 s to first token; S allows 1 s
            router.estimates.of(backend).observe_ttft(2.0, 0, 10)
        r = c.post("/v1/chat/completions", json={**CHAT, "tier": "S", "stream": True})
        assert r.status_code == 200 and r.headers["x-redline-tier"] == "S"  # no opt-in: served
        r = c.post("/v1/chat/completions", json={**CHAT, "tier": "S", "allow_background": True})
        assert r.status_code == 202, r.text
        assert r.headers["x-redline-tier"] == "B" and r.headers["x-redline-degraded"] == "background"
        done = wait_job(c, r.json()["id"])
        assert done["status"] == "succeeded"
        assert done["result"]["choices"][0]["message"]["content"] == "lorem ipsum dolor sit amet"
        metrics = c.get("/metrics").text
        assert 'redline_degradations_total{action="background",tier="S"} 1.0' in metrics


def test_tier_b_header_and_text_completions(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 3},
                    headers={"X-Redline-Tier": "B"})
    assert r.status_code == 202
    done = wait_job(client, r.json()["id"])
    assert done["result"]["object"] == "text_completion"
    assert done["result"]["choices"][0]["text"] == "lorem ipsum dolor"


def test_unknown_job_and_bad_model(client: TestClient) -> None:
    r = client.get("/v1/jobs/job-nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    assert client.delete("/v1/jobs/job-nope").status_code == 404
    r = client.post("/v1/chat/completions", json={**CHAT, "model": "nope", "background": True})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_cancel_a_queued_job(tmp_path: Path) -> None:
    with make_client(tmp_path, worker_in_server=False) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        job = c.post("/v1/chat/completions", json={**CHAT, "background": True}).json()
        r = c.delete(f"/v1/jobs/{job['id']}")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        assert c.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"


def test_cancel_a_running_job(tmp_path: Path) -> None:
    slow = FakeBackend(tpot_s=0.05)
    with make_client(tmp_path, backend=slow) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        job = c.post("/v1/chat/completions",
                     json={**CHAT, "max_tokens": 400, "background": True}).json()
        wait_until(lambda: c.get(f"/v1/jobs/{job['id']}").json()["status"] == "running")
        c.delete(f"/v1/jobs/{job['id']}")
        done = wait_job(c, job["id"], timeout=15)
        assert done["status"] == "cancelled" and done["result"] is None
        wait_until(lambda: slow.cancelled == 1)


def test_webhook_signed_once_with_retries(tmp_path: Path) -> None:
    with WebhookReceiver(fail_first=2) as hook, \
            make_client(tmp_path, webhook_secret="s3cret", webhook_allow_private=True) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        job = c.post("/v1/chat/completions", json={**CHAT, "background": True,
                                                   "notify": {"webhook": hook.url}}).json()
        done = wait_job(c, job["id"])
        wait_until(lambda: c.get(f"/v1/jobs/{job['id']}").json()["notifications"]
                   == {"webhook": "sent"})
        assert len(hook.calls) == 3  # two 500s, then delivered
        assert set(hook.keys()) == {job["id"]}
        headers, body = hook.calls[-1]
        want = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
        assert headers["x-redline-signature"] == want
        event = hook.events()[-1]
        assert event["type"] == "completion.succeeded"
        assert event["data"]["id"] == job["id"]
        assert event["data"]["result"] == done["result"]
        time.sleep(1.5)  # the reaper must not send it again
        assert len(hook.calls) == 3


def test_webhook_to_loopback_is_refused_by_default(client: TestClient) -> None:
    for url in ("http://127.0.0.1:9/x", "http://localhost/x", "http://10.1.2.3/x",
                "http://[::1]/x", "ftp://example.com/x", "not a url"):
        r = client.post("/v1/chat/completions", json={**CHAT, "background": True,
                                                      "notify": {"webhook": url}})
        assert r.status_code == 400, url
        assert r.json()["error"]["param"] == "notify.webhook"


def test_email_through_a_real_smtp_server(tmp_path: Path) -> None:
    with smtp_server() as (sink, port), make_client(
            tmp_path, smtp={"host": "127.0.0.1", "port": port, "tls": "none",
                            "sender": "jobs@redline.test"}) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        job = c.post("/v1/chat/completions", json={**CHAT, "background": True,
                                                   "notify": {"email": "ann@example.com"}}).json()
        wait_job(c, job["id"])
        wait_until(lambda: len(sink.messages) == 1)
        rcpt, raw = sink.messages[0]
        assert rcpt == ["ann@example.com"]
        assert f"Message-ID: <{job['id']}@redline>".encode() in raw
        assert b"lorem ipsum" in raw
        time.sleep(1.5)
        assert len(sink.messages) == 1


def test_email_refused_when_not_configured_or_bad(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "background": True,
                                                  "notify": {"email": "ann@example.com"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "notify.email"


def test_jobs_gauge(client: TestClient) -> None:
    job = client.post("/v1/chat/completions", json={**CHAT, "background": True}).json()
    wait_job(client, job["id"])

    def succeeded() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith('redline_jobs{status="succeeded"}'):
                return float(line.split()[-1])
        return 0.0
    wait_until(lambda: succeeded() >= 1, timeout=10)


def test_scheduled_precompute_once_per_minute(tmp_path: Path) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "kpis"}],
            "max_tokens": 2, "temperature": 0}
    schedule = [{"name": "daily-report", "cron": "*/5 * * * *", "body": body}]
    backend = FakeBackend()
    with make_client(tmp_path, backend=backend, schedule=schedule) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        jobs = services_of(c.app).jobs
        minute = dt.datetime(2025, 1, 1, 10, 5)
        created = c.portal.call(jobs.scheduler.tick, minute)  # type: ignore[union-attr]
        again = c.portal.call(jobs.scheduler.tick, minute)  # type: ignore[union-attr]
        off = c.portal.call(jobs.scheduler.tick, minute.replace(minute=6))  # type: ignore[union-attr]
        assert len(created) == 1 and again == [] and off == []
        # unguessable (keyed with the workers' shared secret), the same on every worker
        assert created[0] == jobs.scheduler.job_id("daily-report", minute)
        assert created[0].startswith("job-sched-") and "daily-report" not in created[0]
        assert len(created[0]) == len("job-sched-") + 32
        done = wait_job(c, created[0])
        assert done["status"] == "succeeded"
        assert done["result"]["choices"][0]["message"]["content"] == "lorem ipsum"
        # the precomputed answer is in the cache: the user's question is a hit
        calls = backend.calls
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["x-redline-cache"] == "hit"
        assert r.json()["choices"][0]["message"]["content"] == "lorem ipsum"
        assert backend.calls == calls
