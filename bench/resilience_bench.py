"""Resilience figures for docs/BENCHMARKS.md (issue 9). Each mode starts its own server
process (FakeBackend behind the hardened server: the figures are about the serving
layer, not the model) and a load generator in this process.

    flock /tmp/redline-cpu.lock .venv/bin/python bench/resilience_bench.py slowloris
    flock /tmp/redline-cpu.lock .venv/bin/python bench/resilience_bench.py redis
    flock /tmp/redline-cpu.lock .venv/bin/python bench/resilience_bench.py soak --warmup 300 --seconds 600
    flock /tmp/redline-cpu.lock .venv/bin/python bench/resilience_bench.py fuzz --examples 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = "lorem ipsum dolor sit amet " * 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the server process ------------------------------------------------------------
def serve(port: int, config: dict[str, Any]) -> None:
    from redline.api.app import create_app
    from redline.api.server import run
    from redline.backends.fake import FakeBackend
    from redline.config import RedlineConfig

    cfg = RedlineConfig(**config)
    app = create_app(cfg, backends={"fake": FakeBackend("fake", ttft_s=0.02, tpot_s=0.004)})
    run(app, "127.0.0.1", port, cfg.limits, "warning")


class Server:
    def __init__(self, tmp: Path, **sections: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"server": {"data_dir": str(tmp)}, "store": {"url": "memory://"},
                  "cache": {"enabled": False}, **sections}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "_serve", "--port", str(self.port), "--config", json.dumps(config)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "ab"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server not ready")

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


# -- the load generator ---------------------------------------------------------------
async def load(url: str, seconds: float, concurrency: int, prompt_kinds: int = 1000,
               on_tick: Any = None, first: int = 0) -> list[tuple[float, int, bool]]:
    """Closed loop: `concurrency` clients, each sends the next request when the last is
    answered. Returns (latency s, status, answer right) per request."""
    out: list[tuple[float, int, bool]] = []
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def client(k: int, c: httpx.AsyncClient) -> None:
        i = first + k  # `first`: a phase that must not repeat an earlier phase's questions
        while time.monotonic() < stop:
            body = {"model": "fake", "max_tokens": 20, "temperature": 0,
                    "messages": [{"role": "user", "content": f"question {i % prompt_kinds}"}]}
            i += concurrency
            t0 = time.perf_counter()
            try:
                r = await c.post("/v1/chat/completions", json=body)
                ok = r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == EXPECTED.strip()
                out.append((time.perf_counter() - t0, r.status_code, ok))
            except httpx.HTTPError:
                out.append((time.perf_counter() - t0, 0, False))

    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as c:
        tasks = [asyncio.create_task(client(k, c)) for k in range(concurrency)]
        if on_tick is not None:
            tasks.append(asyncio.create_task(on_tick()))
        await asyncio.gather(*tasks)
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def summary(rows: list[tuple[float, int, bool]], seconds: float) -> dict[str, Any]:
    lat = [r[0] for r in rows if r[1] == 200]
    return {"requests": len(rows), "rps": round(len(rows) / seconds, 1),
            "bad": sum(1 for r in rows if not r[2]),
            "statuses": {str(s): sum(1 for r in rows if r[1] == s) for s in sorted({r[1] for r in rows})},
            "p50_ms": round(pct(lat, 50) * 1000, 1), "p99_ms": round(pct(lat, 99) * 1000, 1)}


# -- modes --------------------------------------------------------------------------------
def slowloris(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    if shutil.which("slowhttptest") is None:
        raise SystemExit("apt-get install slowhttptest")
    server = Server(tmp)
    try:
        asyncio.run(load(server.url, 3, args.concurrency))  # warm-up
        base = summary(asyncio.run(load(server.url, args.seconds, args.concurrency)), args.seconds)
        attack = subprocess.Popen(
            ["slowhttptest", "-H", "-c", str(args.connections), "-r", str(args.rate), "-i", "5",
             "-l", str(int(args.seconds + 15)), "-u", server.url + "/v1/chat/completions", "-t", "POST",
             "-p", "3", "-g", "-o", str(tmp / "slowloris")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(5)  # the attack's connections are open
        hit = summary(asyncio.run(load(server.url, args.seconds, args.concurrency)), args.seconds)
        attack.wait(timeout=args.seconds + 60)
        report = (tmp / "slowloris.csv").read_text().strip().splitlines()
        rows = [r.split(",") for r in report[1:]]
        return {"baseline": base, "under_attack": hit,
                "p99_ratio": round(hit["p99_ms"] / base["p99_ms"], 2),
                "attack": {"connections": args.connections, "rate": args.rate,
                           "max_connected": max(int(r[3]) for r in rows),
                           "closed_by_server": max(int(r[1]) for r in rows),
                           "service_available_all_seconds": all(int(r[-1]) > 0 for r in rows)}}
    finally:
        server.stop()


def redis_kill(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    url = f"redis://127.0.0.1:{port}/0"
    server = Server(tmp, store={"url": url}, cache={"enabled": True, "semantic": False},
                    limits={"rpm": 1_000_000})
    phases: dict[str, list[tuple[float, int, bool]]] = {}
    try:
        asyncio.run(load(server.url, 3, args.concurrency, prompt_kinds=1_000_000))
        phases["redis_up"] = asyncio.run(load(server.url, args.seconds, args.concurrency,
                                              prompt_kinds=1_000_000, first=100_000))
        killed_at = time.monotonic()

        async def kill_now() -> None:
            redis.kill()

        phases["redis_killed"] = asyncio.run(load(server.url, args.seconds, args.concurrency,
                                                  prompt_kinds=1_000_000, on_tick=kill_now,
                                                  first=200_000))
        return {"kill_to_end_s": round(time.monotonic() - killed_at, 1),
                **{k: summary(v, args.seconds) for k, v in phases.items()},
                "lost_or_wrong": sum(1 for v in phases.values() for r in v if not r[2])}
    finally:
        server.stop()
        if redis.poll() is None:
            redis.kill()


def soak(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """RSS growth under a closed loop. With --warmup W the load runs W + seconds and the
    growth is measured over the last `seconds` only: the bounded structures (the exact
    cache's max_entries, the length history's keys) fill during W, and what is left to
    see is a leak. Without it, from 60 s on (the first runs' figure)."""
    server = Server(tmp, cache={"enabled": True, "semantic": False})
    samples: list[tuple[float, int]] = []
    t0 = time.monotonic()
    total = args.warmup + args.seconds

    async def sample() -> None:
        while time.monotonic() - t0 < total:
            samples.append((round(time.monotonic() - t0, 1), server.rss()))
            await asyncio.sleep(10)

    try:
        rows = asyncio.run(load(server.url, total, args.concurrency, prompt_kinds=100_000,
                                on_tick=sample))
        start = args.warmup if args.warmup else (60 if args.seconds > 120 else samples[1][0])
        warm = next(rss for t, rss in samples if t >= start)
        last = samples[-1][1]
        return {"seconds": args.seconds, "warmup_s": args.warmup, **summary(rows, total),
                "rss_at_start_of_measure_mib": round(warm / 2**20, 1),
                "measured_from_s": start, "rss_end_mib": round(last / 2**20, 1),
                "rss_growth_pct": round(100 * (last - warm) / warm, 2),
                "rss_samples_mib": [(t, round(r / 2**20, 1)) for t, r in samples]}
    finally:
        server.stop()


def fuzz(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    report = tmp / "fuzz.json"
    env = {**os.environ, "REDLINE_FUZZ_EXAMPLES": str(args.examples), "REDLINE_FUZZ_REPORT": str(report)}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_fuzz_api.py"], cwd=ROOT, env=env, capture_output=True, text=True)
    tally = json.loads(report.read_text()) if report.exists() else {}
    return {"pytest_rc": out.returncode, "seconds": round(time.monotonic() - t0, 1),
            "examples_per_operation_and_mode": args.examples, **tally,
            "tail": out.stdout.strip().splitlines()[-1:]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["slowloris", "redis", "soak", "fuzz", "_serve"])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--warmup", type=float, default=0, help="soak: seconds of load before the "
                   "RSS growth is measured")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--connections", type=int, default=500, help="slowloris connections")
    p.add_argument("--rate", type=int, default=100, help="slowloris connections opened per second")
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--port", type=int)
    p.add_argument("--config")
    args = p.parse_args()
    if args.mode == "_serve":
        serve(args.port, json.loads(args.config))
        return
    with tempfile.TemporaryDirectory() as d:
        fn = {"slowloris": slowloris, "redis": redis_kill, "soak": soak, "fuzz": fuzz}[args.mode]
        print(json.dumps(fn(args, Path(d)), indent=1))


if __name__ == "__main__":
    main()
