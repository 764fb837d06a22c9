"""The Responses API: POST /v1/responses, GET/DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items, and the resume of a response's stream
(GET /v1/responses/{id}?stream=true&starting_after=N).

redline serves it itself on its pipeline: the request becomes the same typed request as
a chat completion (api/responses_request.py), whatever the backend speaks; the answer is
assembled into output items (api/responses_output.py). State lives in the one store
(redline/responses/): a stored response is written before its answer returns (before
`response.completed` when streamed), so a follow-up by `previous_response_id` works on
any replica sharing the store. A streamed, stored response runs through the stream
manager under its own id, so it can be resumed from its journal, from any replica.
A background response runs as a durable job (api/responses_background.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from redline.api import capabilities, sse
from redline.api import responses_background as bg
from redline.api import responses_request as rq
from redline.api import responses_truncation as truncation
from redline.api.keyring import key_label
from redline.api.responses_output import response_json
from redline.api.responses_run import OPEN, Run, context_of, fields_named, not_found
from redline.api.services import services_of
from redline.api.tenant import tenant_of
from redline.api.tokenize_routes import chat_tokens, counted_model, read_json
from redline.errors import InvalidRequest, NotFound
from redline.responses import ResponseRecord, ResponseRecords

router = APIRouter()

CANCEL_WAIT_S = 10.0  # a running background response's cancel: its worker sees it in ~1 s
_SSE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _records(request: Request) -> ResponseRecords:
    services = services_of(request.app)
    return ResponseRecords(services.store, services.config.responses.ttl_s)


async def _current(request: Request, response_id: str, tenant: str,
                   records: ResponseRecords) -> dict[str, Any] | None:
    """The Response as stored, or, for a background one, as its job knows it."""
    record = await records.get(response_id, tenant)
    response = None if record is None else record.response
    if response is not None and not (response.get("background")
                                     and response.get("status") in OPEN):
        return response
    jobs = services_of(request.app).jobs
    return bg.view(await jobs.get(response_id, tenant), response)


@router.post("/v1/responses", response_model=None)
async def create(request: Request) -> Response:
    body = rq.parse(await request.body())
    tenant = tenant_of(request)
    records = _records(request)
    context = await context_of(records, body, tenant)
    items = rq.normalize(body.input)
    tier = request.headers.get("x-redline-tier") or body.tier
    if tier is not None and tier not in ("S", "A", "B", "auto"):
        raise InvalidRequest("X-Redline-Tier must be one of S, A, B, auto", param="tier")
    no_cache = "no-cache" in request.headers.get("cache-control", "").lower()
    gen = rq.generation(body, context + items, tier, tenant, no_cache)
    services = services_of(request.app)
    with fields_named():
        capabilities.check(services.config, gen)
        if body.background:  # the router's capability check now: the job decides later
            services.pipeline.router.check(gen)
            await services.gate.check(request.scope, gen)  # the key's allowlist and budget
        else:
            await services.gate.enter(request.scope, gen)  # per-key limits
            completion = await truncation.complete(  # the router checks capabilities
                services.pipeline, gen, body.truncation, context + items,
                lambda chain: rq.generation(body, chain, tier, tenant, no_cache))
    if body.background:
        return await _background(request, body, gen.id.replace("req-", "resp_"), tenant,
                                 bg.spec({}, body, items, context, tier, no_cache,
                                         key_label(request.scope)), records)
    response_id = gen.id.replace("req-", "resp_")
    headers = {"X-Request-Id": response_id, **completion.headers()}
    run = Run(body, response_id, completion, records, items, context)
    if body.stream:
        streams = services.streams
        events = run.events(streams.progress(gen, completion.model, completion.tier))
        headers |= _SSE
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
    answer = await run.whole()
    return Response(orjson.dumps(answer), media_type="application/json", headers=headers)


async def _background(request: Request, body: rq.ResponsesRequest, response_id: str,
                      tenant: str, job_spec: dict[str, Any],
                      records: ResponseRecords) -> Response:
    """Accept a background response: stored as `queued`, then a durable job; the answer
    is the queued Response, or (stream: true) its events as a worker produces them."""
    snapshot = response_json(body, response_id, int(time.time()), body.model, "queued", [])
    job_spec["response"] = snapshot
    await records.put(ResponseRecord(tenant, snapshot, job_spec["items"], job_spec["context"]))
    jobs = services_of(request.app).jobs
    await jobs.submit_response(response_id, tenant, job_spec, body.notify)
    headers = {"X-Request-Id": response_id}
    if body.stream:
        streams = services_of(request.app).streams
        return sse.EventStream(bg.follow(streams, jobs, records, response_id, tenant, 0),
                               headers=headers | _SSE)
    return Response(orjson.dumps(snapshot), media_type="application/json", headers=headers)


@router.post("/v1/responses/input_tokens", response_model=None)
async def input_tokens(request: Request) -> Response:
    """OpenAI's `responses.input_tokens.count`: the input tokens a request's usage would
    report (its instructions, the conversation `previous_response_id` continues, its tools
    as the engine renders them), before it is sent. An embedded model counts them with its
    own tokenizer; a remote one's engine counts the chat redline would send it, at its
    own /tokenize (api/tokenize_routes.py). The whole input is counted, as
    `truncation: "auto"` would find it."""
    services = services_of(request.app)
    raw = await read_json(request)
    name = await counted_model(services, request, raw)  # a key's allowlist too
    body = rq.parse(orjson.dumps(raw))
    tenant = tenant_of(request)
    context = await context_of(_records(request), body, tenant)
    with fields_named():
        gen = rq.generation(body, context + rq.normalize(body.input), None, tenant, True)
        capabilities.check(services.config, gen)  # what POST /v1/responses would refuse
    count = await chat_tokens(services, name, gen)
    return _json({"object": "response.input_tokens", "input_tokens": count})


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
            records = _records(request)
            record = await records.get(response_id, tenant)
            jobs = services_of(request.app).jobs
            if (record is None or not record.response.get("background")) and \
                    await jobs.get(response_id, tenant) is None:
                raise not_found(response_id) from None
            # a background response not begun yet (queued) or whose journal is gone
            events = bg.follow(streams, jobs, records, response_id, tenant, int(after) + 1)
        return sse.EventStream(events, headers=_SSE)
    response = await _current(request, response_id, tenant, _records(request))
    if response is None:
        raise not_found(response_id)
    return Response(orjson.dumps(response), media_type="application/json")


@router.delete("/v1/responses/{response_id}", response_model=None)
async def delete(response_id: str, request: Request) -> dict[str, Any]:
    records, tenant = _records(request), tenant_of(request)
    record = await records.get(response_id, tenant)
    if record is None:
        raise not_found(response_id)
    if record.response.get("status") in OPEN:  # its end would write it again
        raise InvalidRequest(f"Response '{response_id}' is still in progress.",
                             param="response_id")
    await records.delete(response_id, tenant)
    streams = services_of(request.app).streams
    await streams.journal.drop(response_id)  # nor can its stream be replayed any more
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel", response_model=None)
async def cancel(response_id: str, request: Request) -> Response:
    """Cancel a background response (queued: at once; running: its worker stops it and
    stores it as `cancelled`). Cancelling a cancelled one again returns it (OpenAI:
    idempotent); a finished or a foreground one is a 400."""
    tenant, records = tenant_of(request), _records(request)
    jobs = services_of(request.app).jobs
    job = await jobs.get(response_id, tenant)
    response = bg.view(job, None if (r := await records.get(response_id, tenant)) is None
                       else r.response)
    if response is None:
        raise not_found(response_id)
    if job is None or job.kind != "response":
        raise InvalidRequest("Only responses created with background=true can be cancelled.",
                             param="response_id")
    if response["status"] == "cancelled":
        return _json(response)
    if response["status"] not in OPEN:
        raise InvalidRequest(f"Cannot cancel a response with status '{response['status']}'.",
                             param="response_id")
    job = await jobs.cancel(response_id, tenant)
    if job is not None and job.status == "cancelled" and job.result is None:
        # cancelled while queued: no worker will write its end
        response = bg.view(job, response) or response
        if r is not None:
            await records.put(ResponseRecord(tenant, response, r.input, r.context))
        return _json(response)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:  # the worker sees the flag on its next heartbeat
        job = await jobs.get(response_id, tenant)
        if job is None or job.final:
            break
        await asyncio.sleep(0.05)
    return _json(await _current(request, response_id, tenant, records) or response)


def _json(response: dict[str, Any]) -> Response:
    return Response(orjson.dumps(response), media_type="application/json")


@router.get("/v1/responses/{response_id}/input_items", response_model=None)
async def input_items(response_id: str, request: Request) -> dict[str, Any]:
    query = request.query_params
    record = await _records(request).get(response_id, tenant_of(request))
    if record is None:
        raise not_found(response_id)
    return page(record.input, query.get("limit", "20"), query.get("order", "desc"),
                query.get("after"), "this response")


def page(items: list[dict[str, Any]], limit_raw: str, order: str, after: str | None,
         where: str) -> dict[str, Any]:
    """One page of a list of items, as OpenAI pages them: `limit` (1-100), `order` (asc or
    desc), after the item whose id is `after`."""
    if not limit_raw.isdigit() or not 1 <= int(limit_raw) <= 100:
        raise InvalidRequest("limit must be between 1 and 100.", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be asc or desc.", param="order")
    items = list(items) if order == "asc" else list(reversed(items))
    if after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if at is None:
            raise InvalidRequest(f"No item '{after}' in {where}.", param="after")
        items = items[at + 1:]
    limit = int(limit_raw)
    data = items[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}
