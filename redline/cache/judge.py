"""Is a semantic hit wrong? The judge compares the answer the cache served with the
answer the model gives to the question that was actually asked (the same model, the same
sampling: what the user would have got without the cache).

    wrong(served, fresh, embedder, agreement) → bool

Why this is a fair judge of "wrong hit": for a greedy request the model's answer to the
cached question *is* the cached answer, so when the two questions mean the same the two
answers differ only where the model is sensitive to wording. The answers agree when
- they are the same text up to case, spacing and punctuation, or
- they state the same facts the guard compares in questions (numbers, times, units), and
- their embeddings are at least `agreement` similar (meaning, not wording).
It errs towards "wrong": an answer that is right but worded very differently counts as a
wrong hit, which only makes the cache more careful (the budget tightens), never serves
more wrong answers. For sampled requests (`cache_sampled`) the fresh answer is one draw,
and the judge is as noisy as the sampling.

A second judge (`cache.judge: questions`) asks a model instead whether the question
asked and the cached question ask for the same thing (yes/no, read from its log-odds at
the first token of the answer): it needs no answer generated, and a chat model that
cannot write the same answer twice may still tell two questions apart
(`question_messages`, `yes_log_odds`; a "no" below `judge_threshold` is a wrong hit).

How often it errs depends on the model: `redline eval-judge` measures it on labelled
pairs (the share of paraphrase pairs whose two answers it calls different, and of
different-question pairs), and the error budget corrects its estimate by those rates
(error_budget.py). `errors_for` gives a model's: set in its config, else the bundled
model's measured values (`data/judge.json`, written from the tuning part only), else none
(the judge taken at its word).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from redline.cache import guard
from redline.cache.embedder import Embedder
from redline.cache.error_budget import PERFECT, JudgeErrors
from redline.types import Message, TopLogprob

if TYPE_CHECKING:
    from redline.config import CacheConfig, ModelConfig

CALIBRATION = Path(__file__).resolve().parent / "data" / "judge.json"

_PUNCT = re.compile(r"[^\w\s]+")


def _plain(text: str) -> str:
    return " ".join(_PUNCT.sub(" ", text.casefold()).split())


def facts(text: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    f = guard.features(text)
    return f.numbers, f.times, f.units


def wrong(served: str, fresh: str, embedder: Embedder, agreement: float) -> bool:
    if _plain(served) == _plain(fresh):
        return False
    if facts(served) != facts(fresh):
        return True
    rows = np.asarray(embedder.encode([served, fresh]), dtype=np.float32)  # [2, dim], unit rows
    return float(rows[0] @ rows[1]) < agreement


@functools.cache
def _measured(section: str) -> dict[str, dict[str, float]]:
    """One section of data/judge.json, by bundled model name ({} without it)."""
    try:
        data: dict[str, dict[str, float]] = json.loads(CALIBRATION.read_text())[section]
    except (OSError, ValueError, KeyError):
        return {}
    return data


def calibration() -> dict[str, dict[str, float]]:
    """Bundled models' measured judge errors, by bundled name (and the agreement used)."""
    return _measured("models")


def errors_for(model: ModelConfig, agreement: float) -> JudgeErrors:
    """The judge's error rates on `model`'s answers at `agreement`."""
    if model.judge_false_wrong is not None or model.judge_true_wrong is not None:
        return JudgeErrors(model.judge_false_wrong or 0.0,
                           1.0 if model.judge_true_wrong is None else model.judge_true_wrong)
    measured = calibration().get(model.bundled or "")
    if measured is not None and abs(measured["agreement"] - agreement) < 1e-9:
        return JudgeErrors(measured["false_wrong"], measured["true_wrong"])
    return PERFECT


def errors_by_model(models: Iterable[ModelConfig], agreement: float) -> dict[str, JudgeErrors]:
    return {m.name: errors_for(m, agreement) for m in models}


# ---- the questions judge ---------------------------------------------------------
QUESTIONS_SYSTEM = "You judge whether two user questions are duplicates."


def question_messages(cached: str, asked: str) -> tuple[Message, ...]:
    """The judge model's prompt: is `asked` the same question as `cached`?"""
    return (Message("system", QUESTIONS_SYSTEM),
            Message("user", f"Question A: {cached}\nQuestion B: {asked}\nDo A and B ask for "
                            "exactly the same information, so that one answer serves both? "
                            "Answer yes or no."))


def yes_log_odds(top: Iterable[TopLogprob]) -> float | None:
    """log P(yes) - log P(no) at the answer's first token, from its top alternatives (any
    case or spacing of yes / no); a word missing from them counts at the least likely
    one's probability. None when neither is there."""
    top = list(top)
    yes = [t.logprob for t in top if t.token.strip().casefold() == "yes"]
    no = [t.logprob for t in top if t.token.strip().casefold() == "no"]
    if not top or not (yes or no):
        return None
    floor = min(t.logprob for t in top)
    return float(np.logaddexp.reduce(yes or [floor]) - np.logaddexp.reduce(no or [floor]))


def question_calibration() -> dict[str, dict[str, float]]:
    """Judge models' measured threshold and errors as the questions judge, by bundled name."""
    return _measured("questions")


@dataclass(frozen=True)
class QuestionJudge:
    model: str  # the model asked
    threshold: float  # log-odds of yes over no below this: a wrong hit
    errors: JudgeErrors


def question_judge(cfg: CacheConfig, models: Sequence[ModelConfig]) -> QuestionJudge | None:
    """The questions judge for `cfg` (None unless `judge: questions` and a chat model is
    there): `judge_model`, else the largest local chat model, else the largest chat model;
    its cut and error rates from the config, else the bundled model's measured ones, else
    a cut of 0 and taken at its word."""
    if cfg.judge != "questions":
        return None
    chat = [m for m in models if "chat" in m.effective_capabilities()]
    local = [m for m in chat if m.backend == "local"]
    named = [m for m in models if m.name == cfg.judge_model]
    pool = named or ([] if cfg.judge_model else local or chat)
    model = max(pool, key=lambda m: m.size_rank) if pool else None
    if model is None and not cfg.judge_model:
        return None
    measured = question_calibration().get(model.bundled or "", {}) if model else {}
    threshold = cfg.judge_threshold if cfg.judge_threshold is not None \
        else measured.get("threshold", 0.0)
    if cfg.judge_false_wrong is not None or cfg.judge_true_wrong is not None:
        errors = JudgeErrors(cfg.judge_false_wrong or 0.0,
                             1.0 if cfg.judge_true_wrong is None else cfg.judge_true_wrong)
    elif measured and abs(measured["threshold"] - threshold) < 1e-9:
        errors = JudgeErrors(measured["false_wrong"], measured["true_wrong"])
    else:
        errors = PERFECT
    return QuestionJudge(model.name if model else str(cfg.judge_model), threshold, errors)
