"""One response being produced: its output items as the chunks come, how it ended, its
stream events and its stored record. The POST route runs it in the foreground; the
jobs' worker runs a background one (api/responses_background.py), the same way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from typing import Any

from redline.api import responses_request as rq
from redline.api.responses_output import DONE, Output, outcome, response_json
from redline.closing import aclose
from redline.errors import InvalidRequest, NotFound
from redline.pipeline import Completion
from redline.responses import Conversations, ResponseRecord, ResponseRecords
from redline.streams import Progress
from redline.types import FinishReason

OPEN = ("queued", "in_progress")
# chat's field names in capability errors, as the Responses API names them
_PARAMS = {"messages": "input", "response_format": "text.format",
           "reasoning_effort": "reasoning.effort", "verbosity": "text.verbosity"}
FINAL = {"completed": "response.completed", "incomplete": "response.incomplete",
         "failed": "response.failed", "cancelled": "response.failed"}


def not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param=param)


def conversations_of(records: ResponseRecords) -> Conversations:
    """The conversations kept beside the responses (same store, same TTL)."""
    return Conversations(records.store, records.ttl_s)


def conversation_not_found(conversation_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.", param=param)


async def context_of(records: ResponseRecords, body: rq.ResponsesRequest,
                     tenant: str) -> list[dict[str, Any]]:
    """The conversation that `previous_response_id` continues (its items and output), or
    the items of the `conversation` it names, or none: a 404 for a response or a
    conversation that is not the tenant's, a 400 for a response still running."""
    conversation_id = rq.conversation_of(body)
    if conversation_id is not None:
        conversations = conversations_of(records)
        conversation = await conversations.get(conversation_id, tenant)
        if conversation is None:
            raise conversation_not_found(conversation_id, "conversation")
        return await conversations.items(conversation)
    if body.previous_response_id is None:
        return []
    previous = await records.get(body.previous_response_id, tenant)
    if previous is None:
        raise not_found(body.previous_response_id, "previous_response_id")
    if previous.response.get("status") in OPEN:
        raise InvalidRequest(f"Response '{previous.id}' is still in progress.",
                             param="previous_response_id")
    return previous.chain()


async def extend_conversation(records: ResponseRecords, body: rq.ResponsesRequest,
                              tenant: str, status: str, items: list[dict[str, Any]],
                              output: list[dict[str, Any]]) -> None:
    """A response that ran (completed, or incomplete at its token limit) adds its input
    and output items to its conversation, as OpenAI's does; a failed or cancelled one
    adds nothing. `store: false` does not keep them out: the conversation is the state
    the client asked for. A conversation deleted meanwhile stays deleted."""
    conversation_id = rq.conversation_of(body)
    if conversation_id is not None and status in ("completed", "incomplete"):
        await conversations_of(records).append(conversation_id, tenant, [*items, *output])


@contextmanager
def fields_named() -> Iterator[None]:
    """An InvalidRequest inside names its field as this API does (input, text.format)."""
    try:
        yield
    except InvalidRequest as exc:
        exc.param = _PARAMS.get(exc.param or "", exc.param)
        raise


class Run:
    """One response being produced: its output, how it ended, and its record.
    `created_at`: a background response keeps the time it was accepted; `first`: the
    status its `response.created` event shows (a background one was `queued` then)."""

    def __init__(self, body: rq.ResponsesRequest, response_id: str, completion: Completion,
                 records: ResponseRecords, items: list[dict[str, Any]],
                 context: list[dict[str, Any]], created_at: int | None = None,
                 first: str = "in_progress") -> None:
        self.body, self.id, self.completion = body, response_id, completion
        self.records, self.items, self.context = records, items, context
        self.output = Output(rq.namespaced(body))
        if created_at is not None:
            self.output.created_at = created_at
        self.first = first
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.primed = False  # the events of the first output delta have been yielded
        self.stopping = False  # a cancel of a background response: end it as cancelled
        self.answer: dict[str, Any] | None = None  # the final Response, once stored
        self._in_progress: asyncio.Task[None] | None = None

    def note(self, finish: FinishReason | None, error: str | None) -> None:
        if finish is not None:
            self.finish_reason, self.error = finish, error

    def snapshot(self, status: str) -> dict[str, Any]:
        return response_json(self.body, self.id, self.output.created_at, self.completion.model,
                             status, [])

    async def finish(self) -> dict[str, Any]:
        """The whole Response, stored (when asked) before anyone sees it; its input and
        output items added to its conversation, if it has one, before that too."""
        status, error, incomplete = outcome(self.finish_reason or "stop", self.error)
        answer = response_json(self.body, self.id, self.output.created_at,
                               self.completion.model, status, self.output.items,
                               self.completion.usage, error, incomplete)
        await extend_conversation(self.records, self.body, self.completion.request.tenant,
                                  status, self.items, self.output.items)
        if self.body.store:
            if self._in_progress is not None:  # never written over the final record
                await asyncio.gather(self._in_progress, return_exceptions=True)
            await self.records.put(ResponseRecord(self.completion.request.tenant, answer,
                                                  self.items, self.context))
        self.answer = answer
        return answer

    async def whole(self) -> dict[str, Any]:
        """The Response not streamed: the chunks to the end, then `finish`."""
        async for chunk in self.completion.chunks:
            self.output.add(chunk)
            self.note(chunk.finish_reason, chunk.error)
        self.output.close()
        return await self.finish()

    async def events(self, progress: Progress | None) -> AsyncGenerator[bytes, None]:
        out, c = self.output, self.completion
        yield out.event("response.created", {"response": self.snapshot(self.first)})
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
        except asyncio.CancelledError:
            if not self.stopping:  # abandoned or shutting down: no end to write
                raise
            # cancelled by its owner (POST .../cancel): it ends here, as `cancelled`
            self.note("cancelled", None)
        except Exception as exc:  # after the stream began: it ends as response.failed
            self.note("error", f"generation failed: {type(exc).__name__}")
        finally:
            await aclose(c.chunks)
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
        yield out.event(FINAL[answer["status"]], {"response": answer, "redline": redline})
        yield DONE
