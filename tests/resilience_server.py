"""A redline app (FakeBackend) on the hardened server of `redline.api.server`, in a
thread, on a free loopback port: for the fuzz, slow-client and Redis tests."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import free_port, wait_ready

from redline.api.app import create_app
from redline.api.server import build
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig


def fake_config(tmp: Path, **sections: Any) -> RedlineConfig:
    base: dict[str, Any] = {"server": {"data_dir": str(tmp)}, "store": {"url": "memory://"},
                            "cache": {"enabled": False}}
    return RedlineConfig(**{**base, **sections})


class HardenedServer:
    def __init__(self, config: RedlineConfig, backend: FakeBackend | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backend = backend or FakeBackend("fake")
        self.app = create_app(config, backends={"fake": self.backend})
        self.server = build(self.app, "127.0.0.1", self.port, config.limits, "warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> HardenedServer:
        self.thread.start()
        wait_ready(self.url, timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
