"""The semantic cache's error budget: the estimate and its bounds, the threshold moves,
the judge, low-priority shadow generation, and the whole loop through the app with a
fake backend whose answers differ (or not) for a paraphrased pair."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.cache.embedder import HashingEmbedder
from redline.cache.error_budget import CEILING, MIN_SEPARATION, PERFECT, ErrorBudget, wilson
from redline.cache.judge import question_calibration, question_judge, wrong, yes_log_odds
from redline.cache.shadow import ShadowGenerator
from redline.config import CacheConfig, RedlineConfig
from redline.types import Chunk, GenerationRequest, Message, SamplingParams, TokenLogprob, TopLogprob, Usage

Q1 = "Where is my order 1042 right now?"
Q2 = "where is my order 1042 right now"  # a paraphrase the cache serves at threshold 0.8


class Book(FakeBackend):
    """Answers each question from a dict (word by word), others with a default."""

    def __init__(self, answers: dict[str, str], busy: int = 0) -> None:
        super().__init__("fake")
        self.answers = answers
        self.busy = busy  # requests that pretend to wait in the engine

    def load(self) -> int:
        return self.inflight + self.busy

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.calls += 1
        self.inflight += 1
        try:
            question = (request.messages or (Message("user", ""),))[-1].content
            words = self.answers.get(question, "I do not know that.").split(" ")
            for i, word in enumerate(words):
                await asyncio.sleep(0)
                last = i == len(words) - 1
                yield Chunk(text=word if i == 0 else " " + word, tokens=1,
                            finish_reason="stop" if last else None,
                            usage=Usage(5, len(words)) if last else None)
        finally:
            self.inflight -= 1


# -- the estimate and the threshold ------------------------------------------
def test_wilson_bounds() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(0, 200)
    assert lo == 0.0 and 0.005 < hi < 0.02  # 200 right hits: under a 2 % budget
    lo, hi = wilson(10, 100)
    assert 0.05 < lo < 0.1 < hi < 0.17


def test_tightens_when_wrong_hits_exceed_the_budget_then_turns_off() -> None:
    b = ErrorBudget(0.02, 0.70, step=0.05, loosen_after=10)
    for _ in range(20):
        assert b.record(0.9, False) == "held"  # too little evidence to loosen or tighten
    assert b.threshold == 0.70
    assert b.record(0.9, True) == "held"  # 1 of 21: lower bound ~1 % < 2 %
    moves = [b.record(0.9, True) for _ in range(3)]
    assert "tightened" in moves and b.threshold > 0.70
    assert 0.02 < b.estimate(0.70).lower
    while b.semantic_on:  # wrong hits keep coming at every similarity: off in the end
        b.record(0.995, True)
    assert b.threshold <= CEILING and not b.semantic_on


def test_one_wrong_hit_alone_tightens() -> None:
    b = ErrorBudget(0.02, 0.70)
    assert b.record(0.75, True) == "tightened"  # 1 of 1: lower bound 27 %
    assert b.threshold == 0.72


def test_loosens_slowly_only_with_evidence_under_the_budget_and_never_below_the_floor() -> None:
    b = ErrorBudget(0.02, 0.70, step=0.02, loosen_after=50)
    b.record(0.71, True)
    assert b.threshold == 0.72
    # the rate at 0.70 counts every hit at or above it: 1 wrong of 101 is not yet shown
    # to be under 2 % (upper bound ~5 %), so nothing moves
    for _ in range(100):
        b.record(0.95, False)
    assert b.threshold == 0.72
    moves = [b.record(0.95, False) for _ in range(300)]
    assert moves.count("loosened") == 1 and b.threshold == 0.70
    assert b.estimate().upper < 0.02
    for _ in range(200):
        b.record(0.705, False)
    assert b.threshold == 0.70  # the configured threshold is the floor


def test_semantic_hits_come_back_on_only_with_evidence() -> None:
    b = ErrorBudget(0.02, 0.98, step=0.02, loosen_after=5)
    assert b.record(0.985, True) == "off"  # 0.98 + 0.02 is past the ceiling (0.99)
    for _ in range(100):  # would-be hits far below the ceiling say nothing of it
        assert b.record(0.9, False) == "held"
    moves = [b.record(0.995, False) for _ in range(200)]
    assert moves.count("on") == 1 and b.semantic_on


# -- the judge ---------------------------------------------------------------
def test_judge() -> None:
    e = HashingEmbedder()
    assert not wrong("Your order left the depot.", "your order left the depot", e, 0.8)
    assert wrong("The train leaves at 9 am on Monday.", "The train leaves at 9 pm on Monday.",
                 e, 0.8)  # another time: wrong whatever the embedding says
    assert wrong("It costs 5 dollars.", "It costs 7 dollars.", e, 0.0)
    assert wrong("Reset it in Settings.", "Call the bank to close your account.", e, 0.8)


# -- shadow generation at low priority -----------------------------------------
def _req(text: str) -> GenerationRequest:
    return GenerationRequest("fake", SamplingParams(temperature=0.0, max_tokens=16),
                             (Message("user", text),))


async def test_no_shadow_generation_while_requests_wait() -> None:
    book = Book({Q1: "It is on its way."}, busy=2)
    gen = ShadowGenerator({"fake": book}, max_wait_s=0.2, poll_s=0.01)
    assert await gen.generate(_req(Q1), "fake") is None
    assert book.calls == 0  # never started while the engine had work waiting
    book.busy = 0
    assert await gen.generate(_req(Q1), "fake") == "It is on its way."
    assert book.calls == 1


async def test_a_request_that_arrives_preempts_the_shadow() -> None:
    book = Book({Q1: " ".join(["word"] * 50)})
    gen = ShadowGenerator({"fake": book}, max_wait_s=0.3, poll_s=0.01, attempts=2)
    task = asyncio.create_task(gen.generate(_req(Q1), "fake"))
    while book.calls == 0:
        await asyncio.sleep(0)
    book.busy = 1  # a user's request arrives mid-generation and stays
    assert await task is None
    assert gen.preempted == 1 and book.inflight == 0  # abandoned and closed, not retried


# -- the whole loop through the app -----------------------------------------
def _client(tmp_path: Path, book: Book, **cache: Any) -> TestClient:
    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, store={"url": "memory://"},
                        cache={"similarity_threshold": 0.8, "shadow_sample": 1.0, **cache})
    app = create_app(cfg, backends={"fake": book})
    services_of(app).pipeline.cache.embedder = HashingEmbedder()  # no torch in these tests
    return TestClient(app)


def _ready(client: TestClient) -> None:
    deadline = time.monotonic() + 30
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _ask(client: TestClient, text: str) -> str:
    r = client.post("/v1/chat/completions", json={
        "model": "fake", "temperature": 0, "max_tokens": 16,
        "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return str(r.headers["x-redline-cache"])


def _wait(cond: Any) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_wrong_hit_raises_the_entry_bar_and_the_threshold(tmp_path: Path) -> None:
    book = Book({Q1: "It left the depot on Monday.", Q2: "It was delivered on Friday."})
    with _client(tmp_path, book) as client:
        _ready(client)
        cache = services_of(client.app).pipeline.cache
        assert _ask(client, Q1) == "miss"
        _wait(lambda: not cache._tasks)
        assert _ask(client, Q2) == "semantic"  # served, and checked in the background
        _wait(lambda: cache.verifier.verdicts == 1)
        assert book.calls == 2  # the shadow asked the model Q2
        assert cache.verifier.threshold > 0.8  # 1 wrong of 1 is over a 2 % budget
        assert _ask(client, Q2) == "miss"  # that entry no longer serves this question
        # that would-be hit was checked too, against the answer the model just gave
        _wait(lambda: cache.verifier.verdicts == 2)
        assert book.calls == 3
        metrics = client.get("/metrics").text
        assert 'redline_cache_wrong_hits_total{hit="served"} 1.0' in metrics
        assert 'redline_cache_wrong_hits_total{hit="unserved"} 1.0' in metrics
        assert 'redline_cache_verified_hits_total{hit="served"} 1.0' in metrics
        assert "redline_cache_semantic_hits_total 1.0" in metrics
        assert "redline_cache_semantic_threshold 0.84" in metrics
        assert 'redline_cache_wrong_hit_rate{value="upper"} 1.0' in metrics
        budget = client.get("/v1/admin/stats").json()["cache_budget"]  # the dashboard's
        assert budget["checks"] == 2 and budget["threshold"] == 0.84 and budget["budget"] == 0.02
        assert budget["semantic_on"] is True and budget["upper"] == 1.0


def test_a_right_hit_stays_served(tmp_path: Path) -> None:
    same = "It left the depot on Monday."
    book = Book({Q1: same, Q2: same})
    with _client(tmp_path, book) as client:
        _ready(client)
        cache = services_of(client.app).pipeline.cache
        _ask(client, Q1)
        _wait(lambda: not cache._tasks)
        assert _ask(client, Q2) == "semantic"
        _wait(lambda: cache.verifier.verdicts == 1)
        assert cache.verifier.threshold == 0.8
        assert _ask(client, Q2) == "semantic"
        _wait(lambda: cache.verifier.verdicts == 2)
        assert cache.verifier.threshold == 0.8
        metrics = client.get("/metrics").text
        assert 'redline_cache_wrong_hits_total{hit="served"} 0.0' in metrics
        assert 'redline_cache_verified_hits_total{hit="served"} 2.0' in metrics
        assert "redline_cache_semantic_hits_total 2.0" in metrics


def test_semantic_off_no_checks(tmp_path: Path) -> None:
    book = Book({Q1: "It left the depot on Monday.", Q2: "It was delivered on Friday."})
    with _client(tmp_path, book, shadow_sample=0.0) as client:
        _ready(client)
        cache = services_of(client.app).pipeline.cache
        _ask(client, Q1)
        _wait(lambda: not cache._tasks)
        assert _ask(client, Q2) == "semantic"
        time.sleep(0.2)
        assert cache.verifier.verdicts == 0 and book.calls == 1  # nothing sampled, no shadow


def test_the_sample_is_every_nth_hit() -> None:
    from redline.cache.verify import Verifier
    from redline.config import CacheConfig
    from redline.store.memory import MemoryStore

    v = Verifier(CacheConfig(shadow_sample=0.25), MemoryStore(), ShadowGenerator({}))
    picked = []
    for i in range(12):
        req = _req(f"q{i}")
        v.note(req, "fake", "e", 0.9, "a", served=True)
        picked.append(req.id in v._pending)
    assert picked == [False, False, False, True] * 3
    none = Verifier(CacheConfig(shadow_sample=0.0), MemoryStore(), ShadowGenerator({}))
    none.note(_req("q"), "fake", "e", 0.9, "a", served=False)
    assert not none._pending


# -- a judge that errs: its verdicts corrected by its measured error rates -----
def test_the_estimate_is_corrected_for_the_judges_errors() -> None:
    from redline.cache.error_budget import JudgeErrors

    fair = JudgeErrors(false_wrong=0.1, true_wrong=0.9)
    b = ErrorBudget(0.02, 0.70, step=0.05, loosen_after=1000)
    for i in range(60):  # 10 % called wrong: what this judge says of right hits alone
        b.record(0.9, i % 10 == 9, fair)
    est = b.estimate()
    assert est.observed == 0.1 and est.rate < 1e-9  # corrected: no wrong hit in evidence
    assert b.threshold == 0.70  # where raw verdicts (lower bound ~5 %) would have tightened
    raw = ErrorBudget(0.02, 0.70, step=0.05, loosen_after=1000)
    for i in range(60):
        raw.record(0.9, i % 10 == 9)
    assert raw.threshold > 0.70
    for _ in range(30):  # then half called wrong: (0.5 - 0.1) / 0.8 = 0.5 of hits are wrong
        b.record(0.9, True, fair)
        b.record(0.9, False, fair)
    assert b.threshold > 0.70


def test_a_judge_that_cannot_tell_moves_nothing() -> None:
    from redline.cache.error_budget import JudgeErrors

    # SmolLM2's answers on the tuning part in session 11 (0.776 / 0.820 since session 27)
    blind = JudgeErrors(false_wrong=0.80, true_wrong=0.908)
    b = ErrorBudget(0.02, 0.70)
    for i in range(100):
        assert b.record(0.9, i % 5 != 0, blind) == "held"
    est = b.estimate()
    assert (est.lower, est.upper) == (0.0, 1.0) and est.observed == 0.8
    assert b.threshold == 0.70 and b.semantic_on


def test_errors_for_a_model() -> None:
    from redline.cache.error_budget import PERFECT, JudgeErrors
    from redline.cache.judge import calibration, errors_for
    from redline.config import ModelConfig

    smol = ModelConfig(name="smol", bundled="smollm2-135m-instruct")
    measured = calibration()["smollm2-135m-instruct"]
    assert errors_for(smol, measured["agreement"]) == JudgeErrors(
        measured["false_wrong"], measured["true_wrong"])
    assert errors_for(smol, 0.5) == PERFECT  # measured at another agreement: not these rates
    set_ = ModelConfig(name="big", backend="openai", url="http://x", judge_false_wrong=0.1,
                       judge_true_wrong=0.9)
    assert errors_for(set_, 0.8) == JudgeErrors(0.1, 0.9)
    assert errors_for(ModelConfig(name="other", backend="openai", url="http://x"), 0.8) == PERFECT


def test_a_blind_judges_wrong_verdict_bars_nothing(tmp_path: Path) -> None:
    """The same pair as test_a_wrong_hit_raises_the_entry_bar_and_the_threshold, judged by
    a judge measured to call 80 % of right hits wrong: the hit stays served."""
    book = Book({Q1: "It left the depot on Monday.", Q2: "It was delivered on Friday."})
    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, store={"url": "memory://"},
                        cache={"similarity_threshold": 0.8, "shadow_sample": 1.0},
                        models=[{"name": "fake", "backend": "openai", "url": "http://127.0.0.1:9",
                                 "judge_false_wrong": 0.8, "judge_true_wrong": 0.9}])
    app = create_app(cfg, backends={"fake": book})
    services_of(app).pipeline.cache.embedder = HashingEmbedder()
    with TestClient(app) as client:
        _ready(client)
        cache = services_of(client.app).pipeline.cache
        assert _ask(client, Q1) == "miss"
        _wait(lambda: not cache._tasks)
        assert _ask(client, Q2) == "semantic"
        _wait(lambda: cache.verifier.verdicts == 1)
        assert cache.verifier.threshold == 0.8  # a verdict this judge gives most right hits
        assert _ask(client, Q2) == "semantic"  # no bar on the entry either
        budget = client.get("/v1/admin/stats").json()["cache_budget"]
        assert budget["observed"] == 1.0 and budget["lower"] == 0.0 and budget["upper"] == 1.0
        assert budget["rate"] is None and budget["judge_informative"] is False
        assert 'redline_cache_wrong_hit_rate{value="estimate"} NaN' in client.get("/metrics").text


# -- the questions judge (cache.judge: questions) ---------------------------------
def test_yes_log_odds() -> None:
    top = [TopLogprob("Yes", -0.2), TopLogprob(" no", -1.9), TopLogprob("The", -3.0)]
    assert abs(yes_log_odds(top) - 1.7) < 1e-9  # type: ignore[operator]
    # a word not among the top counts at the least likely one's probability
    assert abs(yes_log_odds([TopLogprob("no", -0.1), TopLogprob("x", -4.0)]) + 3.9) < 1e-9  # type: ignore[operator]
    assert yes_log_odds([TopLogprob("maybe", -0.1)]) is None and yes_log_odds([]) is None


def test_the_questions_judge_is_the_largest_local_chat_model() -> None:
    models = RedlineConfig().models  # the default: SmolLM2 (rank 1) and Qwen (rank 2)
    assert question_judge(RedlineConfig().cache, models) is None  # judge: answers
    j = question_judge(CacheConfig(judge="questions"), models)
    assert j is not None and j.model == "qwen2.5-coder-0.5b-instruct"
    measured = question_calibration()["qwen2.5-coder-0.5b-instruct"]  # the tuning part's
    assert j.threshold == measured["threshold"]
    assert (j.errors.false_wrong, j.errors.true_wrong) == (measured["false_wrong"],
                                                           measured["true_wrong"])
    assert j.errors.true_wrong - j.errors.false_wrong >= MIN_SEPARATION  # it can tell
    # another cut than the one measured: its rates are unknown, the judge taken at its word
    k = question_judge(CacheConfig(judge="questions", judge_threshold=5.0), models)
    assert k is not None and k.threshold == 5.0 and k.errors == PERFECT
    named = question_judge(CacheConfig(judge="questions", judge_model="smollm2-135m-instruct",
                                       judge_false_wrong=0.1, judge_true_wrong=0.7), models)
    assert named is not None and named.model == "smollm2-135m-instruct"
    assert (named.errors.false_wrong, named.errors.true_wrong) == (0.1, 0.7)


class Judge(Book):
    """Also a duplicate-question judge: says yes when the two questions, lower-cased and
    without punctuation, are the same words."""

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        text = (request.messages or (Message("user", ""),))[-1].content
        if not (request.sampling.logprobs and text.startswith("Question A: ")):
            async for chunk in super().stream(request):
                yield chunk
            return
        self.calls += 1
        a, b = (line.split(": ", 1)[1] for line in text.split("\n")[:2])
        same = " ".join(a.lower().strip("?").split()) == " ".join(b.lower().strip("?").split())
        first, second = ("Yes", "No") if same else ("No", "Yes")
        top = (TopLogprob(first, -0.1), TopLogprob(second, -2.5))
        yield Chunk(text=first, tokens=1, finish_reason="length", usage=Usage(30, 1),
                    logprobs=(TokenLogprob(first, -0.1, top=top),))


def test_the_questions_judge_bars_a_different_question_and_keeps_a_paraphrase(
        tmp_path: Path) -> None:
    other = "Where is my order 1042 right now please?"  # the judge says: not the same
    book = Judge({Q1: "It left the depot on Monday.", Q2: "Totally different words here."})
    with _client(tmp_path, book, judge="questions", judge_model="fake") as client:
        _ready(client)
        cache = services_of(client.app).pipeline.cache
        assert cache.verifier.questions is not None
        assert _ask(client, Q1) == "miss"
        _wait(lambda: not cache._tasks)
        # a paraphrase whose answers differ: the answers judge would call it wrong; the
        # questions judge asks the model about the questions and keeps it
        assert _ask(client, Q2) == "semantic"
        _wait(lambda: cache.verifier.verdicts == 1)
        assert book.calls == 2  # Q1's answer, then one judgement (no answer generated)
        assert cache.verifier.threshold == 0.8
        assert _ask(client, Q2) == "semantic"
        _wait(lambda: cache.verifier.verdicts == 2)
        assert cache.verifier.threshold == 0.8
        similar = cache.verifier.budget.estimate()
        assert similar.wrong == 0 and similar.verified == 2
        # a question the judge calls different: a wrong hit, the entry's bar rises
        assert _ask(client, other) == "semantic"
        _wait(lambda: cache.verifier.verdicts == 3)
        assert cache.verifier.budget.estimate().wrong == 1
        assert cache.verifier.threshold > 0.8
        assert _ask(client, other) == "miss"
