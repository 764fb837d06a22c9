"""202 means kept: acceptance fsyncs (SQLite synchronous=FULL on the records and the
queue), a paused Redis is a prompt 503 (the jobs' Redis clients have timeouts), an
Idempotency-Key returns the first job; and a batch's input has bounds, its validation
errors go to an error file."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port
from fastapi.testclient import TestClient
from jobs_support import wait_job, wait_until

from redline.api.app import create_app
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.config import load_config

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "write a report"}],
        "max_tokens": 5}


def make_client(tmp_path: Path, backend: FakeBackend | None = None, store_url: str | None = None,
                **jobs: Any) -> TestClient:
    cfg = load_config(server={"data_dir": str(tmp_path / "data")}, routing={"classifier": "off"},
                      cache={"enabled": False}, store={"url": store_url},
                      jobs={"lease_s": 3, **jobs})
    return TestClient(create_app(cfg, backends={"fake": backend or FakeBackend()}))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path, batch_max_lines=3, batch_max_bytes=2048) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        yield c


@pytest.mark.parametrize(("durable", "records", "queue"), [(True, 2, 2), (False, 1, 0)])
def test_acceptance_fsyncs_when_durable(tmp_path: Path, durable: bool, records: int,
                                        queue: int) -> None:
    """synchronous: 2 = FULL (the WAL is fsynced at each commit: a power cut keeps an
    accepted job), 1 = NORMAL, 0 = OFF (a process kill keeps it, a power cut may not)."""
    with make_client(tmp_path, durable=durable) as c:
        jobs = services_of(c.app).jobs
        assert jobs.records._db.execute("pragma synchronous").fetchone()[0] == records
        conn = jobs.queue.storage.conn
        assert conn.execute("pragma synchronous").fetchone()[0] == queue


def test_idempotency_key_returns_the_first_job(tmp_path: Path) -> None:
    backend = FakeBackend()
    with make_client(tmp_path, backend) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        body = {**CHAT, "background": True}
        first = c.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k-1"})
        again = c.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == again.status_code == 202
        assert first.json()["id"] == again.json()["id"]
        wait_job(c, first.json()["id"])
        third = c.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k-1"})
        assert third.json()["id"] == first.json()["id"] and third.json()["status"] == "succeeded"
        assert backend.calls == 1  # ran once
        other = c.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "k-2"})
        assert other.json()["id"] != first.json()["id"]
        # the same key for another request is refused, not answered with the first job
        r = c.post("/v1/chat/completions", json={**body, "max_tokens": 7},
                   headers={"Idempotency-Key": "k-1"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "idempotency_key_reused"
        # another tenant (an open server: its bearer token) has keys of its own
        r = c.post("/v1/chat/completions", json=body,
                   headers={"Idempotency-Key": "k-1", "Authorization": "Bearer someone-else"})
        assert r.status_code == 202 and r.json()["id"] != first.json()["id"]
        assert c.post("/v1/chat/completions", json=body,
                      headers={"Idempotency-Key": "x" * 256}).status_code == 400


def upload(c: TestClient, lines: list[Any]) -> str:
    raw = "".join(json.dumps(x) + "\n" for x in lines).encode()
    r = c.post("/v1/files", data={"purpose": "batch"},
               files={"file": ("in.jsonl", io.BytesIO(raw), "application/jsonl")})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def line(i: int) -> dict[str, Any]:
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "fake", "messages": [{"role": "user", "content": "q"}]}}


def create(c: TestClient, file_id: str, **headers: str) -> httpx.Response:
    return c.post("/v1/batches", headers=headers, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions"})


def test_batch_input_bounds(client: TestClient) -> None:
    r = create(client, upload(client, [line(i) for i in range(4)]))  # the cap is 3 here
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_requests_in_batch"
    assert r.json()["error"]["param"] == "input_file_id"
    big = [{**line(i), "body": {**line(i)["body"], "user": "u" * 900}} for i in range(3)]
    r = create(client, upload(client, big))  # 3 lines, but over 2048 bytes
    assert r.status_code == 400 and r.json()["error"]["code"] == "file_too_large"
    r = create(client, upload(client, [line(i) for i in range(3)]), **{"Idempotency-Key": "b"})
    assert r.status_code == 200
    again = create(client, r.json()["input_file_id"], **{"Idempotency-Key": "b"})
    assert again.json()["id"] == r.json()["id"]


def test_validation_errors_go_to_an_error_file(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        bad = [{"custom_id": f"r{i}", "url": "/v1/chat/completions", "body": "nope"}
               for i in range(30)]
        batch = create(c, upload(c, bad)).json()
        assert batch["status"] == "failed"
        assert len(batch["errors"]["data"]) == 10  # the first few, inline
        content = c.get(f"/v1/files/{batch['error_file_id']}/content").text.splitlines()
        assert [json.loads(x)["line"] for x in content] == list(range(1, 31))
        # the error file is the batch tenant's
        assert c.get(f"/v1/files/{batch['error_file_id']}",
                     headers={"Authorization": "Bearer someone-else"}).status_code == 404


@pytest.fixture
def paused_redis(tmp_path: Path) -> Iterator[tuple[str, int]]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    url = f"redis://127.0.0.1:{port}/0"
    wait_until(lambda: _pings(redis.Redis.from_url(url)), timeout=10)
    try:
        yield url, proc.pid
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)


def _pings(r: Any) -> bool:
    try:
        return bool(r.ping())
    except Exception:
        return False


def test_a_paused_redis_is_a_prompt_503(tmp_path: Path, paused_redis: tuple[str, int]) -> None:
    """SIGSTOP: the server accepts connections (the kernel does) and never answers. The
    submission and the read are refused with 503 + Retry-After within the client's
    timeout, which is a bound on a hang, not a timing measurement."""
    url, pid = paused_redis
    with make_client(tmp_path, store_url=url, redis_timeout_s=0.5) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        job = c.post("/v1/chat/completions", json={**CHAT, "background": True}).json()
        wait_job(c, job["id"])
        os.kill(pid, signal.SIGSTOP)
        try:
            r = c.post("/v1/chat/completions", json={**CHAT, "background": True})
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] and r.json()["error"]["code"] == "store_unavailable"
            r = c.get(f"/v1/jobs/{job['id']}")
            assert r.status_code == 503, r.text
        finally:
            os.kill(pid, signal.SIGCONT)
        assert c.get(f"/v1/jobs/{job['id']}").status_code == 200
