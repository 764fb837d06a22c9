"""Operator endpoints: the long-tail log, the live figures behind the dashboard, and
usage per tenant, key and model."""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from redline.api.auth import require_admin
from redline.api.services import services_of
from redline.errors import InvalidRequest
from redline.telemetry.usage import NAMES, Row, UsageLog

DAY = 86400
MAX_WINDOW_S = 93 * DAY  # hourly counters are read one hour at a time

router = APIRouter(dependencies=[Depends(require_admin)])  # operators only


@router.get("/v1/admin/slow")
async def slow(request: Request, limit: int = Query(50, ge=1, le=1000)) -> dict[str, Any]:
    """Recent requests over their tier's budget, newest first, with their stage breakdown."""
    records = await services_of(request.app).longtail.recent(limit)
    return {"object": "list", "data": records}


@router.get("/v1/admin/stats")
async def stats(request: Request,
                window_s: float = Query(300.0, gt=0, le=3600)) -> dict[str, Any]:
    """What the dashboard page polls: this replica's last `window_s` seconds."""
    state = services_of(request.app)
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
        "cache_lookup": _cache_lookup(state),
    }


def _cursor(row: Row) -> str:
    return base64.urlsafe_b64encode(f"{row.tenant}\t{row.key}\t{row.model}".encode()).decode()


def _row(cursor: str) -> Row:
    try:
        tenant, key, model = base64.urlsafe_b64decode(cursor.encode()).decode().split("\t")
    except ValueError as exc:  # binascii.Error and UnicodeDecodeError are ValueErrors
        raise InvalidRequest("`after` is not a row id of this list.", param="after") from exc
    return Row(tenant, key, model)


def _grouped(rows: dict[Row, dict[str, int]], by: str) -> dict[Row, dict[str, int]]:
    out: dict[Row, dict[str, int]] = {}
    for row, counts in rows.items():
        merged = Row(row.tenant, row.key if by in ("key", "model") else "",
                     row.model if by == "model" else "")
        into = out.setdefault(merged, dict.fromkeys(NAMES, 0))
        for name, n in counts.items():
            into[name] += n
    return out


@router.get("/v1/admin/usage")
async def usage(request: Request, start: float | None = Query(None, ge=0),
                end: float | None = Query(None, ge=0), tenant: str | None = None,
                group_by: Literal["tenant", "key", "model"] = "model",
                limit: int = Query(100, ge=1, le=1000),
                after: str | None = None) -> dict[str, Any]:
    """Requests, input/output/cached tokens and errors per tenant (and key, and model)
    over [start, end) in Unix seconds (default: the last 24 hours), counted by the whole
    hours that overlap it; paged with `limit` and `after` (a row's `id`)."""
    now = time.time()
    end = now if end is None else end
    start = end - DAY if start is None else start
    if start >= end:
        raise InvalidRequest("`start` must be before `end`.", param="start")
    if end - start > MAX_WINDOW_S:
        raise InvalidRequest(f"The window is at most {MAX_WINDOW_S // DAY} days.", param="start")
    log: UsageLog = services_of(request.app).usage
    rows = _grouped(await log.report(start, end, tenant), group_by)
    ordered = sorted(rows.items())
    if after is not None:
        last = _row(after)
        ordered = [(r, c) for r, c in ordered if r > last]
    page = ordered[:limit]
    data = [{"id": _cursor(r), "object": "usage", "tenant": r.tenant,
             "key": r.key if group_by != "tenant" else None,
             "model": r.model if group_by == "model" else None, **c} for r, c in page]
    return {"object": "list", "start": start, "end": end, "group_by": group_by, "data": data,
            "has_more": len(ordered) > limit, "last_id": data[-1]["id"] if data else None}


def _cache_lookup(state: Any) -> dict[str, float | int | bool | None] | None:
    """Whether the semantic lookup pays on recent traffic (cache.semantic_skip)."""
    cache = state.pipeline.cache
    payoff = cache.payoff if cache is not None and cache.index is not None else None
    return payoff.summary() if payoff is not None else None


def _cache_budget(state: Any) -> dict[str, float | int | bool | None] | None:
    """The semantic cache's error budget (cache.max_wrong_hit_rate), when it is kept."""
    cache = state.pipeline.cache
    verifier = cache.verifier if cache is not None else None
    return verifier.summary() if verifier is not None else None
