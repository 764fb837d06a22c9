"""What durable acceptance costs: JobService.submit (the work behind a 202: job record
+ queue entry) with `jobs.durable` on (SQLite synchronous=FULL, an fsync per commit on
the records and on the queue) and off (no fsync: survives a process kill, not a power
cut), interleaved in rounds in the same run so both see the same machine.

    .venv/bin/python bench/jobs_durable.py [--n 1000] [--rounds 5] [--dir /var/tmp]

`--dir` must be on a real disk (tmpfs makes fsync free and the figure meaningless).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redline.api.job_body import JobShapes, decode_body  # noqa: E402
from redline.backends.fake import FakeBackend  # noqa: E402
from redline.config import load_config  # noqa: E402
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


async def submits(data: Path, n: int, durable: bool) -> list[float]:
    cfg = load_config(server={"data_dir": str(data)}, jobs={"durable": durable}).jobs
    metrics = Metrics()
    root = load_config(server={"data_dir": str(data)}, jobs={"durable": durable})
    router = Router({"fake": FakeBackend()}, "fake", root.routing, metrics)
    pipeline = Pipeline(router, metrics)
    svc = JobService(cfg, data, None, pipeline, metrics.jobs, decode_body, JobShapes(root, pipeline, ResponseRecords(MemoryStore(), 60)))
    spec = JobSpec.of("chat", GenerationRequest(model="fake", sampling=SamplingParams(max_tokens=8),
                                                messages=(Message("user", "report"),)))
    for _ in range(20):  # warm-up
        await svc.submit(spec)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await svc.submit(spec)
        out.append(time.perf_counter() - t0)
    await svc.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000, help="submissions per setting and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="jobs-durable-", dir=a.dir))
    got: dict[bool, list[float]] = {True: [], False: []}
    try:
        for r in range(a.rounds):
            for durable in ((False, True) if r % 2 else (True, False)):
                got[durable] += asyncio.run(submits(tmp / f"{durable}-{r}", a.n, durable))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for durable, xs in got.items():
        name = "durable (synchronous=FULL)" if durable else "not durable (no fsync)"
        print(f"{name:<28} n={len(xs):<6} p50={pct(xs, 50):6.2f} ms  p99={pct(xs, 99):6.2f} ms"
              f"  max={max(xs) * 1000:7.2f} ms  mean={statistics.mean(xs) * 1000:6.2f} ms")


if __name__ == "__main__":
    main()
