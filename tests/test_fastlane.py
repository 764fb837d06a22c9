"""The fast lane (api/fastlane.py) on the real server: a plain completion request is
answered past the middleware stack, with the stack's checks done the same; anything else
goes through the stack and gets the stack's answer."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from redline.api import openai_routes
from redline.api.app import create_app
from redline.api.auth import digest
from redline.api.fastlane import FastLane
from redline.api.server import protocol
from redline.api.sse import expose_raw_send
from redline.backends.fake import FakeBackend
from redline.config import LimitsConfig, RedlineConfig
from tests.conftest import free_port, wait_ready

KEY = "sk-lane"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
AUTH = {"Authorization": f"Bearer {KEY}"}


class Served:
    """`app` behind FastLane, on uvicorn with redline's protocol (which offers BODY_IN),
    as `redline serve` runs it; `stacked` lists the /v1 paths that went to the stack."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lane = FastLane(app)
        self.stacked: list[str] = []
        stack = self.lane.stack

        async def counted(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"].startswith("/v1/"):
                self.stacked.append(scope["path"])
            await stack(scope, receive, send)

        self.lane.stack = counted
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(expose_raw_send(self.lane), host="127.0.0.1", port=port,
                                http=protocol(LimitsConfig()), lifespan="on", log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_ready(self.url, timeout=30)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def serve(tmp_path: Any) -> Iterator[Any]:
    served: list[Served] = []

    def start(backend: FakeBackend | None = None, **config: Any) -> Served:
        cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, store={"url": "memory://"},
                            cache={"enabled": False},
                            auth={"keys": [{"name": "lane", "sha256": digest(KEY)}]}, **config)
        s = Served(create_app(cfg, backends={"fake": backend or FakeBackend()}))
        served.append(s)
        return s

    yield start
    for s in served:
        s.close()


def test_plain_requests_take_the_lane_with_the_stacks_checks(serve: Any) -> None:
    s = serve(limits={"rpm": 3})
    assert s.lane.on
    with httpx.Client(base_url=s.url, headers=AUTH) as c:
        answer = c.post("/v1/chat/completions", json=CHAT)
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
        assert answer.headers["x-ratelimit-limit-requests"] == "3"  # RateLimit's headers
        assert answer.headers["x-ratelimit-remaining-requests"] == "2"
        with c.stream("POST", "/v1/completions",
                      json={"model": "fake", "prompt": "hi", "max_tokens": 3, "stream": True}) as r:
            body = r.read().decode()
        assert r.status_code == 200 and body.endswith("data: [DONE]\n\n")
        assert r.headers["x-ratelimit-remaining-requests"] == "1"
        assert s.stacked == []  # neither went through the stack
        c.post("/v1/chat/completions", json=CHAT)
        refused = c.post("/v1/chat/completions", json=CHAT)  # the fourth in the window
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert s.stacked == []  # refused in the lane, by RateLimit's own admit


def test_everything_else_gets_the_stacks_answer(serve: Any) -> None:
    s = serve()
    with httpx.Client(base_url=s.url) as c:
        no_key = c.post("/v1/chat/completions", json=CHAT)
        assert no_key.status_code == 401 and no_key.headers["www-authenticate"] == "Bearer"
        assert s.stacked == ["/v1/chat/completions"]
        c.headers.update(AUTH)
        bad = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        broken = c.post("/v1/chat/completions", content=b'{"model": "fake", "mess',
                        headers={"content-type": "application/json"})
        assert broken.status_code == 400
        assert broken.json()["error"]["type"] == "invalid_request_error"
        assert len(s.stacked) == 3  # the body was replayed to the stack whole

        def pieces() -> Iterator[bytes]:  # chunked: no Content-Length
            yield b'{"model": "fake", "messages": [{"role": "user", '
            yield b'"content": "hi"}], "max_tokens": 4}'

        chunked = c.post("/v1/chat/completions", content=pieces(),
                         headers={"content-type": "application/json"})
        assert chunked.status_code == 200 and chunked.json()["choices"][0]["message"]["content"]
        big = c.post("/v1/chat/completions", content=b"x" * (s.app.state.config.server.max_body_bytes + 1),
                     headers={"content-type": "application/json"})
        assert big.status_code == 413
        assert len(s.stacked) == 5
        s.app.state.draining = True  # ReadyGate: 503 + Retry-After, from the stack
        draining = c.post("/v1/chat/completions", json=CHAT)
        assert draining.status_code == 503 and draining.headers["retry-after"] == "1"
        assert len(s.stacked) == 6
        s.app.state.draining = False
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert len(s.stacked) == 6


def test_an_unexpected_error_gets_the_same_500_in_the_lane_and_the_stack(
        serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*_: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(openai_routes, "_handle", broken)
    s = serve()
    # each on a connection of its own: the server closes one after an error it logged
    with httpx.Client(base_url=s.url, headers=AUTH) as c:
        lane = c.post("/v1/chat/completions", json=CHAT)
        assert s.stacked == []
    with httpx.Client(base_url=s.url, headers=AUTH) as c:
        stacked = c.post("/v1/chat/completions", content=iter([json.dumps(CHAT).encode()]),
                         headers={"content-type": "application/json"})
        assert s.stacked == ["/v1/chat/completions"]
    assert lane.status_code == stacked.status_code == 500
    assert lane.json() == stacked.json()
    assert lane.json()["error"]["type"] == "server_error"


def test_a_stream_in_the_lane_counts_as_in_flight(serve: Any) -> None:
    s = serve(backend=FakeBackend(tpot_s=0.05))
    with httpx.Client(base_url=s.url, headers=AUTH) as c:
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("id: ")
            assert s.app.state.inflight.n == 1  # the drain waits for it
            rest = list(lines)
        assert "data: [DONE]" in rest and s.stacked == []
    assert s.app.state.inflight.n == 0


def test_the_lane_is_off_when_the_stack_holds_a_layer_it_does_not_know(tmp_path: Any) -> None:
    class Other:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await self.app(scope, receive, send)

    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, store={"url": "memory://"})
    assert FastLane(create_app(cfg, backends={"fake": FakeBackend()})).on
    app = create_app(cfg, backends={"fake": FakeBackend()})
    app.add_middleware(Other)
    assert not FastLane(app).on


def _post_in_two(url: str, first: bytes, then: bytes, pause: float) -> http.client.HTTPResponse:
    """A raw request whose body's `then` part comes `pause` seconds after the rest."""
    host, port = url.removeprefix("http://").split(":")
    body_len = len(first) + len(then)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {body_len}\r\n\r\n").encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(head + first)
    time.sleep(pause)
    try:
        sock.sendall(then)
    except OSError:
        pass  # the server answered and closed first
    response = http.client.HTTPResponse(sock)
    response.begin()
    response.body = response.read()  # type: ignore[attr-defined]
    sock.close()
    return response


def test_a_body_that_comes_after_its_head_is_read_by_the_body_deadline(serve: Any) -> None:
    s = serve(limits={"body_timeout_s": 0.6})
    body = json.dumps(CHAT).encode()
    late = _post_in_two(s.url, b"", body, 0.1)  # the head alone first, then the body
    assert late.status == 200 and json.loads(late.body)["choices"][0]["message"]["content"]
    stuck = _post_in_two(s.url, body[:10], body[10:], 1.5)  # part of the body, then silence
    assert stuck.status == 408 and json.loads(stuck.body)["error"]["type"] == "invalid_request_error"
    assert stuck.getheader("connection") == "close"
    assert s.stacked == []  # both in the lane, the 408 by BodyTimeout's own refusal
