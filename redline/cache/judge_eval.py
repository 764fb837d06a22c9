"""How often the error budget's judge errs on one model's answers (`redline eval-judge`).

For every question of the labelled pairs the model answers (temperature 0, through any
OpenAI-compatible server, redline's cache bypassed); the judge (judge.py) then compares
the two answers of each pair, as a shadow check compares the served and the fresh answer:
- `false_wrong`: the share of paraphrase pairs ("same") whose answers it calls different:
  right hits it would count as wrong;
- `true_wrong`: the share of different-question pairs ("diff") it calls different.
Reported on the tuning part and on the test part apart; `--write` keeps the tuning part's
rates for a bundled model in data/judge.json (the test part is only reported).

`--judge questions` measures the other judge the same way: the model is asked of each
pair whether its two questions are the same (judge.question_messages, one token, its
log-odds of yes over no); the cut is chosen on the tuning part (the widest separation)
and only applied to the test part.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from redline.cache import judge
from redline.cache.embedder import Embedder
from redline.cache.evaluate import Pair
from redline.types import TopLogprob


@dataclass(frozen=True)
class JudgeRates:
    false_wrong: float  # of "same" pairs, called wrong
    true_wrong: float  # of "diff" pairs, called wrong
    same: int
    diff: int


async def answers(client: httpx.AsyncClient, model: str, questions: Sequence[str],
                  max_tokens: int, concurrency: int = 4) -> dict[str, str]:
    """The model's answer to each question (greedy; a cache in front is bypassed)."""
    gate = asyncio.Semaphore(concurrency)
    out: dict[str, str] = {}

    async def one(question: str) -> None:
        async with gate:
            r = await client.post("/v1/chat/completions", headers={"Cache-Control": "no-cache"},
                                  json={"model": model, "temperature": 0, "max_tokens": max_tokens,
                                        "messages": [{"role": "user", "content": question}]})
            r.raise_for_status()
            out[question] = r.json()["choices"][0]["message"]["content"] or ""

    await asyncio.gather(*(one(q) for q in questions))
    return out


def _tally(pairs: Sequence[Pair], called_wrong: Callable[[Pair], bool]) -> JudgeRates:
    wrong = {True: 0, False: 0}
    count = {True: 0, False: 0}
    for p in pairs:
        count[p.same] += 1
        wrong[p.same] += called_wrong(p)
    return JudgeRates(wrong[True] / max(1, count[True]), wrong[False] / max(1, count[False]),
                      count[True], count[False])


def rates(pairs: Sequence[Pair], said: dict[str, str], embedder: Embedder,
          agreement: float) -> JudgeRates:
    return _tally(pairs, lambda p: judge.wrong(said[p.a], said[p.b], embedder, agreement))


def table(parts: dict[str, JudgeRates]) -> str:
    """The rates of each part as a markdown table."""
    rows = ["| part | same pairs | judged wrong (false_wrong) | diff pairs | judged wrong "
            "(true_wrong) | separation |", "|---|---|---|---|---|---|"]
    rows += [f"| {name} | {r.same} | {r.false_wrong:.3f} | {r.diff} | {r.true_wrong:.3f} | "
             f"{r.true_wrong - r.false_wrong:+.3f} |" for name, r in parts.items()]
    return "\n".join(rows)


def _keep(path: Path, section: str, bundled: str, tune: JudgeRates, **more: object) -> None:
    """Keep the tuning part's rates for a bundled model in one section of judge.json."""
    data = json.loads(path.read_text()) if path.exists() else {"models": {}}
    data.setdefault(section, {})[bundled] = {
        "false_wrong": round(tune.false_wrong, 4), "true_wrong": round(tune.true_wrong, 4),
        "same_pairs": tune.same, "diff_pairs": tune.diff, **more,
        "measured_on": "the tuning part (bench/data/cache_pairs.tsv, cache_pairs_tune.tsv)"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def write(path: Path, bundled: str, agreement: float, tune: JudgeRates, model: str,
          max_tokens: int) -> None:
    _keep(path, "models", bundled, tune, agreement=agreement, served_as=model,
          max_tokens=max_tokens)


async def question_odds(client: httpx.AsyncClient, model: str, pairs: Sequence[Pair],
                        concurrency: int = 2) -> dict[tuple[str, str], float | None]:
    """The questions judge's log-odds for each pair (a as the cached question, b as the
    one asked); None where the model gave neither yes nor no in its top 20."""
    gate = asyncio.Semaphore(concurrency)
    out: dict[tuple[str, str], float | None] = {}

    async def one(p: Pair) -> None:
        messages = [{"role": m.role, "content": m.content}
                    for m in judge.question_messages(p.a, p.b)]
        async with gate:
            r = await client.post("/v1/chat/completions", headers={"Cache-Control": "no-cache"},
                                  json={"model": model, "temperature": 0, "max_tokens": 1,
                                        "logprobs": True, "top_logprobs": 20,
                                        "messages": messages})
            r.raise_for_status()
            content = (r.json()["choices"][0].get("logprobs") or {}).get("content") or []
            top = [TopLogprob(t["token"], t["logprob"]) for t in
                   (content[0].get("top_logprobs") or [] if content else [])]
            out[(p.a, p.b)] = judge.yes_log_odds(top)

    await asyncio.gather(*(one(p) for p in pairs))
    return out


def question_rates(pairs: Sequence[Pair], odds: dict[tuple[str, str], float | None],
                   threshold: float) -> JudgeRates:
    """As `rates`, for the questions judge at `threshold` (a pair with no verdict counts
    as not called wrong, as a live check with none moves nothing)."""
    def called_wrong(p: Pair) -> bool:
        o = odds.get((p.a, p.b))
        return o is not None and o < threshold

    return _tally(pairs, called_wrong)


def choose_cut(pairs: Sequence[Pair], odds: dict[tuple[str, str], float | None]) -> float:
    """The cut with the widest separation (true_wrong - false_wrong) on `pairs`."""
    seen = sorted({o for o in odds.values() if o is not None})
    cuts = [(a + b) / 2 for a, b in zip(seen, seen[1:], strict=False)] or [0.0]

    def separation(cut: float) -> float:
        r = question_rates(pairs, odds, cut)
        return r.true_wrong - r.false_wrong

    best: float = max(cuts, key=separation)
    return round(best, 3)


def write_questions(path: Path, bundled: str, threshold: float, tune: JudgeRates,
                    model: str) -> None:
    _keep(path, "questions", bundled, tune, threshold=threshold, served_as=model)
