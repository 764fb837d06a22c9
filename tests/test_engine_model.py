"""The engine on the real bundled SmolLM2: batching, prefix reuse, cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from redline.engine.engine import Engine
from redline.engine.llama import BatchEntry, LlamaModel, LlamaRunner
from redline.engine.scheduler import common_prefix
from redline.models import bundled_path
from redline.types import Message, SamplingParams

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
SYSTEM = ("You are a support assistant for Acme Cloud. Be brief, be precise, cite the policy "
          "section, and never invent prices. ") * 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # prompts in llama.cpp's built-in chatml (no default system turn): llama.cpp's CPU
    # kernels are not batch-invariant, and these tests pin greedy answers of questions
    # whose answers have no near-tie under that noise; SmolLM2's own template
    # (tests/test_engine_template.py) puts two of them at a first-token tie (gap < 0.25)
    m = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))),
                   "builtin")
    yield m
    m.close()


def make_engine(model, **kw):
    args = dict(n_ctx_per_seq=1024, n_seq_max=8, n_batch=256, n_threads=2)
    args.update(kw)
    return Engine(model, **args)


def chat(model, question, system=None):
    msgs = ((Message("system", system),) if system else ()) + (Message("user", question),)
    return model.tokenize(model.render_chat(msgs), add_special=False)


async def collect(engine, tokens, sampling=GREEDY):
    chunks = [c async for c in engine.generate(tokens, sampling)]
    return "".join(c.text for c in chunks), chunks[-1]


QUESTIONS = ["What is the capital of France?", "Name three colours.", "What is 2 + 2?",
             "Say hello in Spanish.", "What is water made of?", "Who wrote Hamlet?"]


async def test_identical_prompts_in_one_batch_give_identical_answers(model):
    engine = make_engine(model, prefix_reuse=False)
    try:
        tokens = chat(model, QUESTIONS[0])
        outs = await asyncio.gather(*(collect(engine, tokens) for _ in range(6)))
        assert len({t for t, _ in outs}) == 1
        assert all(last.finish_reason in ("stop", "length") for _, last in outs)
    finally:
        engine.close()


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "per_slot"])
def test_batched_sequences_do_not_mix(model, unified):
    """Each sequence in one batch attends only to its own KV: its logits are those of the
    same prompt run alone, within llama.cpp's path noise (its CPU kernels are not
    batch-invariant, so greedy text may flip late at a near-tie). A mix-up between
    sequences is far outside that noise, as the different questions show. The sequences
    are not in id order: per slot (`kv_layout: per_slot`) the runner sorts the batch for
    llama.cpp and `logits(i)` still answers for entry i."""
    runner = LlamaRunner(model, 512, 8, 512, 2, kv_unified=unified)
    try:
        prompts = [chat(model, q) for q in QUESTIONS]
        entries, last = [], []
        for sid, p in zip([5, 0, 3, 1, 4, 2], prompts, strict=True):
            entries += [BatchEntry(t, i, sid, i == len(p) - 1) for i, t in enumerate(p)]
            last.append(len(entries) - 1)
        runner.decode(entries)
        together = [runner.logits(i).copy() for i in last]
        alone = []
        for p in prompts:
            runner.seq_remove(7, -1, -1)
            alone.append(_last_logits(runner, 7, p, 0))
        for a, b in zip(alone, together, strict=True):
            assert np.abs(a - b).max() < 1.5
            assert int(a.argmax()) == int(b.argmax())
        assert np.abs(alone[0] - together[1]).max() > 1.5  # another question is far off
    finally:
        runner.close()


def _last_logits(runner, seq_id, tokens, start):
    entries = [BatchEntry(t, start + i, seq_id, i == len(tokens) - 1) for i, t in enumerate(tokens)]
    runner.decode(entries)
    return runner.logits(len(entries) - 1).copy()


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "per_slot"])
def test_prefix_reuse_logits_match_a_full_prefill(model, unified):
    """KV copied from a cached prefix (kept in its slot, copied from another, or saved to
    host memory and restored) gives the logits a full prefill gives, within the
    noise between llama.cpp's own computation paths (~0.7 here: decode vs prefill kernels,
    flash-attention accumulation order). A wrong reuse (positions or cells off) is far
    outside it — the negative control below shows the test can fail. Per slot, a copy
    between slots is a whole-stream copy, then trimmed (llama.cpp copies nothing less)."""
    runner = LlamaRunner(model, 1024, 4, 256, 2, kv_unified=unified)
    try:
        p1 = chat(model, "What is the capital of France?", SYSTEM)
        p2 = chat(model, "What is the capital of Italy?", SYSTEM)
        n = common_prefix(p1, p2)
        assert n > 150
        full = _last_logits(runner, 0, p2, 0)
        _last_logits(runner, 1, p1, 0)  # the cached sequence
        runner.seq_remove(1, n, -1)
        reused = _last_logits(runner, 1, p2[n:], n)
        runner.seq_remove(2, -1, -1)
        runner.seq_copy(0, 2, 0, n)  # the copy from a running sequence
        copied = _last_logits(runner, 2, p2[n:], n)
        state, size = runner.seq_state(1)  # the host cache's save and restore
        runner.seq_remove(3, -1, -1)
        assert size > 0 and runner.set_seq_state(3, state, size) and runner.seq_remove(3, n, -1)
        restored = _last_logits(runner, 3, p2[n:], n)
        for got in (reused, copied, restored):
            assert np.abs(got - full).max() < 1.5
            assert int(got.argmax()) == int(full.argmax())
        # negative control: the suffix at shifted positions is not the same computation
        runner.seq_remove(3, -1, -1)
        runner.seq_copy(0, 3, 0, n - 5)
        wrong = _last_logits(runner, 3, p2[n:], n - 5)
        assert np.abs(wrong - full).max() > 1.5
    finally:
        runner.close()


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "per_slot"])
async def test_engine_reuses_the_shared_system_prompt(model, unified):
    """Per slot (`kv_layout: per_slot`) too: a prefix copied between slots is a
    whole-stream copy, and steps mix several slots' streams."""
    plain = make_engine(model, prefix_reuse=False)
    reuse = make_engine(model, prefix_reuse=True, kv_unified=unified)
    assert reuse.runner.unified is unified
    first = SamplingParams(max_tokens=4, temperature=0.0)
    reused: list[int] = []
    orig = reuse.scheduler._place

    def spy(seq, kv):
        orig(seq, kv)
        reused.append(seq.reused)

    reuse.scheduler._place = spy
    try:
        system_len = len(model.tokenize(SYSTEM, add_special=False))
        # questions whose first token is not a near-tie: Spain's was ("El" 30.73 vs "The"
        # 30.68), and the reused path's logits differ by up to ~1 from a full prefill
        # (llama.cpp's CPU kernels are not batch-invariant), so it flipped
        for q in ("What is the capital of France?", "What is the capital of Italy?",
                  "What is the capital of Japan?"):
            tokens = chat(model, q, SYSTEM)
            got, _ = await collect(reuse, tokens, first)
            want, _ = await collect(plain, tokens, first)
            assert got == want
        assert reused[0] == 0
        assert all(r >= system_len for r in reused[1:])
        # concurrent requests copy the prefix from a running sequence
        reused.clear()
        prompts = [chat(model, q, SYSTEM) for q in QUESTIONS]
        outs = await asyncio.gather(*(collect(reuse, p, first) for p in prompts))
        assert all(r >= system_len for r in reused)
        assert len({t for t, _ in outs}) > 3
    finally:
        plain.close()
        reuse.close()


