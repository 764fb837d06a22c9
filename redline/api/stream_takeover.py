"""A stream whose gateway replica died, continued by the gateway a resume reaches
(`streams.journal_live`; what is kept and why in streams/takeover.py).

    POST (gateway A) ─► the stream's request kept in the store, its events journalled
                        as they go, A marked alive while it produces
    A dies ─► GET /v1/streams/{id} (gateway B) ─► take_over: the journal's meta names A,
              A is not alive, B claims the stream (one claimant) ─► the answer's text
              from the journalled events ─► a continuation on an engine replica
              (backends/continuation.py) ─► events numbered on from the journal's last,
              produced by B as its own stream (streams.adopt) ─► the resume follows it

A stream that cannot be continued (tool calls or reasoning streamed, several choices, an
engine that cannot continue a partial answer, no replica up) gets an error event saying
why, then [DONE], instead of a resume that waits for a producer that is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from redline.api import sse
from redline.api.chunks import ChunkEncoder
from redline.api.schemas import ChatCompletionRequest, CompletionRequest
from redline.backends.continuation import Mode, continuation, why_not
from redline.backends.pool import PoolBackend
from redline.closing import aclose
from redline.errors import RedlineError
from redline.pipeline import Prepared
from redline.store.base import StoreUnavailable
from redline.streams.journal import Journal, is_done
from redline.streams.takeover import ALIVE_TTL_S, Handed, Handover, answered
from redline.types import GenerationRequest, Usage

if TYPE_CHECKING:
    from redline.api.services import Services


async def kept(services: Services, stream_id: str, handed: Handed,
               events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`events`, after keeping the stream's request for a takeover: the store write is
    the producer's, off the way of the first token (already written by then)."""
    await services.streams.handover.keep(stream_id, handed)
    try:
        async for event in events:
            yield event
    finally:
        await aclose(events)


def handed(body: ChatCompletionRequest | CompletionRequest, gen: GenerationRequest,
           kind: str, model: str) -> Handed:
    return Handed(kind, body.model_dump(mode="json", exclude_unset=True, by_alias=True),
                  gen.tenant, gen.id, model, gen.tier, gen.session)


async def take_over(services: Services, stream_id: str, tenant: str) -> None:
    """Before a resume: when `stream_id`'s gateway died, continue the stream here (the
    resume then follows it as a stream of this replica). Anything else: nothing."""
    streams = services.streams
    if not streams.cfg.journal_live or stream_id in streams.live:
        return
    journal = streams.journal
    try:
        meta = await journal.meta(stream_id)
        if meta is None or meta.events is not None or meta.tenant != tenant \
                or meta.owner == streams.owner:
            return
        handover = streams.handover
        if not await _gone(streams.journal, handover, meta.owner, stream_id):
            return
        was = await handover.handed(stream_id)
        if was is None or not await handover.claim(stream_id):
            return
        journaled = await journal.read(stream_id, 0)
    except StoreUnavailable:
        return  # the resume follows the journal as it can
    streams.adopt(stream_id, journaled,
                  _continue(services, stream_id, was, journaled), tenant)


async def _gone(journal: Journal, handover: Handover, owner: str, stream_id: str) -> bool:
    """Is the stream's producer gone? Its mark outlives it by up to ALIVE_TTL_S: while it
    is there, watch the journal (a live producer writes it every `journal_flush_s`, so it
    grows unless the engine is between tokens) until it grows (alive: False) or the
    mark lapses (dead: True)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ALIVE_TTL_S + 0.5
    _, size = await journal.tail(stream_id, 0)
    while await handover.alive(owner):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)
        meta = await journal.meta(stream_id)
        _, now = await journal.tail(stream_id, size)
        if now > size or meta is None or meta.events is not None:
            return False
    return True


def _mode(services: Services, model: str) -> Mode:
    backend = services.pipeline.backends.get(model)
    if isinstance(backend, PoolBackend):
        return backend.migrate
    cfg = next((m for m in services.config.models if m.name == model), None)
    if cfg is None or cfg.placement.migrate == "auto":
        return "continue_final_message"
    return cfg.placement.migrate


async def _continue(services: Services, stream_id: str, was: Handed,
                    journaled: list[bytes]) -> AsyncIterator[bytes]:
    seq = len(journaled)

    def ev(data: dict[str, Any] | str) -> bytes:
        nonlocal seq
        seq += 1
        return sse.event(stream_id, seq, data)

    def error(message: str) -> bytes:
        return ev({"error": {"message": message, "type": "server_error", "param": None,
                             "code": None}})

    if journaled and is_done(journaled[-1]):
        return
    why = "the gateway replica producing this stream died, and the stream could not continue: "
    got = answered(journaled)
    if got is None:
        yield error(why + "it streamed what cannot be resent as a prefix (tool calls, "
                    "reasoning, several choices) or had failed")
        yield ev(sse.DONE)
        return
    text, tokens, ended = got
    body = (ChatCompletionRequest if was.kind == "chat" else CompletionRequest).model_validate(
        was.body)
    legacy = isinstance(body, ChatCompletionRequest) and body.legacy_functions
    encoder = ChunkEncoder("chat" if was.kind == "chat" else "text", was.gen_id, was.model,
                           body.include_usage, legacy=legacy)
    if ended:  # its finish was journalled; the usage and [DONE] were not
        yield ev(sse.DONE)
        return
    try:
        gen = body.to_generation(was.tier, was.tenant, no_cache=True)
        gen.model, gen.session = was.model, was.session
        mode = _mode(services, was.model)
        reason = why_not(gen, mode)
        if reason is not None:
            raise RedlineError(reason)
        cont = continuation(gen, text, tokens, mode)
        cont.use_cache = False
        pipeline = services.pipeline
        completion = await pipeline.open(Prepared(cont, None, None, pipeline.router.plan(cont)))
    except RedlineError as exc:
        yield error(why + exc.message)
        yield ev(sse.DONE)
        return
    try:
        async for chunk in completion.chunks:
            if chunk.finish_reason == "error":
                yield error(chunk.error or "generation failed")
                break
            if chunk.has_delta:
                yield ev(encoder.text(chunk.text, None) if not chunk.logprobs
                         else encoder.delta(chunk, None))
            if chunk.finish_reason is not None:
                yield ev(encoder.finish(chunk.index, chunk.finish_reason, None))
        u = completion.usage
        if encoder.include_usage and u is not None:  # the resent text is the completion's
            yield ev(encoder.usage(Usage(max(0, u.prompt_tokens - tokens),
                                         u.completion_tokens + tokens, u.cached_tokens,
                                         u.prompt_details, u.completion_details)))
    except Exception as exc:  # after streaming began: an error event, then DONE
        yield error(f"generation failed: {type(exc).__name__}")
    finally:
        await aclose(completion.chunks)
    yield ev(sse.DONE)
