"""N-gram speculative decoding: the lookup and the scheduler's drafts with made-up
sequences (no model); the engine on the real bundled SmolLM2 (slow): the same text with and
without drafting, and drafts accepted where the answer quotes the prompt."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from redline.config import ModelConfig
from redline.engine.scheduler import Scheduler
from redline.engine.sequence import Sequence
from redline.engine.speculative import NgramIndex, NgramSettings
from redline.types import SamplingParams

GREEDY = SamplingParams(max_tokens=32, temperature=0.0)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make(loop, prompt, sampling=GREEDY, sid="s"):
    return Sequence(sid, list(prompt), sampling, lambda c: None, loop)


# ---- the lookup ----------------------------------------------------------------------
def test_proposes_what_followed_the_longest_earlier_match():
    idx = NgramIndex(NgramSettings(max_draft=3, min_match=1, max_match=3))
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [5, 1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3]
    # the suffix 1 2 3 occurred at 1..3: what followed is 9 8 2 (the 2 3 at 6..7 is a
    # shorter match, tried only when no longer one exists)
    assert idx.propose(tokens, 8) == [9, 8, 2]


def test_never_matches_the_suffix_itself_and_none_without_a_match():
    idx = NgramIndex(NgramSettings(max_draft=4, min_match=2, max_match=3))
    assert idx.propose([1, 2, 3, 4], 4) == []  # no bigram occurs twice
    assert idx.propose([1, 2, 3, 4, 5], 4) == []  # grown by a token: still none


def test_index_follows_the_growing_sequence_and_latest_occurrence_wins():
    idx = NgramIndex(NgramSettings(max_draft=2, min_match=2, max_match=2))
    tokens = [1, 2, 10, 11]
    assert idx.propose(tokens, 2) == []
    tokens += [1, 2]
    assert idx.propose(tokens, 2) == [10, 11]
    tokens += [20, 21, 1, 2]
    assert idx.propose(tokens, 2) == [20, 21]  # the more recent continuation


def test_draft_length_adapts_to_acceptance():
    idx = NgramIndex(NgramSettings(max_draft=4, min_match=1, max_match=1))
    tokens = [1, 2, 3, 4, 5, 6, 1]
    assert idx.propose(tokens, 10) == [2, 3, 4, 5]  # max_draft caps it
    idx.verified(4, 1)
    idx.verified(3, 0)
    assert idx.propose(tokens, 10) == [2, 3]
    idx.verified(2, 2)  # accepted whole: two more
    assert idx.propose(tokens, 10) == [2, 3, 4, 5]
    for _ in range(10):
        idx.verified(1, 0)
    assert idx.propose(tokens, 10) == [2]  # never below one


# ---- the scheduler -------------------------------------------------------------------
def quoting_seq(loop, sampling=GREEDY):
    seq = make(loop, [1, 2, 3, 4, 5, 6, 7, 8], sampling)
    return seq


def decoding(sched, seqs):
    """Prefill `seqs` in one step, then as if each had sampled 3 and decoded it, then
    sampled 4: each now decodes 4, after ... 8, 3, whose "3 4" occurred in its prompt."""
    for seq in seqs:
        sched.add(seq)
    sched.commit(sched.schedule())
    for seq in seqs:
        seq.output += [3, 4]
        seq.n_fed += 1
        sched.slots[seq.slot].tokens.append(3)


def test_greedy_decode_step_carries_the_draft_with_logits_at_each(loop):
    s = Scheduler(n_seq_max=2, n_batch=64, drafter=NgramSettings(max_draft=3))
    seq = quoting_seq(loop)
    decoding(s, [seq])  # "3 4" occurred at 2..3: draft 5 6 7
    batch = s.schedule()
    assert [e.token for e in batch.entries] == [4, 5, 6, 7]
    assert [e.pos for e in batch.entries] == [9, 10, 11, 12]
    assert all(e.logits for e in batch.entries)
    assert batch.drafts == {0: [5, 6, 7]}
    assert batch.n_decode == 4
    s.commit(batch)
    assert seq.n_fed == 13
    # the target took 5, then chose 9 where the draft said 6: 6 and 7 leave the cache
    s.verified(seq, 3, 1)
    assert seq.n_fed == 11
    assert s.slots[seq.slot].tokens == [1, 2, 3, 4, 5, 6, 7, 8, 3, 4, 5]
    seq.output += [5, 9]
    nxt = s.schedule()
    assert (seq.slot, 11) in nxt.kv.removals  # positions 11.. (the rejected 6, 7) go
    assert nxt.entries[0].token == 9 and nxt.entries[0].pos == 11


@pytest.mark.parametrize("sampling", [
    SamplingParams(max_tokens=32, temperature=0.8, seed=3),  # sampled: same rule, see speculative.py
    SamplingParams(max_tokens=32, temperature=0.0, logprobs=True),
    SamplingParams(max_tokens=32, temperature=0.0, presence_penalty=0.5),
    SamplingParams(max_tokens=32, temperature=0.0, grammar='root ::= "a"'),
])
def test_every_kind_of_sequence_drafts(loop, sampling):
    s = Scheduler(n_seq_max=2, n_batch=64, drafter=NgramSettings(max_draft=3))
    decoding(s, [quoting_seq(loop, sampling)])
    batch = s.schedule()
    assert batch.drafts == {0: [5, 6, 7]}
    assert [e.token for e in batch.entries] == [4, 5, 6, 7]


def test_no_draft_past_max_tokens(loop):
    s = Scheduler(n_seq_max=2, n_batch=64, drafter=NgramSettings())
    # two tokens out, max_tokens 3: the step's own token is the last one
    decoding(s, [quoting_seq(loop, SamplingParams(max_tokens=3, temperature=0.0))])
    batch = s.schedule()
    assert batch.drafts == {}
    assert [e.token for e in batch.entries] == [4]


def test_no_draft_when_off_or_when_the_batch_is_busy(loop):
    for sched, n in ((Scheduler(n_seq_max=4, n_batch=64), 1),
                     (Scheduler(n_seq_max=4, n_batch=64, drafter=NgramSettings(max_decoding=2)), 3)):
        decoding(sched, [quoting_seq(loop) for _ in range(n)])
        batch = sched.schedule()
        assert batch.drafts == {}
        assert len(batch.entries) == n


def test_config_speculative_shorthand_and_bounds():
    cfg = ModelConfig(name="m", bundled="smollm2-135m-instruct", speculative="ngram")
    assert cfg.speculative.method == "ngram" and cfg.speculative.max_draft == 4
    cfg = ModelConfig(name="m", bundled="smollm2-135m-instruct",
                      speculative={"method": "ngram", "max_draft": 6, "min_match": 3})
    assert (cfg.speculative.max_draft, cfg.speculative.min_match) == (6, 3)
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct",
                       speculative="off").speculative.method == "off"
    with pytest.raises(ValueError):
        ModelConfig(name="m", bundled="smollm2-135m-instruct",
                    speculative={"min_match": 5, "max_match": 2})


# ---- the engine on the real model ----------------------------------------------------
TYPOS = ("Repeat this paragraph with the typos fixed: The quick brwon fox jumps over the lazy "
         "dog. It was a sunny day in the park, and the chidlren were playing happily near the "
         "old oak tree while their parents watched.")


@pytest.fixture(scope="module")
def model():
    from redline.engine.llama import LlamaModel
    from redline.models import bundled_path

    # built-in chatml prompts, as tests/test_engine_model.py says why: greedy answers
    # pinned across batch shapes need questions with no near-tie under kernel noise
    m = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))),
                   "builtin")
    yield m
    m.close()


async def answer(model, question, speculative, max_tokens=64, others=(), sampling=None):
    """The answer's text and (proposed, accepted) draft tokens; `others` decode alongside."""
    from redline.engine.engine import Engine
    from redline.types import Message

    def chat(q):
        return model.tokenize(model.render_chat((Message("user", q),)), add_special=False)

    engine = Engine(model, n_ctx_per_seq=512, n_seq_max=4, n_batch=256, n_threads=2,
                    speculative=speculative)
    sampling = sampling or SamplingParams(max_tokens=max_tokens, temperature=0.0)

    async def run(q):
        return "".join([c.text async for c in engine.generate(chat(q), sampling)])

    try:
        texts = await asyncio.gather(run(question), *(run(q) for q in others))
        return texts, (engine.draft_proposed, engine.draft_accepted)
    finally:
        engine.close()


