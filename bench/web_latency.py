"""What a user sees in the browser: time from pressing Send to the skeleton painted, and to
the first token painted, measured inside the page with performance.now() (after the
next paint), on the bundled model with an idle server, in headless Chromium.

Usage: flock /tmp/redline-cpu.lock .venv/bin/python bench/web_latency.py --n 20
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
SMOL = "smollm2-135m-instruct"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
PROMPTS = ["What is the capital of France?", "Give me a synonym for happy.", "How many legs has a spider?",
           "Name a primary colour.", "What is 12 times 12?", "Say hello in Spanish.",
           "What does CPU stand for?", "Name a planet.", "What is the opposite of cold?",
           "Recommend a short book."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cfg = {"server": {"port": port, "data_dir": str(tmp / "data")},
           "models": [{"name": SMOL, "bundled": SMOL, "n_seq_max": 8}]}
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "redline.cli", "serve", "--config", str(tmp / "cfg.yaml")],
                            cwd=ROOT, stdout=open(tmp / "server.log", "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(url)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def main(n: int, max_tokens: int) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="web-latency-"))
    proc, url = serve(tmp)
    runs = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page()
            page.goto(url + "/")
            page.wait_for_function("document.querySelectorAll('#model option').length > 1")
            page.uncheck("#use-cache")  # the model's latency, not the cache's
            page.select_option("#tier", "S")
            page.fill("#max-tokens", str(max_tokens))
            for i in range(n + 1):  # the first is a warm-up, not counted
                page.click("#clear")
                page.fill("#prompt", PROMPTS[i % len(PROMPTS)])
                page.click("#send")
                page.wait_for_function("(r => r.doneMs !== null || r.error)"
                                       "(window.redline.runs[window.redline.runs.length - 1])",
                                       timeout=60_000)
                run = page.evaluate("window.redline.runs[window.redline.runs.length - 1]")
                if run["error"]:
                    raise RuntimeError(run["error"])
                if i:
                    runs.append(run)
                time.sleep(0.3)  # idle between questions
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    skel = [r["skeletonMs"] for r in runs]
    first = [r["firstTokenMs"] for r in runs]
    return {"n": n, "max_tokens": max_tokens, "model": SMOL,
            "skeleton_ms": {"median": round(statistics.median(skel), 1), "p90": round(pct(skel, 0.9), 1),
                            "max": round(max(skel), 1)},
            "first_token_ms": {"median": round(statistics.median(first), 1),
                               "p90": round(pct(first, 0.9), 1), "max": round(max(first), 1)},
            "done_ms_median": round(statistics.median(r["doneMs"] for r in runs), 1)}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=32)
    a = p.parse_args()
    print(json.dumps(main(a.n, a.max_tokens), indent=2))
