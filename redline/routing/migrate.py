"""Streams that migrate: when the engine replica serving a stream dies after some tokens
(its connection reset, an error chunk, an engine that stopped), the rest of the answer
is asked of another healthy replica of the same model, as a continuation of the text
the client already has (backends/continuation.py). The client's stream goes on: the
chunks from the new replica follow the old one's with no gap in the event numbering and
no repeated or missing text, so the journal, which holds what the client was sent,
resumes byte for byte as before.

    router's tail ─ chunk ─► Migration.seen (the text so far)
                 ─ failure ─► Migration.move: the dead replica's breaker learns of it;
                   continuation(request, text) opened on each other usable replica
                   in placement order until one gives its first chunk ─► the tail
                   goes on from that call (None: the stream ends with an error event
                   saying why it could not move)

A stream does not move when its model has one replica, when the model's engines cannot
continue a partial answer (`placement.migrate`), or when what it streamed cannot be
resent as a prefix (tool-call fragments, reasoning, several choices, a response format
whose grammar starts at the answer's start).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from redline.backends.base import Backend
from redline.backends.continuation import continuation, why_not
from redline.backends.pool import PoolBackend
from redline.errors import InvalidRequest, RedlineError
from redline.types import Chunk, GenerationRequest, Usage

if TYPE_CHECKING:  # the router builds one per stream; only its types are needed here
    from redline.routing.router import Router, _Call

log = logging.getLogger(__name__)


class Migration:
    """One stream's way to another replica: what it streamed so far, and where it has
    been (each replica is tried at most once per stream)."""

    __slots__ = ("router", "model", "request", "why", "text", "tokens", "tried", "moves",
                 "before")

    def __init__(self, router: Router, model: str, request: GenerationRequest,
                 replica: Backend) -> None:
        self.router, self.model, self.request = router, model, request
        backend = router.backends.get(model)
        self.why: str | None = (why_not(request, backend.migrate)
                                if isinstance(backend, PoolBackend)
                                else "its model has no other replica")
        self.text: list[str] = []
        self.tokens = 0
        self.tried: list[Backend] = [replica]
        self.moves = 0
        self.before = 0  # tokens streamed before the last move (the new prompt holds them)

    def seen(self, chunk: Chunk) -> None:
        """A chunk on its way to the client (in order, the first one included)."""
        if chunk.usage is not None and self.moves:
            chunk.usage = self._usage(chunk.usage)
        self.tokens += chunk.tokens
        if self.why is not None:
            return
        if chunk.tool_calls or chunk.reasoning or chunk.extra or chunk.index:
            self.why = "it has streamed what cannot be resent as a prefix (tool calls, reasoning)"
            self.text.clear()
            return
        if chunk.text:
            self.text.append(chunk.text)

    def _usage(self, u: Usage) -> Usage:
        """A continuation's usage counts the text resent in its prompt: give it back to
        the completion, as the uninterrupted stream would have counted it."""
        return Usage(max(0, u.prompt_tokens - self.before), u.completion_tokens + self.before,
                     u.cached_tokens, u.prompt_details, u.completion_details)

    async def move(self, failed: _Call, error: str) -> _Call | None:
        """The replica of `failed` broke the stream (`error`): open the rest on another
        one. Returns that call (its first chunk continues the answer), or None, with
        `why` saying why the stream could not move."""
        router = self.router
        label = router.label(failed.replica)
        router.breakers.failed(label)
        if self.why is not None:
            return None
        if self.complete():  # it died with nothing left to add
            return None
        backend = router.backends[self.model]
        assert isinstance(backend, PoolBackend)  # else `why` is set
        text = "".join(self.text)
        cont = continuation(self.request, text, self.tokens, backend.migrate)
        for replica in backend.rank(cont, router.usable, exclude=self.tried):
            self.tried.append(replica)
            backend.record(replica, cont)
            try:
                opened = await router._open(replica, cont)
            except InvalidRequest as exc:  # the engine does not take continuations
                self.why = f"{router.label(replica)} refused the continuation: {exc.message}"
                return None
            except RedlineError as exc:  # down too: the next one
                log.info("stream of %s: %s could not continue it: %s", self.request.id,
                         router.label(replica), exc.message)
                continue
            self.moves += 1
            self.before = self.tokens
            log.info("stream of %s moved from %s to %s after %d tokens (%s)", self.request.id,
                     label, router.label(replica), self.tokens, error)
            return opened.value
        self.why = f"no other healthy replica of {self.model!r} could continue it"
        return None

    def complete(self) -> bool:
        """The stream had every token it asked for when its replica died."""
        return self.why is None and self.tokens >= self.request.sampling.max_tokens

    def failure(self, error: str) -> str:
        """The error event's message for a stream that could not move."""
        return (f"the engine replica serving this stream failed after {self.tokens} tokens "
                f"({error}) and the stream could not continue elsewhere: {self.why}")
