"""The whole app in this process, with an httpx client on it: for commands that must
go through the same pipeline as a request (`redline precompute`) without a server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx

from redline.api.app import create_app
from redline.api.services import services_of
from redline.config import RedlineConfig


@contextlib.asynccontextmanager
async def in_process_client(config: RedlineConfig, timeout: float = 600.0,
                            ready_timeout: float = 600.0) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(config)
    async with app.router.lifespan_context(app):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ready_timeout
        services = services_of(app)
        while not services.pipeline.ready:
            loader = services.loader
            if loader is not None and loader.done() and loader.exception() is not None:
                raise RuntimeError("the models did not start") from loader.exception()
            if loop.time() > deadline:
                raise TimeoutError(f"not ready after {ready_timeout} s")
            await asyncio.sleep(0.05)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://redline",
                                     timeout=timeout) as client:
            yield client
