"""Per-tenant caps on concurrent generations (an abandoned stream that still generates
for a resume keeps its slot until it ends), and usage per tenant, key and model
(GET /v1/admin/usage), kept in the store across a restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LiveApp
from fastapi.testclient import TestClient
from jobs_support import wait_until

from redline.api.app import create_app
from redline.api.auth import digest
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig

ADMIN, A, B = "sk-admin", "sk-team-a", "sk-team-b"
BASE: dict[str, Any] = {"cache": {"enabled": False}, "routing": {"classifier": "off"}}


def chat(max_tokens: int = 3, stream: bool = False, model: str = "fake") -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def keys(**b: Any) -> list[dict[str, Any]]:
    return [{"name": "ops", "sha256": digest(ADMIN), "role": "admin"},
            {"name": "team-a", "sha256": digest(A)},
            {"name": "team-b", "sha256": digest(B), **b}]


@pytest.fixture
def capped() -> Iterator[tuple[LiveApp, FakeBackend]]:
    """One generation at a time per tenant; team-b's key allows two."""
    cfg = RedlineConfig(auth={"keys": keys(max_concurrent=2)}, limits={"max_concurrent": 1},
                        streams={"resume_grace_s": 30}, store={"url": "memory://"}, **BASE)
    backend = FakeBackend(tpot_s=0.04)
    with LiveApp(create_app(cfg, backends={"fake": backend})) as live:
        yield live, backend


def abandon_stream(url: str, key: str, max_tokens: int) -> str:
    """Start a stream, read its first event, and leave (the connection closes)."""
    with httpx.Client(base_url=url, timeout=30) as c, \
            c.stream("POST", "/v1/chat/completions", json=chat(max_tokens, stream=True),
                     headers=h(key)) as r:
        assert r.status_code == 200
        next(r.iter_lines())
        return r.headers["x-redline-stream-id"]


def test_an_abandoned_stream_holds_its_slot_until_it_ends(
        capped: tuple[LiveApp, FakeBackend]) -> None:
    live, backend = capped
    stream_id = abandon_stream(live.url, A, max_tokens=60)  # ~2.4 s of generation
    with httpx.Client(base_url=live.url, timeout=30) as c:
        wait_until(lambda: backend.inflight == 1)
        r = c.post("/v1/chat/completions", json=chat(), headers=h(A))
        # the client left, the stream still generates for a resume: it counts
        assert r.status_code == 429, r.text
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
        assert set(err) == {"message", "type", "param", "code"} and "concurrent" in err["message"]
        assert float(r.headers["retry-after"]) > 0
        assert backend.inflight == 1  # refused while it was still generating
        # a stream is refused the same way, before it starts
        r = c.post("/v1/chat/completions", json=chat(stream=True), headers=h(A))
        assert r.status_code == 429
        # another tenant has slots of its own; team-b's key allows two at once
        abandon_stream(live.url, B, max_tokens=60)
        assert c.post("/v1/chat/completions", json=chat(), headers=h(B)).status_code == 200
        # the abandoned stream is still there to resume, and runs to its end
        resumed = c.get(f"/v1/streams/{stream_id}", headers={**h(A), "Last-Event-ID": f"{stream_id}:1"})
        assert resumed.status_code == 200 and "[DONE]" in resumed.text
        wait_until(lambda: backend.inflight == 0)
        assert backend.cancelled == 0  # neither stream was cut
        # its end freed the slot
        assert c.post("/v1/chat/completions", json=chat(), headers=h(A)).status_code == 200


def test_a_request_that_fails_before_generating_gives_its_slot_back() -> None:
    cfg = RedlineConfig(auth={"keys": keys()}, limits={"max_concurrent": 1},
                        store={"url": "memory://"}, **BASE)
    app = create_app(cfg, backends={"fake": FakeBackend(), "bad": FakeBackend("bad", fail_rate=1.0)})
    with TestClient(app) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200, timeout=60)
        for _ in range(3):
            r = c.post("/v1/chat/completions", json=chat(model="bad"), headers=h(A))
            assert r.status_code >= 500, r.text
        assert c.post("/v1/chat/completions", json=chat(), headers=h(A)).status_code == 200


def usage(c: TestClient, **query: Any) -> dict[str, Any]:
    r = c.get("/v1/admin/usage", params=query, headers=h(ADMIN))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_usage_per_tenant_key_and_model_survives_a_restart(tmp_path: Path) -> None:
    cfg = RedlineConfig(auth={"keys": keys()}, store={"url": f"sqlite:///{tmp_path / 'r.db'}"},
                        **BASE)
    backends = {"fake": FakeBackend(), "bad": FakeBackend("bad", fail_rate=1.0)}
    with ExitStack() as stack:
        c = stack.enter_context(TestClient(create_app(cfg, backends=backends)))
        wait_until(lambda: c.get("/readyz").status_code == 200, timeout=60)
        managed = c.post("/v1/admin/keys", json={"tenant": "team-a"}, headers=h(ADMIN)).json()
        used: dict[str, int] = {"input": 0, "output": 0}
        for key, n in ((A, 2), (managed["key"], 3), (B, 1)):
            for _ in range(n):
                r = c.post("/v1/chat/completions", json=chat(4), headers=h(key))
                used["input"] += r.json()["usage"]["prompt_tokens"] if key != B else 0
                used["output"] += r.json()["usage"]["completion_tokens"] if key != B else 0
        assert c.post("/v1/chat/completions", json=chat(model="bad"), headers=h(A)).status_code >= 500
        # a stream counts too
        with c.stream("POST", "/v1/chat/completions", json=chat(4, stream=True), headers=h(B)) as s:
            assert "[DONE]" in s.read().decode()
        assert c.get("/v1/admin/usage", headers=h(A)).status_code == 403
        by_key = {(r["tenant"], r["key"]): r for r in usage(c, group_by="key")["data"]}
        assert by_key[("team-a", "team-a")]["requests"] == 3  # 2 answered + 1 failed
        assert by_key[("team-a", "team-a")]["errors"] == 1
        assert by_key[("team-a", managed["id"])]["requests"] == 3
        assert by_key[("team-a", managed["id"])]["errors"] == 0
        assert by_key[("team-b", "team-b")]["requests"] == 2
        tenants = {r["tenant"]: r for r in usage(c, group_by="tenant")["data"]}
        assert tenants["team-a"]["input_tokens"] == used["input"]
        assert tenants["team-a"]["output_tokens"] == used["output"] == 5 * 4
        assert tenants["team-a"]["key"] is None and set(tenants) == {"team-a", "team-b"}
        rows = usage(c)["data"]  # tenant, key, model
        assert {(r["key"], r["model"]) for r in rows if r["tenant"] == "team-a"} == {
            ("team-a", "fake"), ("team-a", "bad"), (managed["id"], "fake")}
        # paged: one row at a time gives every row once
        seen, after = [], None
        while True:
            page = usage(c, limit=1, **({"after": after} if after else {}))
            seen += page["data"]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert seen == rows
        # a window that ends before any of it: nothing; a bad window: 400
        assert usage(c, start=0, end=3600)["data"] == []
        r = c.get("/v1/admin/usage", params={"start": time.time(), "end": 1}, headers=h(ADMIN))
        assert r.status_code == 400 and r.json()["error"]["param"] == "start"
        before = usage(c, group_by="key")["data"]
    # a restart: a new app on the same file reports the same counts
    with TestClient(create_app(cfg, backends=backends)) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200, timeout=60)
        assert usage(c, group_by="key")["data"] == before
