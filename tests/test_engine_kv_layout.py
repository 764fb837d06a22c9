"""`kv_layout`: a model setting that reaches the engine (`per_slot` by default: one KV stream per
slot). The runner's and the engine's own checks run for both layouts in
tests/test_engine_model.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from redline.backends.local import LocalBackend
from redline.config import ModelConfig
from redline.engine.llama import (
    BatchEntry,
    LlamaModel,
    LlamaRunner,
    forward_passes,
    pads,
)
from redline.models import bundled_path
from redline.types import GenerationRequest, Message, SamplingParams


def test_the_layout_is_a_model_setting():
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct").kv_layout == "per_slot"
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct", kv_layout="unified").kv_layout \
        == "unified"
    with pytest.raises(ValueError):
        ModelConfig(name="m", bundled="smollm2-135m-instruct", kv_layout="paged")


@pytest.mark.slow
async def test_the_model_settings_reach_the_engine_and_it_serves():
    backend = LocalBackend(ModelConfig(name="smol", bundled="smollm2-135m-instruct", n_threads=2,
                                       n_seq_max=2, n_ctx=1024, kv_layout="per_slot",
                                       prefill_protect_share=1.0,
                                       prefill_yield_to_waiting=False),
                           Path(".redline/models"))
    await backend.start()  # warm-up runs on the per-slot context too
    try:
        assert backend.engine is not None and not backend.engine.runner.unified
        assert backend.engine.scheduler.contiguous  # newcomers placed beside running slots
        # and the share of slots a long prompt is held back for: both of them
        assert backend.engine.scheduler.budget.protect == 2
        assert not backend.engine.scheduler.budget.yield_to_waiting  # held back, however many
        # and long prompts held back for them run on the side, on 1 of the 2 threads
        assert backend.engine.side is not None and backend.engine.side.threads == 1
        req = GenerationRequest(model="smol", messages=(Message("user", "Name three colours."),),
                                sampling=SamplingParams(max_tokens=8, temperature=0.0))
        text = "".join([c.text async for c in backend.stream(req)])
        assert text.strip()
    finally:
        await backend.close()


def test_forward_passes_follow_llama_cpps_split_of_a_per_slot_batch():
    assert forward_passes({0: 1, 1: 1, 2: 1, 3: 1}, 512) == 1  # one run
    assert forward_passes({0: 1, 2: 1, 4: 1, 6: 1}, 512) == 4  # four runs
    # decode tokens and a prompt: one token of each, then the rest of the prompt
    assert forward_passes({0: 1, 1: 1, 2: 100}, 512) == 2
    # prompts of different lengths: as many tokens of each as the shortest has, and so on
    assert forward_passes({0: 30, 1: 40, 2: 50}, 512) == 3
    assert forward_passes({0: 40, 1: 40}, 512) == 1
    assert forward_passes({0: 400, 1: 400}, 512) == 2  # at most n_ubatch tokens a pass
    assert forward_passes({}, 512) == 0


def test_pads_join_runs_only_where_that_saves_passes():
    assert pads({0: 1, 2: 1, 4: 1, 6: 1}, 512, 512) == {1: 1, 3: 1, 5: 1}
    assert pads({0: 1, 1: 1, 2: 1}, 512, 512) == {}  # one run already
    # a decode and a prompt take two passes either way: no pad
    assert pads({0: 1, 2: 100}, 512, 512) == {}
    # two decode runs and a prompt: the pad joins the runs (3 passes -> 2)
    assert pads({0: 1, 2: 1, 3: 100}, 512, 512) == {1: 1}
    # six throwaway tokens to save one pass cost more than the pass
    assert pads({0: 1, 7: 1}, 512, 512) == {}
    assert pads({0: 1, 2: 1, 4: 1, 6: 1}, 512, 2) == {1: 1, 3: 1}  # within the batch's room


def test_pads_bring_prompts_of_nearly_one_length_into_fewer_passes():
    burst = dict(enumerate([43, 44, 43, 45, 43, 44, 43, 43]))  # four passes as they are
    assert forward_passes(burst, 512) == 4
    added = pads(burst, 512, 512)
    assert added == {0: 1, 2: 1, 4: 1, 6: 1, 7: 1}  # five tokens save two passes
    assert forward_passes({s: n + added.get(s, 0) for s, n in burst.items()}, 512) == 2
    assert pads({0: 40, 1: 41}, 512, 512) == {0: 1}
    # lengths far apart: padding 50 tokens to save one pass is not worth it
    assert pads({0: 10, 1: 60}, 512, 512) == {}
    # decoding streams beside two prompts: the prompts level up, the decodes stay
    assert pads({0: 1, 1: 1, 2: 40, 3: 41}, 512, 512) == {2: 1}
    assert pads(burst, 512, 4) == {}  # the five do not fit in the room


@pytest.mark.slow
def test_per_slot_pads_leave_no_cell_and_change_no_answer():
    """Decoding slots 0, 2, 4 and 6 per slot: the runner puts a throwaway token in 1, 3
    and 5 (one pass instead of four). Each decode's logits are those of its sequence
    alone, and the padded sequences' cached prompts are as they were: nothing holds a
    pad's cell, and their next token's logits are those they had before."""
    model = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))),
                       "builtin")
    runner = LlamaRunner(model, 256, 8, 256, 2, kv_unified=False)
    try:
        prompts = {s: model.tokenize(model.render_chat((Message("user", q),)), add_special=False)
                   for s, q in enumerate(["What is the capital of France?", "Name three colours.",
                                          "What is 2 + 2?", "Say hello in Spanish.",
                                          "What is water made of?", "Who wrote Hamlet?",
                                          "How far is the moon?"])}
        last = {}
        for s, p in prompts.items():  # each alone, its last token's logits kept
            runner.decode([BatchEntry(t, i, s, i == len(p) - 1) for i, t in enumerate(p)])
            last[s] = runner.logits(len(p) - 1).copy()
        step = [BatchEntry(int(last[s].argmax()), len(prompts[s]), s, True) for s in (6, 0, 4, 2)]
        assert sorted(p.seq_id for p in runner._pads(step)) == [1, 3, 5]
        runner.decode(step)
        together = [runner.logits(i).copy() for i in range(4)]
        for s in (1, 3, 5):  # a pad's cell is gone: the stream ends where its prompt does
            assert runner.seq_pos_max(s) == len(prompts[s]) - 1
        for s, got in zip((6, 0, 4, 2), together, strict=True):  # each as if alone
            runner.seq_remove(s, len(prompts[s]), -1)
            runner.decode([BatchEntry(int(last[s].argmax()), len(prompts[s]), s, True)])
            alone = runner.logits(0).copy()
            assert np.abs(alone - got).max() < 1.5 and int(alone.argmax()) == int(got.argmax())
        for s in (1, 3, 5):  # the padded ones go on from their own prompts
            p = prompts[s]
            runner.seq_remove(s, len(p) - 1, -1)
            runner.decode([BatchEntry(p[-1], len(p) - 1, s, True)])
            assert np.abs(runner.logits(0) - last[s]).max() < 1.5
            assert int(runner.logits(0).argmax()) == int(last[s].argmax())
    finally:
        runner.close()
        model.close()


@pytest.mark.slow
def test_a_pad_for_the_last_sequence_is_fed_too():
    """Two prompts in id order, 41 and 40 tokens: the runner brings the second to 41 (one
    pass instead of two). The batch is already in order, and the pad, after it, is still
    in what llama.cpp runs; its cell is gone after."""
    model = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))),
                       "builtin")
    runner = LlamaRunner(model, 256, 2, 256, 2, kv_unified=False)
    try:
        batch = [BatchEntry(100 + i, i, 0, i == 40) for i in range(41)] \
            + [BatchEntry(200 + i, i, 1, i == 39) for i in range(40)]
        assert [(p.seq_id, p.pos) for p in runner._pads(batch)] == [(1, 40)]
        runner.decode(batch)
        assert runner._batch.n_tokens == 82
        assert runner.seq_pos_max(1) == 39 and runner.seq_pos_max(0) == 40
        assert runner.logits(40).shape == runner.logits(80).shape == (model.n_vocab,)
    finally:
        runner.close()
        model.close()
