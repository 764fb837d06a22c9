"""Operations: liveness, readiness, metrics; and the probe routes vLLM's and llama.cpp's
servers answer (`/health`, `/ping`, `/version`), so probes written for them work here."""

from __future__ import annotations

from importlib import metadata

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
    return _ready(request, "ready")


@router.get("/health")
@router.get("/ping")
@router.post("/ping")
async def health(request: Request) -> JSONResponse:
    """vLLM's `/health` and `/ping` (SageMaker's probe), llama.cpp's `/health`: 200 once
    the models are loaded and warm, 503 before (as llama.cpp's server answers while it
    loads) and while draining."""
    return _ready(request, "ok")


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": metadata.version("redline")}


def _ready(request: Request, ok: str) -> JSONResponse:
    services = services_of(request.app)
    if services.pipeline.ready and not services.draining:
        return JSONResponse({"status": ok})
    reason = "draining" if services.draining else "loading"
    return JSONResponse({"status": reason}, status_code=503, headers={"Retry-After": "1"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(services_of(request.app).metrics.render(), media_type=CONTENT_TYPE_LATEST)
