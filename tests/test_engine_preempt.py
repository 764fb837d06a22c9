"""Preempt-and-continue on the real bundled SmolLM2: a sequence that gives its slot to a
tier-S request, and is recomputed later, produces exactly the tokens it would have."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from redline.engine.engine import Engine
from redline.engine.llama import LlamaModel
from redline.engine.sequence import Sequence
from redline.models import bundled_path
from redline.types import Chunk, Message, Presence, SamplingParams

pytestmark = pytest.mark.slow

LONG = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    m = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))))
    yield m
    m.close()


def chat(model, question):
    return model.tokenize(model.render_chat((Message("user", question),)), add_special=False)


class Run:
    """One sequence submitted to the engine; its chunks as they come."""

    def __init__(self, engine, tokens, tier, sampling=LONG, presence=None, on_chunk=None):
        loop = asyncio.get_running_loop()
        self.chunks: list[Chunk] = []
        self.done = loop.create_future()
        self.ended_at = 0.0
        self.on_chunk = on_chunk
        self.seq = Sequence(f"{tier}-{id(self):x}", tokens, sampling, self._emit, loop,
                            tier=tier, presence=presence)
        engine.submit(self.seq)

    def _emit(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        if self.on_chunk is not None:
            self.on_chunk(self)
        if chunk.finish_reason is not None and not self.done.done():
            self.ended_at = time.perf_counter()
            self.done.set_result(None)

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)


async def test_a_preempted_sequence_continues_with_exactly_its_own_tokens(model):
    engine = Engine(model, n_ctx_per_seq=512, n_seq_max=1, n_batch=256, n_threads=2)
    try:
        question = chat(model, "Write a long poem about the sea and the ships on it.")
        alone = Run(engine, question, "B")
        await asyncio.wait_for(alone.done, 120)
        assert engine.scheduler.preemptions == 0
        # again, and a tier-S request arrives while it decodes: no free slot, so B yields
        urgent: list[Run] = []

        def arrive(run: Run) -> None:
            if len(run.chunks) == 8 and not urgent:
                urgent.append(Run(engine, chat(model, "What is 2 + 2?"), "S",
                                  SamplingParams(max_tokens=8, temperature=0.0)))

        again = Run(engine, question, "B", on_chunk=arrive)
        await asyncio.wait_for(again.done, 120)
        await asyncio.wait_for(urgent[0].done, 120)
        assert engine.scheduler.preemptions == 1 and again.seq.preemptions == 1
        # S was served while B waited: its answer ended before B's did
        assert urgent[0].ended_at < again.ended_at
        assert again.seq.output == alone.seq.output  # the same token ids, none lost or doubled
        assert again.text == alone.text
        assert sum(c.tokens for c in again.chunks) == sum(c.tokens for c in alone.chunks) == 40
        assert again.chunks[-1].usage.completion_tokens == 40
    finally:
        engine.close()


async def test_an_unread_stream_yields_to_a_fresh_request_and_finishes_later(model):
    engine = Engine(model, n_ctx_per_seq=512, n_seq_max=1, n_batch=256, n_threads=2)
    try:
        question = chat(model, "Tell me a long story about a lighthouse keeper.")
        alone = Run(engine, question, "A")
        await asyncio.wait_for(alone.done, 120)
        away = Presence()
        fresh: list[Run] = []

        def leave(run: Run) -> None:
            if len(run.chunks) == 6 and not fresh:
                away.gone = True  # its client left; it generates on for a resume
                fresh.append(Run(engine, chat(model, "Name three colours."), "B",
                                 SamplingParams(max_tokens=8, temperature=0.0)))

        unread = Run(engine, question, "A", presence=away, on_chunk=leave)
        await asyncio.wait_for(unread.done, 120)
        await asyncio.wait_for(fresh[0].done, 120)
        assert unread.seq.preemptions == 1  # even a tier-B newcomer goes first
        assert fresh[0].ended_at < unread.ended_at
        assert unread.seq.output == alone.seq.output and unread.text == alone.text
    finally:
        engine.close()
