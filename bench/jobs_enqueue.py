"""Enqueue latency of the async tier: the time to make a job durable and queued.

    .venv/bin/python bench/jobs_enqueue.py [--n 2000] [--http 500] [--redis]

Three figures, same run: JobService.submit in process (job record + huey enqueue, the
work behind a 202), POST /v1/chat/completions {"background": true} → 202 over HTTP
against a real `redline serve`, and the baseline: huey's bare storage.enqueue alone.
The workers are off, so nothing else competes for the store.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from jobs_support import redis_server, start_upstream, upstream_config  # noqa: E402

from redline.api.job_body import JobShapes, decode_body  # noqa: E402
from redline.backends.fake import FakeBackend  # noqa: E402
from redline.config import RoutingConfig, load_config  # noqa: E402
from redline.jobs.service import JobService  # noqa: E402
from redline.jobs.spec import JobSpec  # noqa: E402
from redline.pipeline import Pipeline  # noqa: E402
from redline.responses import ResponseRecords  # noqa: E402
from redline.routing.router import Router  # noqa: E402
from redline.store.memory import MemoryStore  # noqa: E402
from redline.telemetry.metrics import Metrics  # noqa: E402
from redline.types import GenerationRequest, Message, SamplingParams  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] * 1000


def line(name: str, xs: list[float]) -> str:
    return (f"{name:<44} n={len(xs):<5} p50={pct(xs, 50):6.2f} ms  p99={pct(xs, 99):6.2f} ms  "
            f"max={max(xs) * 1000:6.2f} ms  mean={statistics.mean(xs) * 1000:6.2f} ms")


async def in_process(data: Path, n: int, store_url: str | None) -> tuple[list[float], list[float]]:
    cfg = load_config(server={"data_dir": str(data)}).jobs
    metrics = Metrics()
    pipeline = Pipeline(Router({"fake": FakeBackend()}, "fake", RoutingConfig(), metrics), metrics)
    svc = JobService(cfg, data, store_url, pipeline, metrics.jobs, decode_body,
                     JobShapes(load_config(), pipeline, ResponseRecords(MemoryStore(), 60)))
    spec = JobSpec.of("chat", GenerationRequest(model="fake", sampling=SamplingParams(max_tokens=8),
                                                messages=(Message("user", "report"),)))
    submit, bare = [], []
    for _ in range(50):  # warm-up
        await svc.submit(spec)
    for _ in range(n):
        t0 = time.perf_counter()
        await svc.submit(spec)
        submit.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        svc.queue.storage.enqueue(b"job-baseline")  # huey alone, no record, no thread hop
        bare.append(time.perf_counter() - t0)
    await svc.stop()
    return submit, bare


def over_http(tmp: Path, n: int) -> list[float]:
    import conftest

    up, url = start_upstream(tmp)
    cfg = upstream_config(url, worker_in_server=False)
    server = conftest.ServerProcess(cfg, tmp).start()
    body = {"model": "up", "max_tokens": 8, "background": True,
            "messages": [{"role": "user", "content": "report"}]}
    out = []
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            for _ in range(50):
                c.post("/v1/chat/completions", json=body)
            for _ in range(n):
                t0 = time.perf_counter()
                r = c.post("/v1/chat/completions", json=body)
                out.append(time.perf_counter() - t0)
                assert r.status_code == 202, r.text
    finally:
        server.stop()
        up.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--http", type=int, default=500)
    ap.add_argument("--redis", action="store_true", help="also on a local redis-server")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="jobs-enqueue-"))
    try:
        submit, bare = asyncio.run(in_process(tmp / "sqlite", a.n, None))
        print(line("SQLite: JobService.submit (record + enqueue)", submit))
        print(line("SQLite: huey storage.enqueue alone (baseline)", bare))
        if a.redis:
            with redis_server(tmp) as url:
                submit, bare = asyncio.run(in_process(tmp / "redis", a.n, url))
            print(line("Redis: JobService.submit (record + enqueue)", submit))
            print(line("Redis: huey storage.enqueue alone (baseline)", bare))
        if a.http:
            print(line("HTTP: POST background → 202 (real server)", over_http(tmp, a.http)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
