"""Start a real `redline serve` (bundled SmolLM2) on a free port for the stream
benchmarks, or use the one at --url."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
SMOL = "smollm2-135m-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(url: str | None, streams: dict[str, Any] | None = None,
           store_url: str | None = None) -> Iterator[str]:
    if url:
        yield url.rstrip("/")
        return
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="redline-bench-") as tmp:
        cfg: dict[str, Any] = {
            "server": {"port": port, "data_dir": tmp, "log_level": "warning"},
            "models": [{"name": SMOL, "bundled": SMOL, "n_seq_max": 8}],
            "streams": streams or {},
        }
        if store_url:
            cfg["store"] = {"url": store_url}
        path = Path(tmp, "redline.yaml")
        path.write_text(yaml.safe_dump(cfg))
        log = open(Path(tmp, "server.log"), "wb")
        proc = subprocess.Popen([sys.executable, "-m", "redline.cli", "serve", "--config", str(path)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited: {Path(tmp, 'server.log').read_text()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError("server not ready")
                time.sleep(0.1)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
