"""The Responses API tests' gateway: redline on a real uvicorn thread in front of the
fake OpenAI-compatible upstream ("remote") and the fake local backend ("local"), and two
official `openai` clients whose bearer tokens make two tenants (an open server)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from conftest import LiveApp, wait_ready

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.backends.fake_upstream import Dist, UpstreamSpec, create_upstream
from redline.backends.openai_compat import from_config
from redline.config import RedlineConfig


class Live(LiveApp):
    """LiveApp with a longer wait for readiness (the machine is shared and busy)."""

    def __enter__(self) -> Live:
        self.thread.start()
        wait_ready(self.url, timeout=180)
        return self


Gateway = tuple[openai.OpenAI, openai.OpenAI, str, str]


@pytest.fixture(scope="module", name="gateway")
def responses_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("responses")
    with Live(create_upstream(UpstreamSpec(ttft=Dist(0.0), tpot=Dist(0.0), cached_tokens=1),
                               name="served")) as up:
        cfg = RedlineConfig(models=[{"name": "remote", "backend": "openai", "url": up.url,
                                     "upstream_model": "served"},
                                    {"name": "local", "bundled": "x"}],
                            default_model="remote", cache={"enabled": False},
                            server={"data_dir": str(data)})
        backends = {"remote": from_config(cfg.models[0]), "local": FakeBackend("local")}
        with Live(create_app(cfg, backends=backends)) as gw:
            # two bearer tokens on an open server: two tenants
            client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="key-a", max_retries=0)
            other = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="key-b", max_retries=0)
            yield client, other, gw.url, up.url
            client.close()
            other.close()


