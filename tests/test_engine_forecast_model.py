"""The engine's TTFT forecast on the bundled SmolLM2: ready after warm-up, and it sees the
knee a fit over "requests in flight" misses: a free slot starts a newcomer at once, full
slots make it wait for the soonest answer to end."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from redline.backends.local import LocalBackend
from redline.config import ModelConfig
from redline.types import GenerationRequest, Message, SamplingParams

pytestmark = pytest.mark.slow


async def test_forecast_after_warmup_and_when_the_slots_fill() -> None:
    smol = LocalBackend(ModelConfig(name="smol", bundled="smollm2-135m-instruct", n_threads=2,
                                    n_seq_max=2, n_ctx=1024), Path(".redline/models"))
    await smol.start()  # warm-up on: it measures the step costs
    try:
        idle = smol.predict_ttft_s(40, "A")
        assert idle is not None and idle > 0  # no traffic yet, a forecast already
        assert smol.predict_tpot_s() is not None

        written = [0]

        async def long_answer(count: bool) -> None:
            req = GenerationRequest(model="smol", messages=(Message("user", "Tell a story."),),
                                    sampling=SamplingParams(max_tokens=200, temperature=0.0,
                                                            ignore_eos=True))
            async for _ in smol.stream(req):
                if count:
                    written[0] += 1

        first = asyncio.create_task(long_answer(True))
        while written[0] < 1:
            await asyncio.sleep(0.005)
        one_slot_left = smol.predict_ttft_s(40, "A")
        second = asyncio.create_task(long_answer(False))
        while smol.load() < 2:
            await asyncio.sleep(0.005)
        # forecast at once: the first answer has written only a few of its tokens, so
        # the soonest a slot frees is dozens of steps away (however slow the machine is)
        full = smol.predict_ttft_s(40, "A")
        early = written[0]
        assert one_slot_left is not None and full is not None
        tpot = smol.predict_tpot_s()
        assert tpot is not None
        # full: it waits for one of 200-token answers (expected ~64 tokens: the prior
        # average of an answer), dozens of decode steps; a free slot waits for none
        assert early < 30, early
        assert full > one_slot_left + 10 * tpot
        first.cancel()
        second.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
    finally:
        await smol.close()


async def test_a_cached_system_prompt_is_not_forecast_as_computed_again() -> None:
    """A long system prompt that many users share stays in the engine's cells: the next
    user's question is forecast as its own few tokens, not the whole prompt (a forecast of
    the whole made the planner shorten tier-S answers that had seconds to spare)."""
    smol = LocalBackend(ModelConfig(name="smol", bundled="smollm2-135m-instruct", n_threads=2,
                                    n_seq_max=2, n_ctx=1024), Path(".redline/models"))
    await smol.start()
    try:
        await smol.calibrate()  # measured again, alone: the forecasts stay ready
        system = " ".join(f"Rule {i}: answer the customer politely about order {i}."
                          for i in range(30))

        def ask(question: str) -> GenerationRequest:
            return GenerationRequest(model="smol", messages=(Message("system", system),
                                                             Message("user", question)),
                                     sampling=SamplingParams(max_tokens=2, temperature=0.0))

        first = ask("Where is my parcel?")
        n_prompt = len(smol.prompt_tokens(first))
        assert n_prompt > 300
        cold = smol.predict_ttft_s(n_prompt, "S", first)
        async for _ in smol.stream(first):
            pass
        second = ask("Can I change the delivery address?")
        warm = smol.predict_ttft_s(n_prompt, "S", second)
        by_count = smol.predict_ttft_s(n_prompt, "S")  # no request: the count is all it has
        assert cold is not None and warm is not None and by_count is not None
        assert warm < cold / 3, (warm, cold)
        assert warm < by_count / 3, (warm, by_count)
    finally:
        await smol.close()
