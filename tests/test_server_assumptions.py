"""What api/server.py assumes of uvicorn's private interface, checked against the
installed uvicorn (pinned in pyproject.toml): the httptools protocol's hooks and its
response cycle's attributes that the server's offer (HOLD_HEAD) reads and swaps. A
uvicorn that renames any of them fails here, not in production."""

from __future__ import annotations

import asyncio
import importlib.metadata
import tomllib
from pathlib import Path
from typing import Any

import uvicorn
from packaging.requirements import Requirement
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from redline.api.server import GuardedHttpTools, protocol
from redline.api.sse import HOLD_HEAD, OFFERS
from redline.config import LimitsConfig
from tests.test_api_relay import _Transport


def test_the_installed_uvicorn_is_within_the_pin() -> None:
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    pin = Requirement(next(r for r in project["project"]["dependencies"]
                           if r.startswith("uvicorn")))
    assert "<" in str(pin.specifier), f"{pin}: a private interface needs an upper bound"
    assert pin.specifier.contains(importlib.metadata.version("uvicorn")), pin


def test_the_protocol_hooks_it_overrides_exist() -> None:
    for hook in ("on_headers_complete", "on_response_complete", "connection_made",
                 "connection_lost", "data_received"):
        assert callable(getattr(HttpToolsProtocol, hook)), hook
        assert getattr(GuardedHttpTools, hook) is not getattr(HttpToolsProtocol, hook) or \
            hook == "data_received"


async def test_a_live_cycle_has_what_the_offers_read() -> None:
    seen: dict[str, Any] = {}
    proto_box: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        cycle = proto_box[0].cycle
        seen["cycle"] = cycle
        seen["offers"] = dict(scope["extensions"][OFFERS])
        # read while the response is under way: what _HeldWrite uses
        await send({"type": "http.response.start", "status": 200, "headers": []})
        seen["attrs"] = {name: getattr(cycle, name) for name in ("transport", "scope")}
        await send({"type": "http.response.body", "body": b"x", "more_body": False})

    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    proto = protocol(LimitsConfig())(config=config, server_state=ServerState(), app_state={})
    proto_box.append(proto)
    transport = _Transport()
    proto.connection_made(transport)
    proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    for _ in range(50):
        await asyncio.sleep(0)
    assert isinstance(seen["cycle"], RequestResponseCycle)
    assert set(seen["offers"]) == {HOLD_HEAD}
    attrs = seen["attrs"]
    assert attrs["transport"] is transport and attrs["scope"] is seen["cycle"].scope
    assert b"".join(transport.writes).endswith(b"1\r\nx\r\n0\r\n\r\n")
    assert OFFERS not in seen["cycle"].scope["extensions"]  # taken back at the end
    proto.connection_lost(None)
