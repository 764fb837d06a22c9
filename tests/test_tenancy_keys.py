"""Managed API keys (issue 21, part 8): an admin creates, lists, rotates and revokes keys
at run time; they are kept hashed in the store (SQLite by default, Redis when the store is
Redis), so a key made on one replica works on another at once and a revoked one is refused
everywhere within `auth.key_cache_s`. Each key carries a role, a model allowlist, limits
and a token budget; keys from the config file keep working."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jobs_support import wait_until

from redline.api.app import create_app
from redline.api.auth import digest
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig

ADMIN, USER = "sk-admin-secret", "sk-user-secret"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def config(store_url: str, **extra: Any) -> RedlineConfig:
    keys = [{"name": "ops", "sha256": digest(ADMIN), "role": "admin"},
            {"name": "team-a", "sha256": digest(USER)}]
    return RedlineConfig(auth={"keys": keys, "key_cache_s": 1.0}, store={"url": store_url},
                         cache={"enabled": False}, routing={"classifier": "off"}, **extra)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def make_key(c: TestClient, **spec: Any) -> str:
    """A managed key of tenant team-a, made by the admin: its secret."""
    r = c.post("/v1/admin/keys", json={"tenant": "team-a", **spec}, headers=bearer(ADMIN))
    assert r.status_code == 200, r.text
    return str(r.json()["key"])


def replica(stack: ExitStack, cfg: RedlineConfig) -> TestClient:
    app = create_app(cfg, backends={"fake": FakeBackend(), "other": FakeBackend("other")})
    c = stack.enter_context(TestClient(app))
    wait_until(lambda: c.get("/readyz").status_code == 200, timeout=60)
    return c


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_server").rsplit("/", 1)[0] + "/11"
        import redis

        redis.Redis.from_url(url).flushdb()
        return url
    return f"sqlite:///{tmp_path / 'redline.db'}"


@pytest.fixture
def two_replicas(store_url: str) -> Iterator[tuple[TestClient, TestClient]]:
    """Two apps over one store: what two replicas behind a balancer share."""
    with ExitStack() as stack:
        yield replica(stack, config(store_url)), replica(stack, config(store_url))


def test_key_lifecycle_across_replicas(two_replicas: tuple[TestClient, TestClient]) -> None:
    a, b = two_replicas
    made = a.post("/v1/admin/keys", json={"tenant": "team-a"}, headers=bearer(ADMIN))
    assert made.status_code == 200, made.text
    key, key_id = made.json()["key"], made.json()["id"]
    assert key.startswith("sk-rl-") and made.json()["role"] == "user"
    # works on the other replica at once (a key not found is never remembered)
    assert b.post("/v1/chat/completions", json=CHAT, headers=bearer(key)).status_code == 200
    # listed without its secret or digest, on either replica
    listed = b.get("/v1/admin/keys", headers=bearer(ADMIN)).json()
    assert [k["id"] for k in listed["data"]] == [key_id]
    text = str(listed)
    assert key not in text and digest(key) not in text
    assert listed["data"][0]["redacted_value"].endswith(key[-4:])
    # the tenant's objects are the key's: a job made with it is team-a's (the config key sees it)
    job = b.post("/v1/chat/completions", json={**CHAT, "background": True}, headers=bearer(key))
    assert job.status_code == 202, job.text
    assert a.get(f"/v1/jobs/{job.json()['id']}", headers=bearer(USER)).status_code == 200
    # rotate: the old secret fails at once where it was rotated, the new one works everywhere
    rotated = a.post(f"/v1/admin/keys/{key_id}/rotate", headers=bearer(ADMIN)).json()
    new = rotated["key"]
    assert rotated["id"] == key_id and new != key
    assert a.post("/v1/chat/completions", json=CHAT, headers=bearer(key)).status_code == 401
    assert b.post("/v1/chat/completions", json=CHAT, headers=bearer(new)).status_code == 200
    # revoke: refused here at once, and on the other replica within key_cache_s (1 s)
    assert a.delete(f"/v1/admin/keys/{key_id}", headers=bearer(ADMIN)).json()["deleted"] is True
    assert a.post("/v1/chat/completions", json=CHAT, headers=bearer(new)).status_code == 401
    time.sleep(1.05)  # the cache bound, not a measurement: b may remember the key until then
    r = b.post("/v1/chat/completions", json=CHAT, headers=bearer(new))
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert b.get(f"/v1/admin/keys/{key_id}", headers=bearer(ADMIN)).status_code == 404
    # the config keys kept working throughout
    assert b.post("/v1/chat/completions", json=CHAT, headers=bearer(USER)).status_code == 200


def test_only_admins_manage_keys_and_bad_input_is_a_400(tmp_path: Path) -> None:
    with ExitStack() as stack:
        c = replica(stack, config(f"sqlite:///{tmp_path / 'r.db'}"))
        assert c.post("/v1/admin/keys", json={"tenant": "x"}, headers=bearer(USER)).status_code == 403
        assert c.get("/v1/admin/keys").status_code == 401
        for body, param in (({"tenant": "x", "role": "root"}, "role"),
                            ({"tenant": "x", "models": ["nope"]}, "models.0"),
                            ({"tenant": "x", "rpm": 0}, "rpm"),
                            ({"tenant": "x", "surprise": 1}, "surprise"),
                            ({}, "tenant")):
            r = c.post("/v1/admin/keys", json=body, headers=bearer(ADMIN))
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["param"] == param, r.text
        # a managed admin key can manage keys too
        admin = c.post("/v1/admin/keys", json={"tenant": "ops", "role": "admin"},
                       headers=bearer(ADMIN)).json()["key"]
        assert c.get("/v1/admin/keys", headers=bearer(admin)).status_code == 200
        # paged
        for i in range(3):
            c.post("/v1/admin/keys", json={"tenant": f"t{i}"}, headers=bearer(ADMIN))
        first = c.get("/v1/admin/keys?limit=2", headers=bearer(ADMIN)).json()
        rest = c.get(f"/v1/admin/keys?limit=2&after={first['last_id']}", headers=bearer(ADMIN)).json()
        assert first["has_more"] and not rest["has_more"]
        assert len({k["id"] for k in first["data"] + rest["data"]}) == 4


def test_an_open_server_has_no_managed_keys() -> None:
    cfg = RedlineConfig(store={"url": "memory://"}, cache={"enabled": False})
    with ExitStack() as stack:
        c = replica(stack, cfg)
        r = c.post("/v1/admin/keys", json={"tenant": "x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "keys_not_enabled"


def test_allowlist_budget_and_own_limits(tmp_path: Path) -> None:
    with ExitStack() as stack:
        c = replica(stack, config(f"sqlite:///{tmp_path / 'r.db'}"))

        narrow = make_key(c, models=["fake"])
        listed = c.get("/v1/models", headers=bearer(narrow)).json()["data"]
        assert [m["id"] for m in listed] == ["fake"]
        assert c.get("/v1/models/fake", headers=bearer(narrow)).json()["id"] == "fake"
        r = c.get("/v1/models/other", headers=bearer(narrow))  # configured, not this key's
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert c.post("/v1/chat/completions", json=CHAT, headers=bearer(narrow)).status_code == 200
        for model in ("other", "auto"):  # auto is a model choice too: only if listed
            r = c.post("/v1/chat/completions", json={**CHAT, "model": model}, headers=bearer(narrow))
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        # a job is no way around it
        r = c.post("/v1/chat/completions", json={**CHAT, "model": "other", "background": True},
                   headers=bearer(narrow))
        assert r.status_code == 404, r.text
        # the tenant's other key is not narrowed
        r = c.post("/v1/chat/completions", json={**CHAT, "model": "other"}, headers=bearer(USER))
        assert r.status_code == 200

        # a budget of 10 tokens: the first answer (1 + 20 tokens) spends it, then 429
        budget = make_key(c, budget_tokens=10, budget_period_s=86400)
        assert c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 20},
                      headers=bearer(budget)).status_code == 200
        last: list[Any] = []

        def spent() -> bool:
            last[:] = [c.post("/v1/chat/completions", json=CHAT, headers=bearer(budget))]
            return bool(last[0].status_code == 429)

        wait_until(spent, timeout=10)  # charged when the answer ends (a store add)
        err = last[0].json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "insufficient_quota"
        assert float(last[0].headers["retry-after"]) > 0
        # a budget is the key's, not the tenant's
        assert c.post("/v1/chat/completions", json=CHAT, headers=bearer(USER)).status_code == 200

        # limits of its own: rpm 2 for this key, the tenant's other keys unaffected
        limited = make_key(c, rpm=2)
        codes = [c.post("/v1/chat/completions", json=CHAT, headers=bearer(limited)).status_code
                 for _ in range(3)]
        assert codes == [200, 200, 429], codes
        assert c.post("/v1/chat/completions", json=CHAT, headers=bearer(USER)).status_code == 200


def test_a_key_the_store_cannot_check_is_a_503_not_a_401() -> None:
    """Redis down: config keys still work; a managed key is not called bad (401), the
    client is told to retry (503)."""
    import asyncio

    from redline.api.auth import Auth, ManagedKeys
    from redline.config import AuthConfig
    from redline.store.keys import KeyStore
    from redline.store.redis_store import RedisStore

    async def run() -> None:
        store = RedisStore("redis://127.0.0.1:1/0")  # nothing listens there
        auth = Auth(app=None, config=AuthConfig(keys=[{"name": "ops", "sha256": digest(ADMIN)}]),  # type: ignore[arg-type, list-item]
                    managed=ManagedKeys(KeyStore(store), 1.0))

        def scope(key: str) -> dict[str, Any]:
            return {"type": "http", "path": "/v1/models",
                    "headers": [(b"authorization", f"Bearer {key}".encode())]}

        assert await auth.check(scope(ADMIN)) is None
        refused = await auth.check(scope("sk-rl-somekey"))
        assert refused is not None and refused.status == 503 and refused.retry_after
        await store.close()

    asyncio.run(run())


def test_a_generation_slot_never_reported_is_freed_after_its_lease() -> None:
    from redline.api.slots import Slots

    slots = Slots(lease_s=0.05)
    assert slots.acquire("t", "r1", cap=1) and not slots.acquire("t", "r2", cap=1)
    slots.release("r1")
    assert slots.acquire("t", "r2", cap=1)
    time.sleep(0.06)  # r2's end never came: the lease backstop frees it
    assert slots.acquire("t", "r3", cap=1) and slots.count("t") == 1


def test_embeddings_are_held_to_the_key(tmp_path: Path) -> None:
    """/v1/embeddings names a model too: a key's allowlist decides whether it may use it,
    and the tokens it embeds are charged to the key's budget (the bundled MiniLM)."""
    embed = {"model": "all-minilm-l6-v2", "input": ["how do I reset my password please"]}
    with ExitStack() as stack:
        c = replica(stack, config(f"sqlite:///{tmp_path / 'r.db'}"))

        def listed(key: str) -> list[str]:
            return [m["id"] for m in c.get("/v1/models", headers=bearer(key)).json()["data"]]

        assert "all-minilm-l6-v2" in listed(USER)
        narrow = make_key(c, models=["fake"])
        assert "all-minilm-l6-v2" not in listed(narrow)
        rerank = {"query": "reset my password", "documents": ["a password reset", "a cat"]}
        for path, body in (("/v1/embeddings", embed), ("/rerank", rerank),
                           ("/score", {"text_1": "a", "text_2": "b"})):
            r = c.post(path, json=body | {"model": "all-minilm-l6-v2"}, headers=bearer(narrow))
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        allowed = make_key(c, models=["all-minilm-l6-v2"])
        assert listed(allowed) == ["all-minilm-l6-v2"]
        r = c.post("/v1/embeddings", json=embed, headers=bearer(allowed))
        assert r.status_code == 200, r.text
        used = r.json()["usage"]["total_tokens"]
        assert used > 5
        r = c.post("/rerank", json=rerank, headers=bearer(allowed))  # the model by default
        assert r.status_code == 200 and r.json()["results"][0]["index"] == 0, r.text

        budget = make_key(c, budget_tokens=5, budget_period_s=86400)
        assert c.post("/v1/embeddings", json=embed, headers=bearer(budget)).status_code == 200
        last: list[Any] = []

        def spent() -> bool:
            last[:] = [c.post("/v1/embeddings", json=embed, headers=bearer(budget))]
            return bool(last[0].status_code == 429)

        wait_until(spent, timeout=10)  # charged after the answer (a store add)
        assert last[0].json()["error"]["code"] == "insufficient_quota"
        # the same budget a completion draws on
        r = c.post("/v1/chat/completions", json=CHAT, headers=bearer(budget))
        assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota"
