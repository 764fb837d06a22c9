"""POST /rerank, /v1/rerank, /v2/rerank and /score, /v1/score (the models and fields:
api/rerank.py), held to the key and the tenant as an embeddings request is."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from redline.api.embeddings import encoder_request, told
from redline.api.rerank import RerankRequest, ScoreRequest, model_of, rerank, score
from redline.api.services import services_of
from redline.api.tenant import tenant_from

router = APIRouter()


async def _answer(request: Request, model: str | None, texts: list[str], user: str | None,
                  answer: Callable[[str], Awaitable[tuple[int, bytes, int]]]) -> Response:
    services = services_of(request.app)
    name = model_of(services.config, model)
    tenant = tenant_from(request.scope, request.headers.get("authorization", ""))
    line = encoder_request(name, texts, tenant, "A", user)
    # the key's model allowlist and budget, the tenant's concurrent requests and tokens
    await services.gate.enter(request.scope, line)
    status, content = await told(services.pipeline, line, answer(name))
    return Response(content, status_code=status, media_type="application/json")


async def _rerank(body: RerankRequest, request: Request) -> Response:
    services = services_of(request.app)
    return await _answer(request, body.model, body.all_texts(), body.user,
                         lambda name: rerank(services.config, services.pipeline.cache,
                                             request.url.path, body, name))


async def _score(body: ScoreRequest, request: Request) -> Response:
    services = services_of(request.app)
    return await _answer(request, body.model, body.all_texts(), body.user,
                         lambda name: score(services.config, services.pipeline.cache,
                                            request.url.path, body, name))


for _path in ("/rerank", "/v1/rerank", "/v2/rerank"):
    router.add_api_route(_path, _rerank, methods=["POST"], response_model=None)
for _path in ("/score", "/v1/score"):
    router.add_api_route(_path, _score, methods=["POST"], response_model=None)