@pytest.mark.slow
async def test_quoting_answer_is_the_same_text_and_drafts_are_accepted(model):
    plain, (proposed, _) = await answer(model, TYPOS, None)
    spec, (proposed, accepted) = await answer(model, TYPOS, NgramSettings())
    assert spec == plain
    assert "quick" in spec[0] and "oak tree" in spec[0]  # it did quote the prompt
    assert proposed > 0 and accepted > 0
    assert accepted <= proposed


@pytest.mark.slow
async def test_drafting_inside_a_batch_keeps_every_stream_the_same(model):
    """Two streams decode together (both draft: max_decoding 2), one quotes, one chats:
    each gives the text it gives without drafting."""
    others = ("Name three colours.",)
    settings = NgramSettings(max_decoding=2)
    plain, _ = await answer(model, TYPOS, None, 48, others)
    spec, (proposed, accepted) = await answer(model, TYPOS, settings, 48, others)
    assert spec == plain
    assert accepted > 0


@pytest.mark.slow
async def test_sampled_answers_draft_and_keep_their_seeded_text(model, monkeypatch):
    """Sampled (temperature 0.8, seeded) and with a presence penalty: drafts are proposed and
    some accepted; the sampler draws once per emitted token (and once for an end of
    sequence), as without drafting, so each seed gives the text it gives without drafting."""
    from redline.engine.sampling import Sampler

    draws = 0
    sample = Sampler.sample

    def counted(self, ctx, index, logits):
        nonlocal draws
        draws += 1
        return sample(self, ctx, index, logits)

    monkeypatch.setattr(Sampler, "sample", counted)
    accepted_any = 0
    for seed in (1, 2, 3):
        sampling = SamplingParams(max_tokens=48, temperature=0.8, seed=seed,
                                  presence_penalty=0.2)
        plain, _ = await answer(model, TYPOS, None, sampling=sampling)
        plain_draws, draws = draws, 0
        spec, (proposed, accepted) = await answer(model, TYPOS, NgramSettings(),
                                                  sampling=sampling)
        assert spec == plain, seed
        assert draws == plain_draws, seed
        draws = 0
        assert proposed > 0
        accepted_any += accepted
    assert accepted_any > 0


