"""The Responses API tests' gateway (gateway_support.py: redline on a real uvicorn thread
in front of the fake OpenAI-compatible upstream, "remote", and the fake local backend,
"local"), and two official `openai` clients whose bearer tokens make two tenants (an open
server)."""

from __future__ import annotations

from collections.abc import Iterator

import gateway_support
import openai
import pytest

from redline.backends.fake_upstream import Dist, UpstreamSpec

Gateway = tuple[openai.OpenAI, openai.OpenAI, str, str]


@pytest.fixture(scope="module", name="gateway")
def responses_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway_support.gateway(tmp_path_factory.mktemp("responses"),
                                 UpstreamSpec(ttft=Dist(0.0), tpot=Dist(0.0), cached_tokens=1,
                                              tokenize=True),
                                 local=True, default_model="remote") as (gw, up):
        # two bearer tokens on an open server: two tenants
        client = openai.OpenAI(base_url=f"{gw}/v1", api_key="key-a", max_retries=0)
        other = openai.OpenAI(base_url=f"{gw}/v1", api_key="key-b", max_retries=0)
        yield client, other, gw, up
        client.close()
        other.close()


