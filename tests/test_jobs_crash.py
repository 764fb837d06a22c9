"""A job accepted with 202 is never lost: kill -9 of the server with queued and
running jobs, kill -9 of a `redline worker` mid-job (two workers on a real Redis).
After restart every job finishes with one result and one notification per channel."""

from __future__ import annotations

import collections
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from jobs_support import (
    Proc,
    WebhookReceiver,
    redis_server,
    smtp_server,
    start_upstream,
    upstream_config,
    wait_job,
    wait_until,
)

from redline.jobs.model import Job
from redline.jobs.records_redis import RedisRecords

pytestmark = pytest.mark.slow
TOKENS = 40  # at 20 ms a token: a job runs about a second


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    proc, url = start_upstream(tmp_path)
    yield url
    proc.stop()


def submit(client: httpx.Client, notify: dict[str, str], n: int) -> list[str]:
    ids = []
    for i in range(n):
        r = client.post("/v1/chat/completions", json={
            "model": "up", "max_tokens": TOKENS, "background": True, "notify": notify,
            "messages": [{"role": "user", "content": f"report {i}"}]})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    return ids


def statuses(client: httpx.Client, ids: list[str]) -> collections.Counter[str]:
    return collections.Counter(client.get(f"/v1/jobs/{i}").json()["status"] for i in ids)


def check_done(client: httpx.Client, ids: list[str]) -> None:
    for job_id in ids:
        job = wait_job(client, job_id, timeout=90)
        assert job["status"] == "succeeded", job
        assert job["result"]["usage"]["completion_tokens"] == TOKENS


def test_kill_9_server_with_queued_and_running_jobs(server_factory: Any, upstream: str) -> None:
    with WebhookReceiver() as hook, smtp_server() as (mail, smtp_port):
        cfg = upstream_config(upstream, concurrency=1,
                              smtp={"host": "127.0.0.1", "port": smtp_port, "tls": "none"})
        first = server_factory(cfg)
        with httpx.Client(base_url=first.url, timeout=30) as c:
            ids = submit(c, {"webhook": hook.url, "email": "ops@example.com"}, 5)
            wait_until(lambda: statuses(c, ids)["running"] == 1)
            time.sleep(0.3)  # mid-job
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL

        second = server_factory(cfg)  # same data dir: the SQLite queue and job book
        with httpx.Client(base_url=second.url, timeout=30) as c:
            check_done(c, ids)
            wait_until(lambda: set(hook.keys()) == set(ids) and len(mail.messages) == len(ids))
            time.sleep(2 * 2 + 1)  # past a lease: nothing is re-sent
            assert sorted(hook.keys()) == sorted(ids)  # one webhook per job
            assert len(mail.messages) == len(ids)  # one e-mail per job
            for job_id in ids:
                assert c.get(f"/v1/jobs/{job_id}").json()["notifications"] == {
                    "webhook": "sent", "email": "sent"}


def _worker(tmp: Path, cfg: dict[str, Any], name: str) -> Proc:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**cfg, "server": {"data_dir": str(tmp / name)}}))
    return Proc(["redline.cli", "worker", "--config", str(path)], tmp, name)


def test_two_workers_on_redis_and_kill_9_of_one(server_factory: Any, upstream: str,
                                                tmp_path: Path) -> None:
    with redis_server(tmp_path) as redis_url, WebhookReceiver() as hook:
        cfg = {**upstream_config(upstream, concurrency=1), "store": {"url": redis_url}}
        server_cfg = {**cfg, "jobs": {**cfg["jobs"], "worker_in_server": False}}
        server = server_factory(server_cfg)
        w1, w2 = _worker(tmp_path, cfg, "w1"), _worker(tmp_path, cfg, "w2")
        records = RedisRecords(redis_url)

        def ran_by(job_id: str) -> str:
            raw = records.get("job:" + job_id)
            assert raw is not None
            return str(Job.loads(raw).meta["worker"])

        try:
            with httpx.Client(base_url=server.url, timeout=30) as c:
                warm = submit(c, {"webhook": hook.url}, 4)
                check_done(c, warm)
                assert len({ran_by(j) for j in warm}) == 2  # both workers share the queue

                ids = submit(c, {"webhook": hook.url}, 6)
                wait_until(lambda: statuses(c, ids)["running"] == 2)
                time.sleep(0.3)
                w1.stop(signal.SIGKILL)
                check_done(c, ids)
                wait_until(lambda: set(hook.keys()) == set(warm + ids))
                time.sleep(2 * 2 + 1)
                assert sorted(hook.keys()) == sorted(warm + ids)
        finally:
            w1.stop()
            w2.stop()
            records.close()
