"""A/B experiments for operators: each arm's figures with 95% intervals, and each arm
against the control with its significance tests (JSON the dashboard can draw)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from redline.api.auth import require_admin
from redline.api.services import services_of

router = APIRouter(dependencies=[Depends(require_admin)])  # operators only


@router.get("/v1/admin/experiments")
async def experiments(request: Request) -> dict[str, Any]:
    return services_of(request.app).experiments.snapshot()


@router.delete("/v1/admin/experiments/samples")
async def reset(request: Request) -> dict[str, Any]:
    """Start counting afresh (e.g. after a warm-up, or between an A/A and an A/B run)."""
    services_of(request.app).experiments.reset()
    return {"object": "experiments.reset", "deleted": True}
