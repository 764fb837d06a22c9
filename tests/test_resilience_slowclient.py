"""Slow clients cannot hold the server: header deadline, body deadline (408), a cap on
open connections (503 + Retry-After), and slowhttptest's attacks on loopback."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from resilience_server import HardenedServer, fake_config

CHAT = b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}'


@pytest.fixture
def hardened(tmp_path: Path) -> Iterator[Any]:
    servers: list[HardenedServer] = []

    def start(**limits: Any) -> HardenedServer:
        s = HardenedServer(fake_config(tmp_path, limits=limits)).__enter__()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.__exit__(None, None, None)


def connect(server: HardenedServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    return sock


def closed_by_server(sock: socket.socket, trickle: bytes | None = None, every: float = 0.3) -> bool:
    """Send `trickle` every `every` s until the server closes the connection."""
    sock.settimeout(every)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.sendall(trickle)
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def test_partial_headers_are_cut_at_the_header_deadline(hardened: Any) -> None:
    server = hardened(header_timeout_s=1.0)
    sock = connect(server)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    assert closed_by_server(sock, trickle=b"X-Slow: 1\r\n")
    idle = connect(server)  # a connection that sends nothing at all
    assert closed_by_server(idle)
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_header_deadline_rearms_on_keep_alive(hardened: Any) -> None:
    server = hardened(header_timeout_s=1.0, keep_alive_s=30)
    sock = connect(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"200 OK" in sock.recv(4096)
    sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # the second request stalls mid-headers
    assert closed_by_server(sock, trickle=b"X-Slow: 1\r\n")


def test_slow_body_gets_408(hardened: Any) -> None:
    server = hardened(body_timeout_s=1.0)
    sock = connect(server)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(CHAT) + CHAT[:10])
    sock.settimeout(20)
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
        data = sock.recv(4096)
        if not data:
            break
        reply += data
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply
    err = json.loads(body)["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "request_timeout"


def test_connection_cap_sheds_with_503(hardened: Any) -> None:
    server = hardened(max_connections=4, header_timeout_s=30)
    held = [connect(server) for _ in range(4)]
    time.sleep(0.2)  # let the server accept them
    r = httpx.post(f"{server.url}/v1/chat/completions", content=CHAT,
                   headers={"content-type": "application/json"})
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "overloaded_error" and r.headers["retry-after"] == "1"
    for s in held:
        s.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = httpx.post(f"{server.url}/v1/chat/completions", content=CHAT,
                       headers={"content-type": "application/json"})
        if r.status_code == 200:
            break
        time.sleep(0.1)
    assert r.status_code == 200


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("slowhttptest") is None, reason="apt-get install slowhttptest")
@pytest.mark.parametrize("attack", ["-H", "-B"])  # slowloris headers, slow POST body
def test_service_stays_up_under_slowhttptest(hardened: Any, tmp_path: Path, attack: str) -> None:
    server = hardened(header_timeout_s=2.0, body_timeout_s=2.0)
    statuses: list[int] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                r = c.post(f"{server.url}/v1/chat/completions", content=CHAT,
                           headers={"content-type": "application/json"})
                statuses.append(r.status_code)
                time.sleep(0.05)

    t = threading.Thread(target=client)
    t.start()
    # 60 connections at 30/s, a header/body line every 1 s, for 6 s
    out = subprocess.run(
        ["slowhttptest", attack, "-c", "60", "-r", "30", "-i", "1", "-l", "6", "-s", "8192",
         "-t", "POST", "-u", f"{server.url}/v1/chat/completions", "-p", "3", "-g",
         "-o", str(tmp_path / "slow")],
        capture_output=True, text=True, timeout=60)
    stop.set()
    t.join(timeout=15)
    assert out.returncode == 0, out.stderr[-2000:]
    report = (tmp_path / "slow.csv").read_text()
    assert statuses and set(statuses) == {200}, statuses[:20]
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    # slowhttptest probes the service each second: "Service Available" is 0 when it is not
    rows = [line.split(",") for line in report.strip().splitlines()[1:]]
    assert rows and all(int(r[-1]) > 0 for r in rows), report[-800:]
    # and the deadlines closed the attack's connections before it gave up
    assert max(int(r[1]) for r in rows) > 0, report[-800:]
