"""`kv_layout: per_slot` on the real bundled SmolLM2: one KV stream per slot, where
llama.cpp wants each forward pass's sequences in id order and copies only whole
sequences between streams (engine/llama.py hides both)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from redline.config import ModelConfig
from redline.engine.engine import Engine
from redline.engine.llama import BatchEntry, LlamaModel, LlamaRunner
from redline.engine.scheduler import common_prefix
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


def last_logits(runner, seq_id, tokens, start):
    entries = [BatchEntry(t, start + i, seq_id, i == len(tokens) - 1) for i, t in enumerate(tokens)]
    runner.decode(entries)
    return runner.logits(len(entries) - 1).copy()


def test_a_batch_in_any_order_gives_each_entry_its_own_logits(model):
    """The scheduler lays a step out decode tokens first, then prompt chunks, in slot
    order of admission: per slot, the runner sorts it by sequence and `logits(i)` still
    answers for the scheduler's entry i."""
    runner = LlamaRunner(model, 512, 4, 512, 2, kv_unified=False)
    try:
        prompts = [chat(model, q) for q in QUESTIONS[:3]]
        seqs = [2, 0, 3]  # not in id order, and slot 1 empty
        entries, last = [], []
        for sid, p in zip(seqs, prompts, strict=True):
            entries += [BatchEntry(t, i, sid, i == len(p) - 1) for i, t in enumerate(p)]
            last.append(len(entries) - 1)
        runner.decode(entries)
        together = [runner.logits(i).copy() for i in last]
        alone = []
        for p in prompts:
            runner.seq_remove(1, -1, -1)
            alone.append(last_logits(runner, 1, p, 0))
        for a, b in zip(alone, together, strict=True):
            assert np.abs(a - b).max() < 1.5
            assert int(a.argmax()) == int(b.argmax())
        assert np.abs(alone[0] - together[1]).max() > 1.5  # another question is far off
    finally:
        runner.close()


def test_a_prefix_copied_from_another_slot_matches_a_full_prefill(model):
    runner = LlamaRunner(model, 1024, 4, 256, 2, kv_unified=False)
    try:
        p1 = chat(model, "What is the capital of France?", SYSTEM)
        p2 = chat(model, "What is the capital of Italy?", SYSTEM)
        n = common_prefix(p1, p2)
        assert n > 150
        full = last_logits(runner, 0, p2, 0)
        last_logits(runner, 1, p1, 0)
        runner.seq_copy(1, 2, 0, n)  # a whole-stream copy, then the rest dropped
        copied = last_logits(runner, 2, p2[n:], n)
        state, size = runner.seq_state(1)  # the host cache's save and restore
        assert size > 0 and runner.set_seq_state(3, state, size) and runner.seq_remove(3, n, -1)
        restored = last_logits(runner, 3, p2[n:], n)
        for got in (copied, restored):
            assert np.abs(got - full).max() < 1.5
            assert int(got.argmax()) == int(full.argmax())
        runner.seq_remove(2, -1, -1)
        runner.seq_copy(1, 2, 0, n - 5)  # negative control: the suffix at shifted positions
        wrong = last_logits(runner, 2, p2[n:], n - 5)
        assert np.abs(wrong - full).max() > 1.5
    finally:
        runner.close()


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
