"""A request that a remote model's engine answers as it is (its /v1/embeddings, its
/tokenize): sent to the model's first replica with its key and the model name mapped."""

from __future__ import annotations

from typing import Any

import httpx

from redline.config import ModelConfig
from redline.errors import BackendError


async def post(model: ModelConfig, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST `body` to `path` from the engine's root (a replica URL's /v1 left off); the
    answer whatever its status, a BackendError where the engine cannot be reached."""
    root = model.replica_urls()[0].rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {model.api_key}"} if model.api_key else {}
    sent = body | {"model": model.upstream_model or model.name}
    try:
        async with httpx.AsyncClient(timeout=model.read_timeout_s) as client:
            return await client.post(f"{root}{path}", json=sent, headers=headers)
    except httpx.HTTPError as exc:
        raise BackendError(f"{model.name}: upstream unreachable ({type(exc).__name__})") from exc


__all__ = ["post"]
