"""`redline eval-cache [PAIRS.tsv]`: how often the semantic cache would serve a right and
a wrong answer, on labelled question pairs. Without a file: the tuning part and the test
part of the repository's labelled pairs side by side (README: "Labelled data").

PAIRS.tsv, tab-separated, no quoting, one of:
- a header `label<TAB>kind<TAB>question_a<TAB>question_b` (or `label<TAB>question_a<TAB>question_b`)
  and rows of those fields;
- no header, rows `label<TAB>question_a<TAB>question_b` (kind `-`).
label `same` (one answer fits both) or `diff` (a near miss: another number, name, time...).
Question A plays the cached question and B the new one; a pair is a semantic hit when
`accepts()` (threshold, borderline check, guard: exactly as served) lets B take A's answer.

precision = right hits / hits; recall = right hits / `same` pairs;
wrong-hit rate = wrong hits / hits (GPTCache's "wrong answer on x% of hits").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from redline.cache import guard
from redline.cache.embedder import Embedder
from redline.cache.response_cache import accepts
from redline.config import CacheConfig


@dataclass(frozen=True)
class Pair:
    same: bool
    kind: str
    a: str
    b: str


@dataclass
class Scores:
    threshold: float
    guard: bool
    hits: int
    right_hits: int
    same_pairs: int
    wrong_by_kind: dict[str, int]

    @property
    def precision(self) -> float:
        return self.right_hits / self.hits if self.hits else 1.0

    @property
    def recall(self) -> float:
        return self.right_hits / self.same_pairs if self.same_pairs else 0.0

    @property
    def wrong_hit_rate(self) -> float:
        return 1.0 - self.precision


ROOT = Path(__file__).resolve().parent.parent.parent
TUNE_PAIRS = (ROOT / "bench" / "data" / "cache_pairs.tsv", ROOT / "bench" / "data" / "cache_pairs_tune.tsv")
TEST_PAIRS = ROOT / "bench" / "data" / "cache_pairs_test.tsv"


def load_pairs(path: str | Path) -> list[Pair]:
    pairs = []
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    columns = ["label", "question_a", "question_b"]
    if lines and lines[0].split("\t")[0].strip().lower() == "label":
        columns = [c.strip().lower() for c in lines.pop(0).split("\t")]
    if columns not in (["label", "kind", "question_a", "question_b"], ["label", "question_a", "question_b"]):
        raise ValueError(f"{path}: columns must be label, [kind,] question_a, question_b")
    for n, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if len(fields) != len(columns):
            raise ValueError(f"{path}: row {n} has {len(fields)} fields, not {len(columns)}")
        row = dict(zip(columns, (f.strip() for f in fields), strict=True))
        label = row["label"].lower()
        if label not in ("same", "diff"):
            raise ValueError(f"{path}: label must be same or diff, not {label!r}")
        pairs.append(Pair(label == "same", row.get("kind", "-"), row["question_a"], row["question_b"]))
    if not pairs:
        raise ValueError(f"{path}: no pairs")
    return pairs


def _cosines(pairs: list[Pair], embedder: Embedder) -> np.ndarray:
    texts = sorted({q for p in pairs for q in (p.a, p.b)})
    vectors = dict(zip(texts, embedder.encode(texts), strict=True))
    return np.array([float(vectors[p.a] @ vectors[p.b]) for p in pairs])


def similarities(pairs: list[Pair], embedder: Embedder,
                 confirm: Embedder | None = None) -> np.ndarray:
    """[len(pairs), 2]: each pair's cosine in the search embedder, and in the borderline
    check's embedder (NaN without one: the check is then never passed, as served)."""
    out = np.full((len(pairs), 2), np.nan)
    out[:, 0] = _cosines(pairs, embedder)
    if confirm is not None:
        out[:, 1] = _cosines(pairs, confirm)
    return out


def _columns(sims: np.ndarray) -> np.ndarray:
    """Accept a plain [n] vector of search similarities too."""
    sims = np.asarray(sims, dtype=float)
    if sims.ndim == 1:
        sims = np.stack([sims, np.full_like(sims, np.nan)], axis=1)
    return sims


def score(pairs: list[Pair], sims: np.ndarray, cfg: CacheConfig) -> Scores:
    hits = right = 0
    wrong: Counter[str] = Counter()
    for pair, (sim, strong) in zip(pairs, _columns(sims), strict=True):
        confirmed = None if np.isnan(strong) else float(strong)
        if accepts(cfg, pair.b, pair.a, float(sim), confirmed):
            hits += 1
            if pair.same:
                right += 1
            else:
                wrong[pair.kind] += 1
    return Scores(cfg.similarity_threshold, cfg.guard, hits, right,
                  sum(p.same for p in pairs), dict(wrong))


