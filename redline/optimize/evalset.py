"""The fixed material every variant is measured on: held-out text for perplexity and
token agreement, and a small question set for answer agreement. Small on purpose, so a
whole ladder runs in minutes on two cores."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# shipped with the repository (bench/data/), next to the benchmark scripts
DATA_DIR = Path(__file__).resolve().parents[2] / "bench" / "data"


@dataclass(frozen=True)
class Question:
    question: str
    answers: tuple[str, ...]  # lower-case; any of them in the answer counts as correct


@dataclass(frozen=True)
class EvalSet:
    heldout: str
    questions: tuple[Question, ...]
    window: int = 256  # tokens per perplexity window (each window starts a fresh context)
    max_windows: int = 8  # ~2k tokens of text
    answer_tokens: int = 16


def load_evalset(heldout: Path | None = None, questions: Path | None = None,
                 **limits: int) -> EvalSet:
    heldout = heldout or DATA_DIR / "heldout.txt"
    questions = questions or DATA_DIR / "questions.jsonl"
    if not heldout.exists() or not questions.exists():
        raise FileNotFoundError(f"evaluation data missing: {heldout}, {questions}")
    qs = []
    for n, line in enumerate(questions.read_text().splitlines(), 1):
        if not line.strip():
            continue
        obj = json.loads(line)
        if not obj.get("question") or not obj.get("answers"):
            raise ValueError(f"{questions}:{n}: needs `question` and `answers`")
        qs.append(Question(obj["question"], tuple(a.lower() for a in obj["answers"])))
    return EvalSet(heldout.read_text(), tuple(qs), **limits)
