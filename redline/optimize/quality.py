"""Quality of a variant against its reference: perplexity, greedy-token agreement on
held-out text, and answer accuracy and agreement on the question set."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from redline.optimize.evalset import EvalSet, Question
from redline.optimize.runner import ModelRunner, TokenScores


@dataclass
class Quality:
    perplexity: float
    tokens_scored: int
    top1_agreement: float | None  # share of positions whose greedy token matches the reference
    accuracy: float  # share of questions answered correctly
    answer_agreement: float | None  # share of answers identical (normalised) to the reference's
    answers: list[str] = field(default_factory=list)


def windows(ids: Sequence[int], ev: EvalSet) -> list[list[int]]:
    out = [list(ids[i:i + ev.window]) for i in range(0, len(ids), ev.window)]
    out = [w for w in out if len(w) >= 16]  # a ragged tail scores too few tokens to matter
    return out[:ev.max_windows]


def score_text(runner: ModelRunner, ids: Sequence[int], ev: EvalSet) -> TokenScores:
    return TokenScores.concat([runner.score(w) for w in windows(ids, ev)])


def perplexity(scores: TokenScores) -> float:
    return math.exp(float(scores.nll.mean()))


def normalise(answer: str) -> str:
    text = answer.strip().lower()
    text = re.sub(r"[^\w\s-]", " ", text)
    text = re.sub(r"^(the|a|an)\s+", "", text.strip())
    return " ".join(text.split())


def is_correct(answer: str, q: Question) -> bool:
    text = f" {normalise(answer)} "
    return any(f" {normalise(a)} " in text for a in q.answers)


def measure(runner: ModelRunner, ids: Sequence[int], ev: EvalSet,
            reference: tuple[TokenScores, list[str]] | None = None) -> tuple[Quality, TokenScores]:
    """Measure one runner; with `reference` (its scores and answers) also the agreement."""
    scores = score_text(runner, ids, ev)
    answers = runner.answer([q.question for q in ev.questions], ev.answer_tokens)
    accuracy = sum(is_correct(a, q) for a, q in zip(answers, ev.questions, strict=True)) / len(answers)
    top1 = agree = None
    if reference is not None:
        ref_scores, ref_answers = reference
        top1 = float((scores.top1 == ref_scores.top1).mean())
        agree = sum(normalise(a) == normalise(b) for a, b in zip(answers, ref_answers, strict=True)
                    ) / len(answers)
    quality = Quality(perplexity(scores), int(scores.nll.size), top1, accuracy, agree, answers)
    return quality, scores
