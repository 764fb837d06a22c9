"""Redis killed mid-run (a real redis-server started here): every request is still
answered, right, without the cache; rate limits count in memory meanwhile; a job is
never accepted (202) when it cannot be queued."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port
from resilience_server import HardenedServer, fake_config

from redline.api.services import services_of

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")]


class Redis:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    r = Redis(tmp_path)
    yield r
    if r.proc.poll() is None:
        r.kill()


def chat(i: int) -> dict[str, Any]:
    # a few questions asked again and again: cache hits while Redis is up
    return {"model": "fake", "max_tokens": 5, "temperature": 0,
            "messages": [{"role": "user", "content": f"question {i % 7}"}]}


EXPECTED = "lorem ipsum dolor sit amet"


def run_requests(c: httpx.Client, n: int, start: int) -> list[tuple[int, str, float]]:
    out = []
    for i in range(start, start + n):
        t0 = time.perf_counter()
        r = c.post("/v1/chat/completions", json=chat(i))
        dt = time.perf_counter() - t0
        text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text
        out.append((r.status_code, text, dt))
    return out


def test_redis_killed_mid_run(tmp_path: Path, redis: Redis) -> None:
    cfg = fake_config(tmp_path, store={"url": redis.url},
                      cache={"enabled": True, "semantic": False},
                      limits={"rpm": 100000})
    with HardenedServer(cfg) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        before = run_requests(c, 40, 0)
        hits_before = server.backend.calls
        redis.kill()
        after = run_requests(c, 60, 40)
        lost = [r for r in before + after if r[0] != 200 or r[1] != EXPECTED]
        assert lost == [], lost[:5]
        assert hits_before < 40  # the cache answered some while Redis was up
        assert server.backend.calls - hits_before == 60  # after: the model answered all
        limiter = services_of(server.app).limiter
        assert limiter.broken  # counting in memory now
        # the store's breaker is open: no reconnect per call
        assert not services_of(server.app).store.available
        job = c.post("/v1/chat/completions", json={**chat(0), "background": True})
        assert job.status_code == 503, job.text
        assert job.json()["error"]["type"] == "overloaded_error" and "retry-after" in job.headers