async def test_the_engine_restores_a_forgotten_system_prompt_and_answers_the_same(model):
    greedy = SamplingParams(max_tokens=8, temperature=0.0)

    async def ask(engine, question):
        chunks = [c async for c in engine.generate(chat(model, question, SYSTEM), greedy)]
        return "".join(c.text for c in chunks), chunks[-1].usage

    plain = make_engine(model, n_seq_max=2, prefix_reuse=False)
    # free slots keep no cells: every finished prompt leaves the KV buffer
    hosted = make_engine(model, n_seq_max=2, cache_cells=0, host_cache_bytes=256 << 20)
    try:
        system_len = len(model.tokenize(SYSTEM, add_special=False))
        for q in ("What is the capital of France?", "What is the capital of Italy?",
                  "What is the capital of Japan?"):
            want, _ = await ask(plain, q)
            got, usage = await ask(hosted, q)
            assert got == want
        assert hosted.host is not None and hosted.host.restores >= 1
        assert usage is not None and usage.cached_tokens is not None
        assert usage.cached_tokens >= system_len
    finally:
        plain.close()
        hosted.close()


async def test_cancel_frees_the_slot_within_a_step(model):
    engine = make_engine(model)
    try:
        long = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
        gens = [engine.generate(chat(model, q), long) for q in QUESTIONS]
        for g in gens:
            await g.__anext__()  # each is running
        assert len(engine.scheduler.running) == len(QUESTIONS)
        steps = engine.steps
        for g in gens:
            await g.aclose()
        for _ in range(200):
            if not engine.scheduler.running:
                break
            await asyncio.sleep(0.01)
        assert not engine.scheduler.running
        assert all(s.owner is None for s in engine.scheduler.slots)
        assert engine.steps - steps <= 3
    finally:
        engine.close()


