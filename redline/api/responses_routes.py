"""The Responses API: POST /v1/responses, GET/DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items, and the resume of a response's stream
(GET /v1/responses/{id}?stream=true&starting_after=N).

redline serves it itself on its pipeline: the request becomes the same typed request as
a chat completion (api/responses_request.py), whatever the backend speaks; the answer is
assembled into output items (api/responses_output.py). State lives in the one store
(redline/responses/): a stored response is written before its answer returns (before
`response.completed` when streamed), so a follow-up by `previous_response_id` works on
any replica sharing the store. A streamed, stored response runs through the stream
manager under its own id, so it can be resumed from its journal, from any replica."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from redline.api import capabilities, sse
from redline.api import responses_request as rq
from redline.api.responses_output import DONE, Output, outcome, response_json
from redline.api.services import services_of
from redline.api.tenant import tenant_of
from redline.errors import InvalidRequest, NotFound
from redline.pipeline import Completion
from redline.responses import ResponseRecord, ResponseRecords
from redline.streams import Progress
from redline.types import FinishReason

router = APIRouter()

# chat's field names in capability errors, as the Responses API names them
_PARAMS = {"messages": "input", "response_format": "text.format"}

_FINAL = {"completed": "response.completed", "incomplete": "response.incomplete",
          "failed": "response.failed", "cancelled": "response.failed"}


def _records(request: Request) -> ResponseRecords:
    services = services_of(request.app)
    return ResponseRecords(services.store, services.config.responses.ttl_s)


def _not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param=param)


@router.post("/v1/responses", response_model=None)
async def create(request: Request) -> Response:
    body = rq.parse(await request.body())
    tenant = tenant_of(request)
    records = _records(request)
    context: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        previous = await records.get(body.previous_response_id, tenant)
        if previous is None:
            raise _not_found(body.previous_response_id, "previous_response_id")
        if previous.response.get("status") == "in_progress":
            raise InvalidRequest(f"Response '{previous.id}' is still in progress.",
                                 param="previous_response_id")
        context = previous.chain()
    items = rq.normalize(body.input)
    tier = request.headers.get("x-redline-tier") or body.tier
    if tier is not None and tier not in ("S", "A", "B", "auto"):
        raise InvalidRequest("X-Redline-Tier must be one of S, A, B, auto", param="tier")
    gen = rq.generation(body, context + items, tier, tenant,
                        "no-cache" in request.headers.get("cache-control", "").lower())
    services = services_of(request.app)
    try:
        capabilities.check(services.config, gen)
        await services.gate.enter(request.scope, gen)  # per-key limits
        completion = await services.pipeline.complete(gen)  # the router checks capabilities
    except InvalidRequest as exc:  # named as this API names the field
        exc.param = _PARAMS.get(exc.param or "", exc.param)
        raise
    response_id = gen.id.replace("req-", "resp_")
    headers = {"X-Request-Id": response_id, "X-Redline-Model": completion.model,
               "X-Redline-Tier": completion.tier, "X-Redline-Cache": completion.cache}
    run = _Run(body, response_id, completion, records, items, context)
    if body.stream:
        streams = services_of(request.app).streams
        events = run.events(streams.progress(gen, completion.model, completion.tier))
        headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        if not body.store:  # kept nowhere, not even in a journal: not resumable
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        # the events up to the first output delta are taken here, as chat's first token
        # is: the response's first write carries them (not a trip through a producer task)
        first: list[bytes] = []
        try:
            while not run.primed:
                first.append(await events.__anext__())
        except StopAsyncIteration:
            pass
        except BaseException:  # cancelled while waiting: free the upstream or engine now
            await events.aclose()
            raise
        live = streams.start(response_id, events, tenant=tenant, first=first)
        return sse.EventStream(streams.follow(live), headers=headers, first_ready=bool(first))
    async for chunk in completion.chunks:
        run.output.add(chunk)
        run.note(chunk.finish_reason, chunk.error)
    run.output.close()
    answer = await run.finish()
    return Response(orjson.dumps(answer), media_type="application/json", headers=headers)


class _Run:
    """One response being produced: its output, how it ended, and its record."""

    def __init__(self, body: rq.ResponsesRequest, response_id: str, completion: Completion,
                 records: ResponseRecords, items: list[dict[str, Any]],
                 context: list[dict[str, Any]]) -> None:
        self.body, self.id, self.completion = body, response_id, completion
        self.records, self.items, self.context = records, items, context
        self.output = Output()
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.primed = False  # the events of the first output delta have been yielded
        self._in_progress: asyncio.Task[None] | None = None

    def note(self, finish: FinishReason | None, error: str | None) -> None:
        if finish is not None:
            self.finish_reason, self.error = finish, error

    def snapshot(self, status: str) -> dict[str, Any]:
        return response_json(self.body, self.id, self.output.created_at, self.completion.model,
                             status, [])

    async def finish(self) -> dict[str, Any]:
        """The whole Response, stored (when asked) before anyone sees it."""
        status, error, incomplete = outcome(self.finish_reason or "stop", self.error)
        answer = response_json(self.body, self.id, self.output.created_at,
                               self.completion.model, status, self.output.items,
                               self.completion.usage, error, incomplete)
        if self.body.store:
            if self._in_progress is not None:  # never written over the final record
                await asyncio.gather(self._in_progress, return_exceptions=True)
            await self.records.put(ResponseRecord(self.completion.request.tenant, answer,
                                                  self.items, self.context))
        return answer

    async def events(self, progress: Progress | None) -> AsyncGenerator[bytes, None]:
        out, c = self.output, self.completion
        yield out.event("response.created", {"response": self.snapshot("in_progress")})
        if self.body.store:  # retrievable (in_progress) on any replica while it streams;
            # written aside, off the first token's way (finish() waits for it)
            self._in_progress = asyncio.create_task(self.records.put(ResponseRecord(
                c.request.tenant, self.snapshot("in_progress"), self.items, self.context)))
            # a failure is seen by finish(); abandoned before it, nobody else needs it
            self._in_progress.add_done_callback(lambda t: t.cancelled() or t.exception())
        yield out.event("response.in_progress", {"response": self.snapshot("in_progress")})
        try:
            async for chunk in c.chunks:
                if chunk.finish_reason == "error":
                    self.note("error", chunk.error)
                    break
                at = None if progress is None else {"progress": progress.advance(chunk.tokens)}
                step = out.add(chunk, at)
                for i, event in enumerate(step):
                    self.primed = self.primed or i == len(step) - 1
                    yield event
                self.note(chunk.finish_reason, None)
        except Exception as exc:  # after the stream began: it ends as response.failed
            self.note("error", f"generation failed: {type(exc).__name__}")
        finally:
            close = getattr(c.chunks, "aclose", None)
            if close is not None:
                with contextlib.suppress(RuntimeError):
                    await close()
        for event in out.close():
            yield event
        try:
            answer = await self.finish()
        except Exception as exc:  # the store failed: the client must not count on the id
            yield out.event("error", {"code": "store_unavailable", "param": None,
                                      "message": f"the response could not be stored: {exc}"})
            yield DONE
            return
        redline: dict[str, Any] = {"timings": {k: round(v * 1000, 2)
                                               for k, v in c.timings.seconds.items()}}
        if progress is not None:
            redline["progress"] = progress.finish()
        yield out.event(_FINAL[answer["status"]], {"response": answer, "redline": redline})
        yield DONE


@router.get("/v1/responses/{response_id}", response_model=None)
async def retrieve(response_id: str, request: Request) -> Response:
    tenant = tenant_of(request)
    query = request.query_params
    if query.get("stream", "false").lower() == "true":
        after = query.get("starting_after", "-1")
        if not after.lstrip("-").isdigit() or int(after) < -1:
            raise InvalidRequest("starting_after must be an event's sequence_number.",
                                 param="starting_after")
        streams = services_of(request.app).streams
        try:  # sequence numbers count from 0: events after N are those past the N+1 first
            events = await streams.open(response_id, int(after) + 1, tenant=tenant)
        except NotFound:
            raise _not_found(response_id) from None
        return sse.EventStream(events, headers={"Cache-Control": "no-cache",
                                                "X-Accel-Buffering": "no"})
    record = await _records(request).get(response_id, tenant)
    if record is None:
        raise _not_found(response_id)
    return Response(orjson.dumps(record.response), media_type="application/json")


@router.delete("/v1/responses/{response_id}", response_model=None)
async def delete(response_id: str, request: Request) -> dict[str, Any]:
    records, tenant = _records(request), tenant_of(request)
    record = await records.get(response_id, tenant)
    if record is None:
        raise _not_found(response_id)
    if record.response.get("status") == "in_progress":  # its end would write it again
        raise InvalidRequest(f"Response '{response_id}' is still in progress.",
                             param="response_id")
    await records.delete(response_id, tenant)
    streams = services_of(request.app).streams
    await streams.journal.drop(response_id)  # nor can its stream be replayed any more
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel", response_model=None)
async def cancel(response_id: str, request: Request) -> Response:
    if await _records(request).get(response_id, tenant_of(request)) is None:
        raise _not_found(response_id)
    # background responses are not served yet, so none of them can be cancelled
    raise InvalidRequest("Only background responses can be cancelled.", param="response_id")


@router.get("/v1/responses/{response_id}/input_items", response_model=None)
async def input_items(response_id: str, request: Request) -> dict[str, Any]:
    query = request.query_params
    limit_raw, order, after = query.get("limit", "20"), query.get("order", "desc"), query.get("after")
    if not limit_raw.isdigit() or not 1 <= int(limit_raw) <= 100:
        raise InvalidRequest("limit must be between 1 and 100.", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be asc or desc.", param="order")
    record = await _records(request).get(response_id, tenant_of(request))
    if record is None:
        raise _not_found(response_id)
    items = list(record.input) if order == "asc" else list(reversed(record.input))
    if after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if at is None:
            raise InvalidRequest(f"No input item '{after}' in this response.", param="after")
        items = items[at + 1:]
    page, limit = items[:int(limit_raw)], int(limit_raw)
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
