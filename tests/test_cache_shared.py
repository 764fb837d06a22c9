"""Replicas share the cache through the store: two apps on one real redis-server, and
one app restarted on the same SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_cache_api import ask, make_app, ready, settle

from redline.api.services import services_of


def test_two_replicas_on_one_redis_share_exact_and_semantic_hits(tmp_path: Path, redis_url: str) -> None:
    app_a, backend_a = make_app(tmp_path / "a", store_url=redis_url)
    app_b, backend_b = make_app(tmp_path / "b", store_url=redis_url)
    with TestClient(app_a) as a, TestClient(app_b) as b:
        ready(a), ready(b)
        assert ask(a, "How long does shipping to Canada take?").headers["x-redline-cache"] == "miss"
        settle(a)
        r = ask(b, "How long does shipping to Canada take?")
        assert r.headers["x-redline-cache"] == "hit"
        r = ask(b, "how long does shipping to canada take")
        assert r.headers["x-redline-cache"] == "semantic"
        assert ask(b, "How long does shipping to Mexico take?").headers["x-redline-cache"] == "miss"
        settle(b)
        # and back: B's answer about Mexico is a hit on A
        assert ask(a, "How long does shipping to Mexico take?").headers["x-redline-cache"] == "hit"
        # tenants stay apart across replicas too
        assert ask(b, "How long does shipping to Canada take?",
                   headers={"Authorization": "Bearer sk-other"}).headers["x-redline-cache"] == "miss"
    assert backend_a.calls == 1 and backend_b.calls == 2


def test_sqlite_cache_survives_restart(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, store_url=None)  # the default: sqlite under data_dir
    assert services_of(app).config.store.url.startswith("sqlite:///")
    with TestClient(app) as client:
        ready(client)
        first = ask(client, "What are your opening hours?").json()
        settle(client)
    assert (tmp_path / "redline.db").exists()
    app2, backend2 = make_app(tmp_path, store_url=None)
    with TestClient(app2) as client:
        ready(client)
        r = ask(client, "What are your opening hours?")
        assert r.headers["x-redline-cache"] == "hit"
        assert r.json()["choices"] == first["choices"]
        assert ask(client, "what are your opening hours").headers["x-redline-cache"] == "semantic"
    assert backend2.calls == 0


@pytest.mark.slow
def test_real_embedder_semantic_hits_across_replicas_on_redis(tmp_path: Path, redis_url: str) -> None:
    """The configured embedder (all-MiniLM-L6-v2, loaded at start) and default threshold."""
    from redline.api.app import create_app
    from redline.backends.fake import FakeBackend
    from redline.config import RedlineConfig

    def app(name: str):  # type: ignore[no-untyped-def]
        cfg = RedlineConfig(server={"data_dir": str(tmp_path / name)}, store={"url": redis_url})
        return create_app(cfg, backends={"fake": FakeBackend()})

    with TestClient(app("a")) as a, TestClient(app("b")) as b:
        ready(a), ready(b)
        assert services_of(a.app).pipeline.cache.index is not None
        ask(a, "How can I reset my password?")
        settle(a)
        assert ask(b, "How do I reset my password?").headers["x-redline-cache"] == "semantic"
        assert ask(b, "How can I reset my username?").headers["x-redline-cache"] == "miss"
        assert ask(b, "How can I not reset my password?").headers["x-redline-cache"] == "miss"
