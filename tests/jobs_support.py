"""Real services for the jobs tests: an HTTP webhook receiver, an SMTP server
(aiosmtpd), a redis-server on a free port. Each is started and stopped by its test."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from aiosmtpd.controller import Controller
from conftest import free_port

FINAL = ("succeeded", "failed", "cancelled")


class WebhookReceiver:
    """Records every POST (headers, body); answers `fail_first` of them with 500."""

    def __init__(self, fail_first: int = 0) -> None:
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self.fail_first = fail_first
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver._lock:
                    receiver.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    fail = len(receiver.calls) <= receiver.fail_first
                self.send_response(500 if fail else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(b) for _, b in self.calls]

    def keys(self) -> list[str]:
        with self._lock:
            return [h["idempotency-key"] for h, _ in self.calls]


class MailSink:
    """aiosmtpd handler: keeps every message it is given."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], bytes]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append((list(envelope.rcpt_tos), bytes(envelope.content)))
        return "250 OK"


@contextmanager
def smtp_server() -> Iterator[tuple[MailSink, int]]:
    sink = MailSink()
    port = free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield sink, port
    finally:
        controller.stop()


@contextmanager
def redis_server(tmp: Path) -> Iterator[str]:
    """A real redis-server (Debian package) on a free port, persisting with AOF."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (make system-deps)")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp),
                             "--appendonly", "yes", "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def wait_job(client: Any, job_id: str, timeout: float = 60.0,
             path: str = "/v1/jobs/") -> dict[str, Any]:
    """Poll until the job is final (client: TestClient or httpx.Client)."""
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(path + job_id)
        assert r.status_code == 200, r.text
        job = r.json()
        if job["status"] in FINAL:
            return job  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job['status']}")
        time.sleep(0.05)


def wait_until(pred: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.05)


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Proc:
    """A `python -m …` subprocess with its log in `tmp`; stopped by `stop()`."""

    def __init__(self, args: list[str], tmp: Path, name: str) -> None:
        import os
        import sys

        from conftest import ROOT

        self.log_path = tmp / f"{name}.log"
        self.proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                     stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT)

    def stop(self, sig: int | None = None) -> None:
        from conftest import stop_process

        stop_process(self.proc, sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_upstream(tmp: Path, tpot: float = 0.02) -> tuple[Proc, str]:
    """The fake OpenAI-compatible engine (real HTTP): a job of n tokens takes n*tpot s."""
    port = free_port()
    p = Proc(["redline.backends.fake_upstream", "--port", str(port), "--ttft", "0.02",
              "--tpot", str(tpot)], tmp, f"upstream-{port}")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _up(url + "/v1/models"), timeout=30)
    return p, url


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def upstream_config(url: str, **jobs: Any) -> dict[str, Any]:
    return {"models": [{"name": "up", "backend": "openai", "url": url, "n_ctx": 4096}],
            "routing": {"classifier": "off"}, "cache": {"semantic": False},
            "jobs": {"lease_s": 2, "webhook_allow_private": True, "webhook_backoff_s": 0.1,
                     **jobs}}
