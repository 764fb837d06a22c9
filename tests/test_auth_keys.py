"""API keys: 401 in the OpenAI shape without a valid key, tenant = the key's name,
ops and the spec open unless configured otherwise."""

from __future__ import annotations

import time
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.api.auth import digest
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig

KEY, OTHER = "sk-team-a-secret", "sk-team-b-secret"
# in memory, no response cache: every request reaches the fake backend
FAKE_ONLY: dict[str, Any] = {"store": {"url": "memory://"}, "cache": {"enabled": False}}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def keyed(**auth: Any) -> RedlineConfig:
    keys = [{"name": "team-a", "sha256": digest(KEY)}, {"name": "team-b", "sha256": digest(OTHER)}]
    return RedlineConfig(auth={"keys": keys, **auth}, **FAKE_ONLY)


class Tenants:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_finish(self, completion: Any) -> None:
        self.seen.append(completion.request.tenant)


def client(config: RedlineConfig) -> Iterator[tuple[TestClient, Tenants]]:
    tenants = Tenants()
    app = create_app(config, backends={"fake": FakeBackend()}, observers=[tenants])
    with TestClient(app) as c:
        deadline = time.monotonic() + 60
        while (c.get("/readyz", headers={"Authorization": f"Bearer {KEY}"}).status_code != 200
               and time.monotonic() < deadline):
            time.sleep(0.02)
        yield c, tenants


@pytest.fixture
def keyed_client() -> Iterator[tuple[TestClient, Tenants]]:
    yield from client(keyed())


def assert_openai_error(r: Any, status: int, type_: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == type_
    return err  # type: ignore[no-any-return]


def test_no_keys_configured_is_open() -> None:
    for c, tenants in client(RedlineConfig(**FAKE_ONLY)):
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert tenants.seen == ["anonymous"]


def test_missing_and_wrong_keys_are_401(keyed_client: tuple[TestClient, Tenants]) -> None:
    c, tenants = keyed_client
    err = assert_openai_error(c.post("/v1/chat/completions", json=CHAT), 401, "authentication_error")
    assert err["code"] == "invalid_api_key" and "didn't provide an API key" in err["message"]
    r = c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-nope"})
    err = assert_openai_error(r, 401, "authentication_error")
    assert "Incorrect API key" in err["message"]
    assert r.headers["www-authenticate"] == "Bearer"
    assert_openai_error(c.get("/v1/models", headers={"Authorization": f"Basic {KEY}"}),
                        401, "authentication_error")
    # vLLM's tokenizer, rerank and score routes: keyed too
    for path in ("/tokenize", "/detokenize", "/apply-template", "/rerank", "/v2/rerank", "/score"):
        assert_openai_error(c.post(path, json={"model": "fake", "prompt": "x"}), 401,
                            "authentication_error")
    assert tenants.seen == []


def test_valid_key_sets_tenant_to_its_name(keyed_client: tuple[TestClient, Tenants]) -> None:
    c, tenants = keyed_client
    for key in (KEY, OTHER):
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
    assert tenants.seen == ["team-a", "team-b"]


def test_ops_and_spec_open_by_default(keyed_client: tuple[TestClient, Tenants]) -> None:
    c, _ = keyed_client
    for path in ("/healthz", "/readyz", "/metrics", "/dashboard", "/openapi.json", "/health",
                 "/ping", "/version"):
        assert c.get(path).status_code == 200, path
    assert c.get("/version").json() == {"version": metadata.version("redline")}  # vLLM's
    spec = c.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert spec["paths"]["/v1/chat/completions"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in spec["paths"]["/healthz"]["get"]


def test_ops_protected_when_configured() -> None:
    for c, _ in client(keyed(protect_ops=True)):
        for path in ("/healthz", "/readyz", "/metrics", "/dashboard", "/health", "/ping",
                     "/version"):
            assert_openai_error(c.get(path), 401, "authentication_error")
            assert c.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.get("/openapi.json").status_code == 200


def test_admin_routes_need_an_admin_key() -> None:
    """A user key gets 403 on the operator routes (the dashboard's figures, the long-tail
    log, experiment management); an admin key gets them; the role defaults to user."""
    keys = [{"name": "team-a", "sha256": digest(KEY)},
            {"name": "ops", "sha256": digest(OTHER), "role": "admin"}]
    assert RedlineConfig(auth={"keys": keys}).auth.keys[0].role == "user"
    for c, _ in client(RedlineConfig(auth={"keys": keys}, **FAKE_ONLY)):
        for method, path in (("GET", "/v1/admin/stats"), ("GET", "/v1/admin/slow"),
                             ("GET", "/v1/admin/experiments"),
                             ("DELETE", "/v1/admin/experiments/samples")):
            r = c.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
            assert_openai_error(r, 403, "permission_error")
            r = c.request(method, path, headers={"Authorization": f"Bearer {OTHER}"})
            assert r.status_code == 200, (path, r.text)
            assert_openai_error(c.request(method, path), 401, "authentication_error")
    with pytest.raises(ValueError):
        RedlineConfig(auth={"keys": [{**keys[0], "role": "root"}]})


def test_plain_keys_are_never_accepted_in_config() -> None:
    with pytest.raises(ValueError):
        RedlineConfig(auth={"keys": [{"name": "x", "sha256": "sk-plain-key"}]})


def test_official_client_gets_authentication_error(live_app: Any) -> None:
    server = live_app(create_app(keyed(), backends={"fake": FakeBackend()}))
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.chat.completions.create(**CHAT)
    assert info.value.status_code == 401
    good = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    out = good.chat.completions.create(**CHAT)
    assert out.choices[0].message.content == "lorem ipsum dolor"
