"""`kv_layout: per_slot` on the real bundled SmolLM2: one KV stream per slot, where
llama.cpp wants each forward pass's sequences in id order and copies only whole
sequences between streams (engine/llama.py hides both; the runner's own checks are
tests/test_engine_model.py's, for both layouts)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from redline.config import ModelConfig
from redline.engine.engine import Engine
from redline.engine.llama import LlamaModel
from redline.models import bundled_path
from redline.types import Message, SamplingParams

pytestmark = pytest.mark.slow

SYSTEM = ("You are a support assistant for Acme Cloud. Be brief, be precise, cite the policy "
          "section, and never invent prices. ") * 8
QUESTIONS = ["What is the capital of France?", "Name three colours.", "What is 2 + 2?",
             "Say hello in Spanish.", "What is water made of?", "Who wrote Hamlet?"]


@pytest.fixture(scope="module")
def model():
    m = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))), "builtin")
    yield m
    m.close()


def chat(model, question, system=None):
    msgs = ((Message("system", system),) if system else ()) + (Message("user", question),)
    return model.tokenize(model.render_chat(msgs), add_special=False)


async def test_the_engine_per_slot_answers_as_the_unified_one_and_reuses_prefixes(model):
    first = SamplingParams(max_tokens=4, temperature=0.0)
    args = dict(n_ctx_per_seq=1024, n_seq_max=8, n_batch=256, n_threads=2)
    plain = Engine(model, prefix_reuse=False, **args)
    slots = Engine(model, kv_unified=False, **args)
    reused: list[int] = []
    orig = slots.scheduler._place

    def spy(seq, kv):
        orig(seq, kv)
        reused.append(seq.reused)

    slots.scheduler._place = spy

    async def ask(engine, tokens):
        return "".join([c.text async for c in engine.generate(tokens, first)])

    try:
        assert not slots.runner.unified
        system_len = len(model.tokenize(SYSTEM, add_special=False))
        for q in ("What is the capital of France?", "What is the capital of Italy?",
                  "What is the capital of Japan?"):
            tokens = chat(model, q, SYSTEM)
            assert await ask(slots, tokens) == await ask(plain, tokens)
        assert reused[0] == 0 and all(r >= system_len for r in reused[1:])
        # at once: prefixes copied between slots, steps mixing several slots
        reused.clear()
        outs = await asyncio.gather(*(ask(slots, chat(model, q, SYSTEM)) for q in QUESTIONS))
        assert all(r >= system_len for r in reused)
        assert len(set(outs)) > 3
    finally:
        plain.close()
        slots.close()


def test_the_layout_is_a_model_setting():
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct").kv_layout == "unified"
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct", kv_layout="per_slot").kv_layout \
        == "per_slot"
    with pytest.raises(ValueError):
        ModelConfig(name="m", bundled="smollm2-135m-instruct", kv_layout="paged")


async def test_the_model_setting_reaches_the_engine_and_it_serves():
    from redline.backends.local import LocalBackend
    from redline.types import GenerationRequest

    backend = LocalBackend(ModelConfig(name="smol", bundled="smollm2-135m-instruct", n_threads=2,
                                       n_seq_max=2, n_ctx=1024, kv_layout="per_slot"),
                           Path(".redline/models"))
    await backend.start()  # warm-up runs on the per-slot context too
    try:
        assert backend.engine is not None and not backend.engine.runner.unified
        req = GenerationRequest(model="smol", messages=(Message("user", "Name three colours."),),
                                sampling=SamplingParams(max_tokens=8, temperature=0.0))
        text = "".join([c.text async for c in backend.stream(req)])
        assert text.strip()
    finally:
        await backend.close()
