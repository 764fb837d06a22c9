"""`truncation` of the Responses API. `disabled` (the default): a chain that no longer
fits the model's context is the backend's 400 `context_length_exceeded`. `auto`: the
oldest items are dropped until it fits, as OpenAI defines it; system and developer
messages stay (instructions are not items: they always stay), and a cut never leaves a
`function_call_output` whose `function_call` was dropped (an engine refuses a tool
result without its call).

Whether a chain fits is the backend's own count (its tokenizer, or the remote engine's
answer), not an estimate: the whole chain is asked first (the usual case costs nothing
more), then each shorter one, oldest item first. A refusal comes before any prefill (the
embedded engine counts the prompt's tokens; a remote one answers 400 at once), so the
first chain that fits is the only one that generates."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from redline.errors import ContextLengthExceeded
from redline.pipeline import Completion, Pipeline
from redline.types import GenerationRequest

Items = list[dict[str, Any]]


def _kept(item: dict[str, Any]) -> bool:
    return item.get("type") == "message" and item.get("role") in ("system", "developer")


def cuts(chain: Items) -> Iterator[Items]:
    """The chain without its 1, 2, ... oldest droppable items; the newest item is never
    dropped (nothing would be left to answer)."""
    droppable = [i for i, item in enumerate(chain) if not _kept(item)]
    dropped: set[int] = set()
    calls: set[str] = set()  # call_ids of dropped function calls
    for i in droppable[:-1]:
        dropped.add(i)
        if chain[i]["type"] == "function_call":
            calls.add(chain[i]["call_id"])
        rest = [item for j, item in enumerate(chain) if j not in dropped]
        if any(item["type"] == "function_call_output" and item["call_id"] in calls
               for item in rest):
            continue  # its output goes with it (the next cut)
        yield rest


async def complete(pipeline: Pipeline, first: GenerationRequest, truncation: str | None,
                   chain: Items, build: Callable[[Items], GenerationRequest]) -> Completion:
    """The completion of `first` (the whole `chain`); with truncation `auto`, of the
    longest newest part of the chain that fits (`build` makes its request)."""
    try:
        return await pipeline.complete(first)
    except ContextLengthExceeded as exc:
        if truncation != "auto":
            raise
        refused = exc
    for shorter in cuts(chain):
        try:
            return await pipeline.complete(build(shorter))
        except ContextLengthExceeded as exc:
            refused = exc
    raise refused  # even the newest items alone do not fit: the backend's own answer
