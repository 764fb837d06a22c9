"""`redline eval-judge`'s parts: the answers asked of the model (greedy, cache bypassed),
the judge's two error rates on labelled pairs, and the calibration it writes and the
error budget then reads."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from redline.cache import judge
from redline.cache.embedder import HashingEmbedder
from redline.cache.error_budget import JudgeErrors
from redline.cache.evaluate import Pair
from redline.cache.judge_eval import (
    JudgeRates,
    answers,
    choose_cut,
    question_odds,
    question_rates,
    rates,
    write,
)
from redline.config import ModelConfig


async def test_answers_are_greedy_and_bypass_the_cache() -> None:
    seen: list[tuple[dict[str, object], str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((body, request.headers.get("cache-control", "")))
        question = body["messages"][-1]["content"]
        return httpx.Response(200, json={"choices": [{"message": {"content": f"re: {question}"}}]})

    async with httpx.AsyncClient(base_url="http://x", transport=httpx.MockTransport(handler)) as c:
        said = await answers(c, "m", ["a?", "b?"], max_tokens=12, concurrency=2)
    assert said == {"a?": "re: a?", "b?": "re: b?"}
    assert all(b["temperature"] == 0 and b["max_tokens"] == 12 and b["model"] == "m"
               and h == "no-cache" for b, h in seen)


def test_rates_count_what_the_judge_calls_wrong_per_label() -> None:
    pairs = [Pair(True, "-", "q1", "q1b"), Pair(True, "-", "q2", "q2b"),
             Pair(False, "-", "q3", "q4")]
    said = {"q1": "Paris.", "q1b": "paris", "q2": "It costs 5 dollars.", "q2b": "It costs 7 dollars.",
            "q3": "Open at 9 am.", "q4": "Closed on Sunday at 5 pm."}
    r = rates(pairs, said, HashingEmbedder(), 0.8)
    # a paraphrase pair with other numbers in its answers counts as a false "wrong"
    assert r == JudgeRates(false_wrong=0.5, true_wrong=1.0, same=2, diff=1)


def test_written_calibration_is_what_the_budget_uses(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "judge.json"
    write(path, "tiny-model", 0.8, JudgeRates(0.3, 0.9, 10, 12), "tiny", 48)
    monkeypatch.setattr(judge, "CALIBRATION", path)
    judge._measured.cache_clear()  # judge.json is read once
    try:
        model = ModelConfig(name="t", bundled="tiny-model")
        assert judge.errors_for(model, 0.8) == JudgeErrors(0.3, 0.9)
        assert json.loads(path.read_text())["models"]["tiny-model"]["same_pairs"] == 10
    finally:
        judge._measured.cache_clear()  # judge.json is read once


async def test_the_questions_judge_asks_each_pair_once_and_picks_its_cut() -> None:
    """`--judge questions`: one token with top-20 logprobs per pair, greedy, the cache
    bypassed; the log-odds read from them; the cut chosen where the separation is widest;
    a pair with no yes or no never counts as called wrong."""
    seen: list[dict[str, object]] = []
    # the judge's log-odds of yes: paraphrases high, near misses low, one of each wrong side
    odds = {"p1": 2.0, "p2": 1.0, "p3": -3.0, "d1": -2.0, "d2": -1.5, "d3": 1.5}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        tag = str(body["messages"][-1]["content"]).split("Question B: ")[1].split("\n")[0]
        if tag == "none":
            top = [{"token": "Maybe", "logprob": -0.1}]
        else:
            top = [{"token": "Yes", "logprob": odds[tag] / 2}, {"token": "No", "logprob": -odds[tag] / 2}]
        return httpx.Response(200, json={"choices": [{"logprobs": {"content": [
            {"token": top[0]["token"], "logprob": top[0]["logprob"], "top_logprobs": top}]}}]})

    pairs = [Pair(True, "paraphrase", "q", t) for t in ("p1", "p2", "p3")] + \
        [Pair(False, "order", "q", t) for t in ("d1", "d2", "d3", "none")]
    async with httpx.AsyncClient(base_url="http://x", transport=httpx.MockTransport(handler)) as c:
        got = await question_odds(c, "judge", pairs, concurrency=2)
    assert all(b["max_tokens"] == 1 and b["temperature"] == 0 and b["logprobs"] is True
               and b["top_logprobs"] == 20 for b in seen) and len(seen) == len(pairs)
    assert got[("q", "none")] is None
    assert all(abs(got[("q", t)] - o) < 1e-9 for t, o in odds.items())  # type: ignore[operator]
    cut = choose_cut(pairs, got)
    assert -1.5 < cut < 1.0  # between d2 and p2: p3 and d3 stay on the wrong side
    r = question_rates(pairs, got, cut)
    assert r == JudgeRates(false_wrong=1 / 3, true_wrong=2 / 4, same=3, diff=4)
