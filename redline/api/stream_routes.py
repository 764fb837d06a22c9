"""GET /v1/streams/{stream_id}: resume a stream after a dropped connection.

`Last-Event-ID: <stream_id>:<seq>` (what an EventSource sends by itself) or
`?after=<seq>` says the last event the client has; the response replays every event
after it, follows the live ones, and ends with `data: [DONE]`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from redline.api import sse, stream_takeover
from redline.api.services import services_of
from redline.api.tenant import tenant_of
from redline.errors import InvalidRequest

router = APIRouter()


def _after(stream_id: str, last_event_id: str | None, after: str | None) -> int:
    if after is not None:
        if not (after.isascii() and after.isdigit()):  # "²".isdigit(), yet no int
            raise InvalidRequest("`after` must be an event seq (a whole number >= 0).", param="after")
        return int(after)
    if last_event_id is None:
        return 0  # from the start
    try:
        sid, seq = sse.parse_event_id(last_event_id.strip())
    except ValueError:
        raise InvalidRequest("Last-Event-ID must look like '<stream_id>:<seq>'.",
                             param="Last-Event-ID") from None
    if sid != stream_id:
        raise InvalidRequest(f"Last-Event-ID names stream '{sid}', not '{stream_id}'.",
                             param="Last-Event-ID")
    return seq


@router.get("/v1/streams/{stream_id}", response_model=None)
async def resume_stream(stream_id: str, request: Request) -> sse.EventStream:
    streams = services_of(request.app).streams
    after = _after(stream_id, request.headers.get("last-event-id"),
                   request.query_params.get("after"))
    tenant = tenant_of(request)
    # its gateway died (streams.journal_live): continue it here, then follow it
    await stream_takeover.take_over(services_of(request.app), stream_id, tenant)
    events = await streams.open(stream_id, after, tenant=tenant)
    headers = {"X-Redline-Stream-Id": stream_id, "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
    return sse.EventStream(events, headers=headers)
