"""The API tests' gateway: redline on a real uvicorn thread in front of the fake
OpenAI-compatible upstream, whose model "served" redline calls "remote"; optionally a
fake local backend ("local") beside it. One helper for the API tests that need a socket
(test_api_embeddings, test_api_messages, test_api_fidelity, the Responses tests)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import LiveApp, wait_ready

from redline.api.app import create_app
from redline.backends.base import Backend
from redline.backends.fake import FakeBackend
from redline.backends.fake_upstream import UpstreamSpec, create_upstream
from redline.backends.openai_compat import from_config
from redline.config import RedlineConfig


class Live(LiveApp):
    """LiveApp with a longer wait for readiness (the machine is shared and busy)."""

    def __enter__(self) -> Live:
        self.thread.start()
        wait_ready(self.url, timeout=180)
        return self


@contextlib.contextmanager
def gateway(data: Path, upstream: UpstreamSpec, *, upstream_model: str = "served",
            local: bool = False, server: dict[str, Any] | None = None,
            **config: Any) -> Iterator[tuple[str, str]]:
    """(redline's url, the upstream's url). `config`: more of RedlineConfig's sections
    (the response cache is off unless given)."""
    with Live(create_upstream(upstream, name="served")) as up:
        models: list[dict[str, Any]] = [{"name": "remote", "backend": "openai", "url": up.url,
                                         "upstream_model": upstream_model}]
        if local:
            models.append({"name": "local", "bundled": "x"})  # served by a FakeBackend
        cfg = RedlineConfig(models=models, **({"cache": {"enabled": False}} | config),
                            server={**(server or {}), "data_dir": str(data)})
        backends: dict[str, Backend] = {"remote": from_config(cfg.models[0])}
        if local:
            backends["local"] = FakeBackend("local")
        with Live(create_app(cfg, backends=backends)) as gw:
            yield gw.url, up.url


__all__ = ["Live", "gateway"]
