"""SIGTERM on a real `redline serve` process mid-stream: /readyz and new requests answer
503 at once, the running stream finishes whole, the process exits 0; a stream longer
than the drain deadline is cut at the deadline."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    """The fake OpenAI-compatible engine, its own process: 50 tokens/s."""
    port = free_port()
    log = open(tmp_path / "upstream.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "redline.backends.fake_upstream", "--port", str(port),
                             "--ttft", "0.02", "--tpot", "0.02"], cwd=ROOT, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def config(upstream: str, drain_timeout_s: float) -> dict[str, Any]:
    return {"models": [{"name": "up", "backend": "openai", "url": upstream, "n_ctx": 8192}],
            "routing": {"classifier": "off"}, "store": {"url": "memory://"},
            "cache": {"enabled": False}, "limits": {"drain_timeout_s": drain_timeout_s}}


class Stream(threading.Thread):
    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.events: list[str] = []
        self.first = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        body = {"model": "up", "stream": True, "max_tokens": self.max_tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": "count"}]}
        try:
            with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.first.set()
        except httpx.HTTPError as exc:
            self.error = exc
        self.first.set()

    def text(self) -> str:
        return "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                       for e in self.events if e != "[DONE]" and json.loads(e)["choices"])


def test_sigterm_drains_running_stream_and_refuses_new_work(server_factory: Any, upstream: str) -> None:
    server = server_factory(config(upstream, drain_timeout_s=30))
    stream = Stream(server.url, max_tokens=150)  # ~3 s at 50 tokens/s
    stream.start()
    assert stream.first.wait(30) and stream.events
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    ready = httpx.get(f"{server.url}/readyz", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    new = httpx.post(f"{server.url}/v1/chat/completions", timeout=5,
                     json={"model": "up", "messages": [{"role": "user", "content": "hi"}]})
    assert new.status_code == 503 and new.json()["error"]["code"] == "not_ready"
    assert "retry-after" in new.headers
    stream.join(30)
    assert stream.error is None and stream.events[-1] == "[DONE]"
    finals = [json.loads(e) for e in stream.events[:-1] if json.loads(e)["choices"]]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"
    assert server.proc.wait(timeout=30) == 0
    assert time.monotonic() - t0 < 30
    assert "drained in" in server.log()


def test_drain_deadline_cuts_what_is_left(server_factory: Any, upstream: str) -> None:
    server = server_factory(config(upstream, drain_timeout_s=1))
    stream = Stream(server.url, max_tokens=2000)  # ~40 s: longer than the deadline
    stream.start()
    assert stream.first.wait(30)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(timeout=30)
    waited = time.monotonic() - t0
    stream.join(30)
    # cut: the client saw part of the stream, no end of it, and a connection that broke
    assert stream.events and "[DONE]" not in stream.events
    assert isinstance(stream.error, httpx.RemoteProtocolError), stream.error
    assert waited < 20  # the deadline (1 s) plus shutdown, far less than the 40 s stream
    assert "drain deadline" in server.log()
