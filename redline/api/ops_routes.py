"""Operations: liveness, readiness, metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from redline.api.services import services_of

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    services = services_of(request.app)
    if services.pipeline.ready and not services.draining:
        return JSONResponse({"status": "ready"})
    reason = "draining" if services.draining else "loading"
    return JSONResponse({"status": reason}, status_code=503, headers={"Retry-After": "1"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(services_of(request.app).metrics.render(), media_type=CONTENT_TYPE_LATEST)