async def test_stop_string_and_max_tokens(model):
    engine = make_engine(model)
    try:
        tokens = chat(model, "Count from 1 to 20, separated by commas.")
        full, _ = await collect(engine, tokens, SamplingParams(max_tokens=60, temperature=0.0))
        assert "5" in full
        cut, last = await collect(engine, tokens, SamplingParams(max_tokens=60, temperature=0.0,
                                                                 stop=("5",)))
        assert "5" not in cut and full.startswith(cut) and last.finish_reason == "stop"
        short, last = await collect(engine, tokens, SamplingParams(max_tokens=3, temperature=0.0))
        assert last.finish_reason == "length" and last.usage.completion_tokens == 3
    finally:
        engine.close()


async def test_seeded_sampling_is_reproducible_and_differs_from_greedy(model):
    engine = make_engine(model)
    try:
        tokens = chat(model, "Write a sentence about the sea.")
        hot = SamplingParams(max_tokens=30, temperature=1.2, top_p=0.95, seed=42)
        a, _ = await collect(engine, tokens, hot)
        b, _ = await collect(engine, tokens, hot)
        assert a == b
        others = {(await collect(engine, tokens, SamplingParams(max_tokens=30, temperature=1.2,
                                                                 seed=s)))[0] for s in range(4)}
        assert len(others) > 1
    finally:
        engine.close()


def test_weights_conversion_is_cached_and_keeps_the_model(model, tmp_path, monkeypatch):
    """`weights: BF16` converts the shipped file once (kept in the conversion cache) and the
    converted model predicts what the shipped one does; Q2_K, a lossy type, shows that the
    comparison can fail."""
    from redline.models import served_path

    monkeypatch.setenv("REDLINE_CACHE_DIR", str(tmp_path))
    src = Path(model.path)
    assert served_path(src, "as-shipped") == src
    bf16 = served_path(src, "BF16")
    assert bf16.parent == tmp_path / "models" and bf16.exists()
    stamp = bf16.stat().st_mtime_ns
    assert served_path(src, "BF16") == bf16 and bf16.stat().st_mtime_ns == stamp  # cached
    assert not list((tmp_path / "models").glob("*.part"))

    def last_logits(m):
        runner = LlamaRunner(m, 256, 1, 64, 2)
        try:
            tokens = chat(m, "What is the capital of France?")
            runner.decode([BatchEntry(t, i, 0, i == len(tokens) - 1) for i, t in enumerate(tokens)])
            return runner.logits(len(tokens) - 1).copy()
        finally:
            runner.close()

    ref = last_logits(model)

    def kl(path):  # KL(shipped || converted) of the next-token distribution
        m = LlamaModel(str(path), "builtin")  # the same prompt as `model`'s
        try:
            out = last_logits(m)
        finally:
            m.close()
        p, q = np.exp(ref - ref.max()), np.exp(out - out.max())
        p, q = p / p.sum(), q / q.sum()
        return float(np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12))))

    assert kl(bf16) < 0.02
    assert kl(served_path(src, "Q2_K")) > 0.02


