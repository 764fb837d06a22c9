"""Metric overhead: server throughput with telemetry.metrics on vs off, interleaved in one run.

Two servers start side by side, identical but for `telemetry.metrics`; rounds alternate
between them in ABBA order (each round: a closed loop of streaming requests on one server
while the other idles), so that drift of the shared machine hits both arms alike.
Backends: `fake` (no model: TTFT 0, 0 s/token, so the server's own work is all there is —
the strictest case) or `smol` (the bundled SmolLM2 on the embedded engine).

Usage: flock /tmp/redline-cpu.lock .venv/bin/python bench/metrics_overhead.py --backend fake
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from redline.bench.loadgen import Target, run_closed

ROOT = Path(__file__).resolve().parent.parent
SMOL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_fake(port: int, metrics: bool) -> None:
    """The child process: a real uvicorn server on the fake backend."""
    import uvicorn

    from redline.api.app import create_app
    from redline.backends.fake import FakeBackend
    from redline.config import load_config

    cfg = load_config(server={"data_dir": tempfile.mkdtemp()}, telemetry={"metrics": metrics},
                      cache={"enabled": False})
    app = create_app(cfg, backends={"fake": FakeBackend()})
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start(backend: str, metrics: bool, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if backend == "fake":
        cmd = [sys.executable, __file__, "--serve-fake", str(port), "--metrics", str(int(metrics))]
    else:
        cfg = {"server": {"port": port, "data_dir": str(tmp / f"data-{port}")},
               "models": [{"name": SMOL, "bundled": SMOL, "n_seq_max": 8}],
               "telemetry": {"metrics": metrics}, "cache": {"enabled": False}}
        path = tmp / f"{port}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        cmd = [sys.executable, "-m", "redline.cli", "serve", "--config", str(path)]
    log = open(tmp / f"server-{port}.log", "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: see {tmp}")
        time.sleep(0.2)
    raise TimeoutError(url)


async def main(args: argparse.Namespace) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="metrics-overhead-"))
    procs = []
    try:
        arms = {}
        for name, on in (("on", True), ("off", False)):
            proc, url = start(args.backend, on, tmp)
            procs.append(proc)
            arms[name] = Target(name, url, "fake" if args.backend == "fake" else SMOL)
        assert "redline_time_to_first_token" in httpx.get(arms["on"].url + "/metrics").text
        assert "redline_time_to_first_token" not in httpx.get(arms["off"].url + "/metrics").text

        def body(i: int) -> dict[str, object]:
            return {"messages": [{"role": "user", "content": f"Tell me about number {i}."}],
                    "max_tokens": args.max_tokens, "temperature": 0, "cache": False}

        for target in arms.values():  # warm both
            await run_closed(target, body, args.concurrency, args.concurrency * 2)
        totals = {name: {"requests": 0, "tokens": 0, "seconds": 0.0, "errors": 0} for name in arms}
        rounds: list[dict[str, Any]] = []
        order = ["on", "off", "off", "on"] * args.rounds
        for name in order[: 2 * args.rounds]:
            result = await run_closed(arms[name], body, args.concurrency, args.requests)
            t = totals[name]
            t["requests"] += sum(1 for s in result.samples if s.ok)
            t["errors"] += sum(1 for s in result.samples if not s.ok)
            t["tokens"] += sum(s.tokens for s in result.samples if s.ok)
            t["seconds"] += result.wall_s
            rounds.append({"arm": name, "req_per_s": round(len(result.samples) / result.wall_s, 2)})
        # each ABBA quartet gives two adjacent on/off pairs: their ratios show the spread
        pairs = [(rounds[k], rounds[k + 1]) for k in range(0, len(rounds) - 1, 2)]
        pair_ratios = sorted(
            (a["req_per_s"] / b["req_per_s"]) if a["arm"] == "on" else (b["req_per_s"] / a["req_per_s"])
            for a, b in pairs)
        rate = {n: t["requests"] / t["seconds"] for n, t in totals.items()}
        tok = {n: t["tokens"] / t["seconds"] for n, t in totals.items()}
        return {"backend": args.backend, "concurrency": args.concurrency, "rounds": len(rounds),
                "requests_per_round": args.requests, "max_tokens": args.max_tokens,
                "req_per_s": {n: round(v, 2) for n, v in rate.items()},
                "tok_per_s": {n: round(v, 1) for n, v in tok.items()},
                "ratio_on_off": round(rate["on"] / rate["off"], 4),
                "pair_ratio_median": round(pair_ratios[len(pair_ratios) // 2], 4),
                "pair_ratio_range": [round(pair_ratios[0], 3), round(pair_ratios[-1], 3)],
                "errors": {n: t["errors"] for n, t in totals.items()}, "per_round": rounds}
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("fake", "smol"), default="fake")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=400, help="requests per round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per arm (ABBA order)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--serve-fake", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--metrics", type=int, default=1, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.serve_fake:
        serve_fake(a.serve_fake, bool(a.metrics))
    else:
        print(json.dumps(asyncio.run(main(a)), indent=2))
