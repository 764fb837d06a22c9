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