def report(pairs: list[Pair], sims: np.ndarray, cfg: CacheConfig, sweep: bool = False) -> str:
    kinds = Counter(p.kind for p in pairs)
    lines = [f"{len(pairs)} pairs: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))]
    rows = [cfg, cfg.model_copy(update={"guard": not cfg.guard})]
    if sweep:
        rows += [cfg.model_copy(update={"similarity_threshold": t, "guard": g})
                 for g in (True, False) for t in np.arange(0.70, 0.981, 0.02)]
    lines.append(f"{'threshold':>9} {'guard':>5} {'hits':>5} {'precision':>9} {'recall':>6} "
                 f"{'wrong-hit rate':>14}  wrong hits by kind")
    for i, c in enumerate(rows):
        s = score(pairs, sims, c)
        mark = "  <- configured" if i == 0 else ""
        lines.append(f"{s.threshold:>9.2f} {'on' if s.guard else 'off':>5} {s.hits:>5} "
                     f"{s.precision:>9.3f} {s.recall:>6.3f} {s.wrong_hit_rate:>14.3f}  "
                     f"{s.wrong_by_kind or '-'}{mark}")
    return "\n".join(lines)


def split_report(tune: list[Pair], tune_sims: np.ndarray, test: list[Pair], test_sims: np.ndarray,
                 cfg: CacheConfig, thresholds: Sequence[float] = (0.6, 0.8)) -> str:
    """The tuning part's and the test part's figures side by side: the configured settings,
    two other thresholds, and the configured settings with the borderline check, then the
    guard, switched."""
    lines = [f"tuning part: {len(tune)} pairs ({sum(p.same for p in tune)} same); "
             f"test part: {len(test)} pairs ({sum(p.same for p in test)} same)",
             f"{'threshold':>9} {'guard':>5} {'confirm':>7} | "
             f"{'tune: precision':>15} {'recall':>6} {'hits':>4} | "
             f"{'TEST: precision':>15} {'recall':>6} {'hits':>4}  test wrong hits by kind"]
    rows = [cfg] + [cfg.model_copy(update={"similarity_threshold": t}) for t in thresholds
                    if abs(t - cfg.similarity_threshold) > 1e-9]
    rows.append(cfg.model_copy(update={"confirm": not cfg.confirm}))
    rows.append(cfg.model_copy(update={"guard": not cfg.guard}))
    checked = not np.isnan(_columns(tune_sims)[:, 1]).all()
    if cfg.confirm:
        lines.insert(0, f"borderline check: {cfg.confirm_floor:.2f} <= similarity < threshold, "
                     f"confirmed at {cfg.confirm_threshold:.2f}"
                     + ("" if checked else " (its model is not loaded: never passed)"))
    for i, c in enumerate(rows):
        a, b = score(tune, tune_sims, c), score(test, test_sims, c)
        mark = "  <- configured" if i == 0 else ""
        lines.append(f"{c.similarity_threshold:>9.2f} {'on' if c.guard else 'off':>5} "
                     f"{'on' if c.confirm else 'off':>7} | "
                     f"{a.precision:>15.3f} {a.recall:>6.3f} {a.hits:>4} | "
                     f"{b.precision:>15.3f} {b.recall:>6.3f} {b.hits:>4}  {b.wrong_by_kind or '-'}{mark}")
    return "\n".join(lines)


def choose_threshold(cfg: CacheConfig, embedder: Embedder, min_precision: float = 0.98,
                     tune_files: Sequence[Path] = TUNE_PAIRS) -> tuple[float, Scores]:
    """The tuning step: the lowest threshold (most recall) whose precision on the tuning
    part, guard as configured, is at least `min_precision`. Reads the tuning files only."""
    pairs = [p for path in tune_files for p in load_pairs(path)]
    sims = similarities(pairs, embedder)
    best: tuple[float, Scores] | None = None
    for t in np.arange(0.98, 0.499, -0.01):
        s = score(pairs, sims, cfg.model_copy(update={"similarity_threshold": round(float(t), 2)}))
        if s.precision >= min_precision:
            best = (round(float(t), 2), s)
    if best is None:
        raise ValueError(f"no threshold reaches precision {min_precision} on the tuning part")
    return best


def choose_confirm(cfg: CacheConfig, embedder: Embedder, confirm: Embedder,
                   min_precision: float = 0.98,
                   tune_files: Sequence[Path] = TUNE_PAIRS) -> tuple[float, float, Scores]:
    """The tuning step of the borderline check, at the configured similarity threshold:
    the (confirm_floor, confirm_threshold) with the most recall at precision >=
    `min_precision` on the tuning part; among equals the highest floor (the fewest second
    embeddings), then the highest confirm threshold (the widest margin). Reads the tuning
    files only."""
    pairs = [p for path in tune_files for p in load_pairs(path)]
    sims = similarities(pairs, embedder, confirm)
    same = np.array([p.same for p in pairs])
    allowed = np.array([not cfg.guard or guard.allows(p.b, p.a, float(s))
                        for p, s in zip(pairs, sims[:, 0], strict=True)])
    fast = allowed & (sims[:, 0] >= cfg.similarity_threshold)
    best: tuple[tuple[float, float, float], float, float] | None = None
    for floor in np.arange(0.30, cfg.similarity_threshold + 1e-9, 0.01):
        for bar in np.arange(0.50, 0.951, 0.01):
            hit = fast | (allowed & (sims[:, 0] >= floor) & (sims[:, 1] >= bar))
            n, right = int(hit.sum()), int((hit & same).sum())
            if n and right / n >= min_precision:
                rank = (right / max(1, int(same.sum())), floor, bar)
                if best is None or rank > best[0]:
                    best = (rank, round(float(floor), 2), round(float(bar), 2))
    if best is None:
        raise ValueError(f"no borderline check reaches precision {min_precision} on the tuning part")
    _, floor, bar = best
    chosen = cfg.model_copy(update={"confirm": True, "confirm_floor": floor, "confirm_threshold": bar})
    return floor, bar, score(pairs, sims, chosen)
