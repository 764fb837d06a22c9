"""Shared parts of the routing benchmarks: fake upstreams and redline gateways as real
processes on free loopback ports, and a streaming client that records TTFT per request."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from redline.backends.sse import data_payloads  # noqa: E402
from redline.bench.loadgen import no_gc_pauses  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MACHINE = "2-core x86_64 VM, 24 GiB, no GPU"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, path: str = "/readyz", timeout: float = 180.0,
            proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    """Until `url + path` answers 200. TimeoutError when it does not in time, or when
    `proc` (the server) exits first; its message ends with the tail of `log`, if given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    raise TimeoutError(f"{url} not ready" + (f":\n{tail}" if tail else ""))


class Procs:
    """Processes started by one benchmark; all are stopped at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="redline-bench-"))

    def start(self, args: list[str], url: str, path: str = "/readyz",
              cpus: set[int] | None = None, nice: int = 0, cwd: Path = ROOT,
              env: dict[str, str] | None = None, timeout: float = 180.0) -> str:
        """Start a server and wait for it (TimeoutError, with its log's tail, when it is
        not up in `timeout` or exits first); `cpus` pins it (threads and children too);
        `nice` sets its scheduling priority (below 0 needs root or CAP_SYS_NICE); `cwd`:
        the source tree whose `redline` a `python -m redline...` runs; `env`: more
        environment variables."""
        log_path = self.tmp / f"p{len(self.procs)}.log"
        log = open(log_path, "wb")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}

        def setup() -> None:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)
            if nice:
                os.setpriority(os.PRIO_PROCESS, 0, nice)
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=setup if cpus is not None or nice else None)
        self.procs.append(proc)
        wait_up(url, path, timeout, proc=proc, log=log_path)
        return url

    def upstream(self, **opts: Any) -> str:
        port = free_port()
        args = [sys.executable, "-m", "redline.backends.fake_upstream", "--port", str(port)]
        for k, v in opts.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        return self.start(args, f"http://127.0.0.1:{port}")

    def serve(self, cfg: dict[str, Any], cpus: set[int] | None = None, nice: int = 0,
              cwd: Path = ROOT, env: dict[str, str] | None = None,
              timeout: float = 180.0) -> str:
        """`redline serve` on `cfg` (its own port and, unless `cfg` names one, its own
        data dir, log level warning) once ready: its URL."""
        port = free_port()
        server = {"data_dir": str(self.tmp / f"data{port}"), "log_level": "warning",
                  **cfg.get("server", {}), "port": port}
        path = self.tmp / f"gw{port}.yaml"
        path.write_text(yaml.safe_dump({**cfg, "server": server}))
        return self.start([sys.executable, "-m", "redline.cli", "serve", "--config", str(path)],
                          f"http://127.0.0.1:{port}", cpus=cpus, nice=nice, cwd=cwd, env=env,
                          timeout=timeout)

    def gateway(self, models: list[dict[str, Any]], cpus: set[int] | None = None,
                nice: int = 0, cwd: Path = ROOT, env: dict[str, str] | None = None,
                **sections: Any) -> str:
        return self.serve({"models": models, "cache": {"enabled": False}, **sections},
                          cpus=cpus, nice=nice, cwd=cwd, env=env)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


@dataclass
class Result:
    ok: bool
    status: int = 0
    ttft: float = 0.0
    total: float = 0.0
    tier: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def session(concurrency: int, timeout: float = 120.0) -> aiohttp.ClientSession:
    """The load generator's client. aiohttp, not httpx: on 2 cores the client shares the
    CPU with what it measures, and per SSE chunk aiohttp costs a fraction of httpx (whose
    pool also scans every connection per request)."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout),
                                 connector=aiohttp.TCPConnector(limit=concurrency * 2))


async def stream_once(client: aiohttp.ClientSession, url: str, body: dict[str, Any],
                      headers: dict[str, str] | None = None, tier: str = "") -> Result:
    """One streamed chat completion. TTFT: the first chunk with content. After it, the
    rest of the body is read to its end without parsing (it costs the client little)."""
    t0 = time.perf_counter()
    ttft = None
    try:
        async with client.post(f"{url}/v1/chat/completions", json={**body, "stream": True},
                               headers=headers or {}) as r:
            if r.status != 200:
                await r.read()
                return Result(False, r.status, tier=tier)
            async for payloads in data_payloads(r.content.iter_any()):
                if ttft is not None:
                    continue
                for payload in payloads:
                    if payload == b"[DONE]":
                        break
                    choices = json.loads(payload).get("choices") or []
                    if choices and choices[0].get("delta", {}).get("content"):
                        ttft = time.perf_counter() - t0
                        break
            total = time.perf_counter() - t0
            return Result(ttft is not None, 200, ttft or total, total, tier,
                          {k.lower(): v for k, v in r.headers.items()})
    except (TimeoutError, aiohttp.ClientError):
        return Result(False, 0, tier=tier)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99),
            "mean": statistics.fmean(xs) if xs else float("nan")}


async def upstream_stats(url: str) -> dict[str, int]:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/stats")).json()  # type: ignore[no-any-return]


async def closed_loop(url: str, bodies: list[dict[str, Any]], concurrency: int,
                      headers: dict[str, str] | None = None, warmup: int = 0) -> list[Result]:
    """`concurrency` clients, each sending its next request when its last one ends.
    With `warmup`, that many requests run first in the same loop and are left out of
    the results: the loop's start (all clients' first requests in the same millisecond,
    on new connections) is not its steady state, and at 64 clients those 64 requests
    alone are more than 1 % of 3000 — the p99 would measure the ramp."""
    bodies = [bodies[0]] * warmup + list(bodies) if warmup and bodies else bodies
    queue = list(enumerate(bodies))
    queue.reverse()  # pop() from the end: the first body first
    out: list[Result | None] = [None] * len(bodies)
    async with session(concurrency) as client:
        async def worker() -> None:
            while queue:
                i, b = queue.pop()
                out[i] = await stream_once(client, url, b, headers)
        with no_gc_pauses():
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [r for r in out[warmup:] if r is not None]
