"""Operator endpoints: the long-tail log and the live figures behind the dashboard."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from redline.api.auth import require_admin

router = APIRouter(dependencies=[Depends(require_admin)])  # operators only


@router.get("/v1/admin/slow")
async def slow(request: Request, limit: int = Query(50, ge=1, le=1000)) -> dict[str, Any]:
    """Recent requests over their tier's budget, newest first, with their stage breakdown."""
    records = await request.app.state.longtail.recent(limit)
    return {"object": "list", "data": records}


@router.get("/v1/admin/stats")
async def stats(request: Request,
                window_s: float = Query(300.0, gt=0, le=3600)) -> dict[str, Any]:
    """What the dashboard page polls: this replica's last `window_s` seconds."""
    state = request.app.state
    metrics = state.metrics
    live = state.live.summary(window_s) if state.live is not None else None
    return {
        "at": round(time.time(), 3),
        "uptime_s": round(time.time() - state.started_at, 1),
        "metrics_enabled": metrics.enabled,
        "in_flight": metrics.value("redline_requests_in_flight"),
        "interruptions_total": metrics.value("redline_stream_interruptions_total"),
        "resumes_total": metrics.value("redline_stream_resumes_total"),
        "slo_violations_total": {
            t: metrics.value("redline_slo_violations_total", {"tier": t}) for t in ("S", "A", "B")},
        "live": live,
        "hardware": metrics.hardware.sample().to_dict(),
        "slow": await state.longtail.recent(20),
        "cache_budget": _cache_budget(state),
    }


def _cache_budget(state: Any) -> dict[str, float | int | bool] | None:
    """The semantic cache's error budget (cache.max_wrong_hit_rate), when it is kept."""
    cache = state.pipeline.cache
    verifier = cache.verifier if cache is not None else None
    return verifier.summary() if verifier is not None else None
