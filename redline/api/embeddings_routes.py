"""POST /v1/embeddings (the models and bounds: api/embeddings.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from redline.api.embeddings import EmbeddingRequest, as_request, check_model, embed_told
from redline.api.services import services_of
from redline.api.tenant import tenant_from

router = APIRouter()


@router.post("/v1/embeddings", response_model=None)
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    services = services_of(request.app)
    check_model(services.config, body.model)
    tenant = tenant_from(request.scope, request.headers.get("authorization", ""))
    line = as_request(body, tenant, "A")
    # held to the key and the tenant as a completion is: the key's model allowlist and
    # budget, the concurrent requests and the tokens of the tenant's window
    await services.gate.enter(request.scope, line)
    status, content = await embed_told(services.config, services.pipeline, body, line)
    return Response(content, status_code=status, media_type="application/json")