# ---- Predicted Outputs ---------------------------------------------------------------
def test_a_prediction_drafts_what_comes_next_while_the_answer_follows_it():
    from redline.engine.speculative import Prediction

    p = Prediction([10, 11, 12, 13, 14, 15, 16, 17], 0, NgramSettings(max_draft=3))  # no prompt
    assert p.propose([], 10) == [10, 11, 12]  # nothing yet: the prediction's start
    p.verified(3, 3)
    assert p.propose([10, 11, 12, 13], 10) == [14, 15, 16]  # still on it (length grew to 3 max)
    assert p.propose([10, 11, 12, 13], 2) == [14, 15]  # never past the step's room
    # the answer parts from it (an edit), then its last tokens are found again further on
    assert p.propose([10, 11, 12, 13, 99], 10) == []
    assert p.propose([10, 11, 12, 13, 99, 14, 15], 10) == [16, 17]
    p.verified(2, 0)
    assert p.length == 2 and (p.proposed, p.accepted) == (5, 3)


def test_a_repeated_run_is_picked_up_after_the_last_draft():
    from redline.engine.speculative import Prediction

    # "1 2" occurs twice: after a draft from the second half, the second occurrence wins
    p = Prediction([1, 2, 3, 7, 1, 2, 4, 8], 0, NgramSettings(max_draft=2))
    assert p.propose([5, 1, 2], 10) == [3, 7]  # parted at once: the first occurrence
    assert p.propose([5, 1, 2, 3, 7, 0, 1, 2], 10) == [4, 8]  # then the one after it


def test_a_sequence_with_a_prediction_drafts_with_drafting_off(loop):
    from redline.engine.speculative import Prediction

    s = Scheduler(n_seq_max=2, n_batch=64)  # no n-gram drafter
    seq = quoting_seq(loop)
    seq.prediction = Prediction([3, 4, 5, 6, 7], len(seq.prompt))
    decoding(s, [seq])  # output 3 4: on the prediction, whose next are 5 6 7
    batch = s.schedule()
    assert batch.drafts == {0: [5, 6, 7]}
    s.commit(batch)
    s.verified(seq, 3, 2)
    assert (seq.prediction.proposed, seq.prediction.accepted) == (3, 2)


@pytest.mark.slow
async def test_a_predicted_answer_is_the_same_text_and_reports_its_drafts(model):
    from redline.engine.engine import Engine
    from redline.types import Message

    prompt = model.tokenize(model.render_chat((Message("user", TYPOS),)), add_special=False)
    engine = Engine(model, n_ctx_per_seq=512, n_seq_max=4, n_batch=256, n_threads=2)
    sampling = SamplingParams(max_tokens=48, temperature=0.0)
    try:
        plain = [c async for c in engine.generate(prompt, sampling)]
        text = "".join(c.text for c in plain)
        guess = model.tokenize(text, add_special=False, parse_special=False)
        got = [c async for c in engine.generate(prompt, sampling, prediction=guess)]
        assert "".join(c.text for c in got) == text
        details = got[-1].usage.completion_details
        assert details["accepted_prediction_tokens"] > len(guess) // 2
        assert details["rejected_prediction_tokens"] >= 0
        assert plain[-1].usage.completion_details is None
        assert engine.draft_accepted == details["accepted_prediction_tokens"]
    finally:
        engine.close()
