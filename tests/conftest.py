"""Shared fixtures: real server processes on free loopback ports, and in-process apps
on a real uvicorn thread for tests that need a socket but no model."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

ROOT = Path(__file__).resolve().parent.parent
SMOL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout: float = 120.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def stop_process(proc: subprocess.Popen[bytes], sig: int | None = None) -> int | None:
    """Terminate (or send `sig`), wait up to 30 s, then kill."""
    if proc.poll() is None:
        if sig is None:
            proc.terminate()
        else:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class ServerProcess:
    """`redline serve` in a subprocess with its own config and data dir."""

    def __init__(self, config: dict[str, Any], tmp: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {**config, "server": {"data_dir": str(tmp / "data"), **config.get("server", {}),
                                       "port": self.port}}
        self.config_path = tmp / f"redline-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = tmp / f"server-{self.port}.log"
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> ServerProcess:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "redline.cli", "serve", "--config", str(self.config_path)],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            wait_ready(self.url, proc=self.proc)
        return self

    def stop(self, sig: int | None = None) -> int | None:
        if self.proc is None:
            return None
        return stop_process(self.proc, sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def smol_config(**extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "models": [{"name": SMOL, "bundled": SMOL, "n_seq_max": 8, "n_ctx": 2048}],
        "streams": {"resume_grace_s": 0},
    }
    cfg.update(extra)
    return cfg


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Any]:
    """Start real servers: `server_factory(config_dict)`; all are stopped after the test."""
    started: list[ServerProcess] = []

    def start(config: dict[str, Any], wait: bool = True, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(config, tmp_path, env).start(wait)
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def smol_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server on the real bundled SmolLM2, shared by the API tests."""
    server = ServerProcess(smol_config(), tmp_path_factory.mktemp("smol")).start()
    yield server
    server.stop()


class LiveApp:
    """An ASGI app served by a real uvicorn on a thread (sockets, disconnects, SSE)."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveApp:
        self.thread.start()
        wait_ready(self.url, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live_app() -> Iterator[Any]:
    stack = contextlib.ExitStack()
    yield lambda app: stack.enter_context(LiveApp(app))
    stack.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server (Debian package) on a free port, no persistence; its URL.
    Skips when redis-server is missing, except in CI (CI=true), where that fails."""
    import shutil

    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed (apt-get install redis-server)")
        pytest.skip("redis-server is not installed")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """The session's redis-server, emptied before each test."""
    import redis

    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    yield redis_server


@pytest.fixture(scope="session")
def smol_vocab() -> Iterator[tuple[Any, int]]:
    """SmolLM2's model (its vocabulary: llama.cpp compiles grammars over one) and its end
    of text token; tests/grammar_oracle.py feeds texts through a grammar with it."""
    import llama_cpp as ll

    from redline.engine.llama import LlamaModel
    from redline.models import bundled_path

    model = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))))
    yield model, ll.llama_vocab_eos(model.vocab)
    model.close()