async def test_min_tokens_holds_back_every_end_until_reached(model):
    """vLLM's min_tokens: no end-of-generation token and no stop string before it; after
    it the answer ends as it would."""
    engine = make_engine(model)
    try:
        tokens = chat(model, "Reply with one word: yes or no. Is water wet?")
        short, last = await collect(engine, tokens, SamplingParams(max_tokens=40, temperature=0.0))
        assert last.finish_reason == "stop" and last.usage.completion_tokens < 12
        held = SamplingParams(max_tokens=40, temperature=0.0, min_tokens=12)
        text, last = await collect(engine, tokens, held)
        assert last.usage.completion_tokens >= 12
        assert text.startswith(short)  # greedy: the same answer, carried on past its end
        # a stop string inside the first min_tokens tokens does not end it
        stop = short.strip()[:2]
        stopped = SamplingParams(max_tokens=40, temperature=0.0, min_tokens=12, stop=(stop,))
        text2, last2 = await collect(engine, tokens, stopped)
        assert last2.usage.completion_tokens >= 12 and text2.startswith(short.strip()[:2])
    finally:
        engine.close()


async def test_a_stop_token_id_ends_the_answer_and_is_kept(model):
    """vLLM's stop_token_ids: the answer ends at the first of them, whose text it keeps."""
    engine = make_engine(model)
    try:
        tokens = chat(model, QUESTIONS[1])
        chunks = [c async for c in engine.generate(tokens, GREEDY)]
        whole = "".join(c.text for c in chunks)
        ids = model.tokenize(whole, add_special=False)
        # a token that the greedy answer reaches a few tokens in, seen there for the first time
        at = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])
        sampling = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(ids[at],))
        text, last = await collect(engine, tokens, sampling)
        assert last.finish_reason == "stop"
        assert last.usage.completion_tokens == at + 1
        assert text == b"".join(model.piece(t) for t in ids[:at + 1]).decode()
    finally:
        engine.close()


async def test_prompt_logprobs_are_the_models_own_and_never_from_a_reused_prefix(model):
    """A sequence that scores its prompt (an echoed completion with logprobs) gets each
    prompt token's log-probability from its own computation: the same as one forward pass
    over the prompt gives, also when the prompt is already cached in another slot."""
    from redline.engine.sampling import token_logprobs

    prompt = model.tokenize("The capital of France is Paris. The capital of Italy is Rome.",
                            add_special=True)
    runner = LlamaRunner(model, 256, 1, 64, 2)
    try:
        runner.decode([BatchEntry(t, i, 0, True) for i, t in enumerate(prompt)])
        want = [token_logprobs(runner.logits(i).copy(), prompt[i + 1], 2, model.piece)
                for i in range(len(prompt) - 1)]
    finally:
        runner.close()
    engine = make_engine(model)
    try:
        sampling = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2)
        for _ in range(2):  # the second time its prompt is cached: it is computed again
            chunks = [c async for c in engine.generate(prompt, sampling)]
            got = chunks[0].prompt_logprobs
            assert got is not None and len(got) == len(prompt) - 1
            for g, w in zip(got, want, strict=True):
                assert g.token == w.token and abs(g.logprob - w.logprob) < 0.02
                assert [o.token for o in g.top] == [o.token for o in w.top]
            assert all(c.prompt_logprobs is None for c in chunks[1:])
            assert chunks[-1].usage.cached_tokens == 0  # nothing reused
        # a sequence that does not ask gets none
        plain = [c async for c in engine.generate(prompt, GREEDY)]
        assert all(c.prompt_logprobs is None for c in plain)
        assert plain[-1].usage.cached_tokens > 0  # and reuses the cached prompt
    finally:
        engine.close()
