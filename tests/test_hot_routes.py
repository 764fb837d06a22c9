"""The hot routes (api/hot.py) on the real server: every request goes through the one
middleware stack (an application's own middleware included); a completion request with a
JSON body is then answered without FastAPI's router, anything else by FastAPI."""

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
from redline.api.hot import HotRoutes
from redline.api.server import protocol
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.config import LimitsConfig, RedlineConfig
from tests.conftest import free_port, wait_ready

KEY = "sk-lane"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
AUTH = {"Authorization": f"Bearer {KEY}"}


class Served:
    """`app` on uvicorn with redline's protocol, as `redline serve` runs it; `stacked`
    lists the /v1 paths that went past the hot routes into FastAPI's routing, and
    `outer` those an application's own middleware (outermost) saw."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.stacked: list[str] = []
        self.outer: list[str] = []
        outer = self.outer

        class Embedder:  # an application's own middleware, added after create_app
            def __init__(self, app: Any) -> None:
                self.app = app

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                if scope["type"] == "http" and scope["path"].startswith("/v1/"):
                    outer.append(scope["path"])
                await self.app(scope, receive, send)

        app.add_middleware(Embedder)
        app.middleware_stack = app.build_middleware_stack()
        layer = app.middleware_stack
        while not isinstance(layer, HotRoutes):
            layer = layer.app
        inner = layer.app

        async def counted(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"].startswith("/v1/"):
                self.stacked.append(scope["path"])
            await inner(scope, receive, send)

        layer.app = counted
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=port,
                                http=protocol(LimitsConfig()), lifespan="on", log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_ready(self.url, timeout=120)  # the classifier trains at startup: slow on a busy CI box

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


def test_completion_requests_are_served_hot_after_the_stacks_checks(serve: Any) -> None:
    s = serve(limits={"rpm": 3})
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
        assert s.stacked == []  # neither went to FastAPI's router
        c.post("/v1/chat/completions", json=CHAT)
        refused = c.post("/v1/chat/completions", json=CHAT)  # the fourth in the window
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert s.stacked == []  # refused by RateLimit, in the stack
    assert s.outer == ["/v1/chat/completions", "/v1/completions"] + ["/v1/chat/completions"] * 2


def test_the_stacks_answers_come_first_and_bad_bodies_are_answered_hot(serve: Any) -> None:
    s = serve()
    with httpx.Client(base_url=s.url) as c:
        no_key = c.post("/v1/chat/completions", json=CHAT)
        assert no_key.status_code == 401 and no_key.headers["www-authenticate"] == "Bearer"
        c.headers.update(AUTH)
        bad = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        broken = c.post("/v1/chat/completions", content=b'{"model": "fake", "mess',
                        headers={"content-type": "application/json"})
        assert broken.status_code == 400
        assert broken.json()["error"]["type"] == "invalid_request_error"
        assert s.stacked == []  # the body was read once, by the hot routes

        def pieces() -> Iterator[bytes]:  # chunked: no Content-Length
            yield b'{"model": "fake", "messages": [{"role": "user", '
            yield b'"content": "hi"}], "max_tokens": 4}'

        chunked = c.post("/v1/chat/completions", content=pieces(),
                         headers={"content-type": "application/json"})
        assert chunked.status_code == 200 and chunked.json()["choices"][0]["message"]["content"]
        cap = services_of(s.app).config.server.max_body_bytes
        big = c.post("/v1/chat/completions", content=b"x" * (cap + 1),
                     headers={"content-type": "application/json"})
        assert big.status_code == 413

        def too_many() -> Iterator[bytes]:  # chunked, past the limit: BodyLimit's 413 too
            yield b"x" * services_of(s.app).config.server.max_body_bytes
            yield b"x"

        assert c.post("/v1/chat/completions", content=too_many(),
                      headers={"content-type": "application/json"}).status_code == 413
        services_of(s.app).draining = True  # ReadyGate: 503 + Retry-After, from the stack
        draining = c.post("/v1/chat/completions", json=CHAT)
        assert draining.status_code == 503 and draining.headers["retry-after"] == "1"
        services_of(s.app).draining = False
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert s.stacked == []
        assert len(s.outer) == 8  # every request went through the whole stack


def test_an_unexpected_error_gets_the_same_500_hot_and_from_fastapi(
        serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*_: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(openai_routes, "serve", broken)
    s = serve()
    # each on a connection of its own: the server closes one after an error it logged
    with httpx.Client(base_url=s.url, headers=AUTH) as c:
        hot = c.post("/v1/chat/completions", json=CHAT)
        assert s.stacked == []
    with httpx.Client(base_url=s.url, headers=AUTH) as c:  # +json: FastAPI's route reads it
        stacked = c.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                         headers={"content-type": "application/vnd.api+json"})
        assert s.stacked == ["/v1/chat/completions"]
    assert hot.status_code == stacked.status_code == 500
    assert hot.json() == stacked.json()
    assert hot.json()["error"]["type"] == "server_error"


def test_a_hot_stream_counts_as_in_flight(serve: Any) -> None:
    s = serve(backend=FakeBackend(tpot_s=0.05))
    with httpx.Client(base_url=s.url, headers=AUTH) as c:
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("id: ")
            assert services_of(s.app).inflight.n == 1  # the drain waits for it
            rest = list(lines)
        assert "data: [DONE]" in rest and s.stacked == []
    # the last event leaves from the stream's writer task; the request's task ends (and
    # leaves the count) a moment after the client has read it: wait for that, bounded
    for _ in range(200):
        if services_of(s.app).inflight.n == 0:
            break
        time.sleep(0.01)
    assert services_of(s.app).inflight.n == 0


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
    assert s.stacked == []  # both read by the hot routes, under BodyTimeout's deadline
