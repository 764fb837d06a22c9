"""POST /v1/embeddings (the models and bounds: api/embeddings.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from redline.api.embeddings import LOCAL_MODEL, EmbeddingRequest, check_model, embed, local_available
from redline.api.services import services_of

router = APIRouter()


@router.post("/v1/embeddings", response_model=None)
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    services = services_of(request.app)
    check_model(services.config, body.model)
    # held to the key as a completion is: its model allowlist, and its token budget
    await services.gate.check_model(request.scope, body.model)
    status, content, tokens = await embed(services.config, services.pipeline.cache, body)
    services.gate.charge(request.scope, tokens)
    return Response(content, status_code=status, media_type="application/json")


__all__ = ["LOCAL_MODEL", "local_available", "router"]
