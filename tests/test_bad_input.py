"""Bad input is a 4xx (or is served), never a 500 or a cut connection: a lone surrogate
escape in a JSON body, a non-ASCII digit as a stream's `after`, and a request pipelined
behind a kept-alive response (served, not cut at the header deadline)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from resilience_server import HardenedServer, fake_config

from redline.api.app import create_app
from redline.backends.fake import FakeBackend


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(fake_config(tmp_path), backends={"fake": FakeBackend()})
    with TestClient(app, raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 30
        while c.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield c


LONE = [
    ("/v1/chat/completions",
     b'{"model":"fake","messages":[{"role":"user","content":"hi \\ud800"}],"max_tokens":3}',
     "messages[0].content"),
    ("/v1/chat/completions",
     b'{"model":"fake","messages":[{"role":"user","content":"\\udfff"}],"stream":true}',
     "messages[0].content"),
    ("/v1/completions", b'{"model":"fake","prompt":"x\\uDBFF","max_tokens":3}', "prompt"),
    ("/v1/completions", b'{"model":"fake","prompt":"x","stop":["\\ud800"],"max_tokens":3}',
     "stop[0]"),
    ("/v1/chat/completions", b'{"model":"fake","messages":[{"role":"user","content":"x"}],'
     b'"background":true,"user":"\\ud801"}', "user"),
]


@pytest.mark.parametrize(("path", "body", "param"), LONE)
def test_a_lone_surrogate_is_a_400_naming_the_field(client: TestClient, path: str,
                                                     body: bytes, param: str) -> None:
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_unicode"
    assert err["param"] == param


@pytest.mark.parametrize(("path", "body", "param"), LONE[:3])
def test_a_lone_surrogate_under_another_json_type_is_a_400_too(
        client: TestClient, path: str, body: bytes, param: str) -> None:
    """A `+json` media type: not the hot routes (pydantic-core's parser) but FastAPI's,
    whose Python JSON parser keeps the surrogate; the route checks the text itself."""
    r = client.post(path, content=body, headers={"content-type": "application/vnd.api+json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_unicode" and err["param"] == param


def test_a_surrogate_pair_is_text(client: TestClient) -> None:
    body = b'{"model":"fake","messages":[{"role":"user","content":"\\ud83d\\ude00"}],"max_tokens":3}'
    r = client.post("/v1/chat/completions", content=body,
                    headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


def test_a_batch_line_with_a_lone_surrogate_is_a_line_error(client: TestClient) -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "fake", "messages": [{"role": "user", "content": "\ud800"}]}}
    raw = json.dumps(line).encode()  # json.dumps escapes it: "\ud800" in the file
    f = client.post("/v1/files", data={"purpose": "batch"},
                    files={"file": ("in.jsonl", raw + b"\n", "application/jsonl")}).json()
    b = client.post("/v1/batches", json={"input_file_id": f["id"],
                                         "endpoint": "/v1/chat/completions"})
    assert b.status_code == 200, b.text
    assert b.json()["status"] == "failed"
    (error,) = b.json()["errors"]["data"]
    assert error["code"] == "invalid_unicode" and error["line"] == 1


@pytest.mark.parametrize("after", ["²", "١", "-1", "1.5", "x"])
def test_a_stream_after_that_is_not_ascii_digits_is_a_400(client: TestClient, after: str) -> None:
    r = client.post("/v1/chat/completions", json={"model": "fake", "stream": True, "max_tokens": 2,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    stream_id = r.headers["x-redline-stream-id"]
    r = client.get(f"/v1/streams/{stream_id}", params={"after": after})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "after"


def _responses(sock: socket.socket, n: int) -> list[bytes]:
    """Read `n` whole HTTP/1.1 responses (each with a Content-Length) off `sock`."""
    data, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return out
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return out
            rest += chunk
        out.append(head + b"\r\n\r\n" + rest[:length])
        data = rest[length:]
    return out


def test_a_pipelined_request_is_served_past_the_header_deadline(tmp_path: Path) -> None:
    """Two requests in one write: the second one's headers are complete when the first
    response ends, so the header deadline armed then must not cut it while it runs
    (the second takes ~2 s, the deadline is 0.5 s)."""
    cfg = fake_config(tmp_path, limits={"header_timeout_s": 0.5, "keep_alive_s": 30})
    slow = FakeBackend("fake", tpot_s=0.05)
    with HardenedServer(cfg, slow) as server:
        body = json.dumps({"model": "fake", "max_tokens": 40,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        second = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + second)
            replies = _responses(sock, 2)
        assert len(replies) == 2, replies
        assert replies[0].startswith(b"HTTP/1.1 200") and replies[1].startswith(b"HTTP/1.1 200")
        answer = json.loads(replies[1].partition(b"\r\n\r\n")[2])
        assert answer["usage"]["completion_tokens"] == 40
