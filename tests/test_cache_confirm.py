"""The borderline check (cache/confirm.py): a candidate under the threshold is served only
when the stronger embedder confirms it; fakes with chosen similarities, and the real
all-MiniLM-L6-v2 + all-mpnet-base-v2 pair in the slow tests."""

from __future__ import annotations

import hashlib
import io
import logging
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest

from redline.cache import CachedAnswer, ResponseCache, bundled
from redline.cache.confirm import VECTOR, load_model
from redline.cache.evaluate import Pair, choose_confirm, score, similarities
from redline.cache.response_cache import accepts
from redline.config import CacheConfig
from redline.store.memory import MemoryStore
from redline.types import GenerationRequest, Message, SamplingParams

CACHED = "How do I return an item?"


class Table:
    """A fake embedder: each question's cosine to CACHED is chosen (the others are
    orthogonal to each other); it counts what it was asked to encode."""

    def __init__(self, to_cached: dict[str, float], dim: int = 16) -> None:
        self.dim = dim
        self.rows = {CACHED: np.eye(dim, dtype=np.float32)[0]}
        for i, (text, s) in enumerate(to_cached.items(), start=1):
            self.rows[text] = np.zeros(dim, dtype=np.float32)
            self.rows[text][0], self.rows[text][i] = s, math.sqrt(1 - s * s)
        self.encoded: list[str] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.encoded += texts
        return np.stack([self.rows[t] for t in texts])


# question: (search similarity to CACHED, the stronger model's)
QUESTIONS = {
    "Can I send back something I bought?": (0.60, 0.80),  # borderline, confirmed
    "Can I send back something I sold?": (0.60, 0.50),  # borderline, not confirmed
    "What is a good pasta recipe?": (0.30, 0.95),  # under the floor: never checked
    "how do i return an item": (0.90, 0.20),  # over the threshold: the fast path
    "Can I return 3 items?": (0.60, 0.90),  # borderline, but the guard refuses (a number)
}
CFG = CacheConfig(similarity_threshold=0.70, confirm=True, confirm_floor=0.47, confirm_threshold=0.71)


def _req(text: str, rid: str) -> GenerationRequest:
    return GenerationRequest(model="m", id=rid, sampling=SamplingParams(temperature=0, max_tokens=4),
                             messages=(Message("user", text),))


async def _cache(cfg: CacheConfig = CFG, store: MemoryStore | None = None,
                 backends: dict[str, object] | None = None) -> tuple[ResponseCache, Table, Table]:
    search = Table({q: s for q, (s, _) in QUESTIONS.items()})
    strong = Table({q: s for q, (_, s) in QUESTIONS.items()})
    cache = ResponseCache(cfg, store or MemoryStore(), embedder=search, confirm_embedder=strong,
                          backends=backends)  # type: ignore[arg-type]
    await cache.start()
    await cache.put(_req(CACHED, "put"), CachedAnswer("m", "Within 30 days.", "stop", 5, 3, None, 0))
    return cache, search, strong


def test_the_rule() -> None:
    q, c = "Can I send back something I bought?", CACHED
    assert accepts(CFG, q, c, 0.75)  # the fast path needs no second opinion
    assert not accepts(CFG, q, c, 0.60)  # borderline, not checked (no second model)
    assert accepts(CFG, q, c, 0.60, confirmed=0.71)
    assert not accepts(CFG, q, c, 0.60, confirmed=0.70)
    assert not accepts(CFG, q, c, 0.46, confirmed=0.99)  # under the floor
    assert not accepts(CFG.model_copy(update={"confirm": False}), q, c, 0.60, confirmed=0.99)
    assert not accepts(CFG, "Can I return 3 items?", c, 0.60, confirmed=0.99)  # the guard still


async def test_a_confirmed_borderline_candidate_is_served_and_an_unconfirmed_one_is_not() -> None:
    cache, _, strong = await _cache()
    assert strong.encoded == [CACHED]  # the entry's vector was made at insert, and kept
    assert any(k.startswith(VECTOR) for k in cache.store._data)  # type: ignore[attr-defined]
    hit = await cache.lookup(_req("Can I send back something I bought?", "r1"))
    assert hit.result == "semantic" and hit.answer is not None and hit.answer.text == "Within 30 days."
    assert hit.similarity == pytest.approx(0.60, abs=1e-4)
    assert strong.encoded == [CACHED, "Can I send back something I bought?"]  # not the entry again
    assert (await cache.lookup(_req("Can I send back something I sold?", "r2"))).result == "miss"
    assert strong.encoded[-1] == "Can I send back something I sold?"  # checked, and refused
    await cache.close()


async def test_the_second_model_runs_only_for_borderline_candidates_the_guard_allows() -> None:
    cache, _, strong = await _cache()
    for i, q in enumerate(("What is a good pasta recipe?", "Can I return 3 items?")):
        assert (await cache.lookup(_req(q, f"m{i}"))).result == "miss"
    assert (await cache.lookup(_req("how do i return an item", "f"))).result == "semantic"
    assert strong.encoded == [CACHED]  # none of the three needed it
    await cache.close()


async def test_without_the_second_model_hits_need_the_threshold(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="redline.cache.confirm"):
        assert load_model(CFG.model_copy(update={"confirm_path": "/nonexistent/model"})) is None
    assert "borderline check off" in caplog.text
    assert load_model(CFG.model_copy(update={"confirm": False})) is None
    search = Table({q: s for q, (s, _) in QUESTIONS.items()})
    cache = ResponseCache(CFG, MemoryStore(), embedder=search)  # no model given: no check
    await cache.start()
    assert cache.confirmer is None
    await cache.put(_req(CACHED, "put"), CachedAnswer("m", "Within 30 days.", "stop", 5, 3, None, 0))
    assert (await cache.lookup(_req("Can I send back something I bought?", "r"))).result == "miss"
    assert (await cache.lookup(_req("how do i return an item", "f"))).result == "semantic"
    await cache.close()


async def test_an_entry_stored_without_its_vector_is_embedded_at_lookup() -> None:
    cache, _, strong = await _cache()
    key = next(k for k in cache.store._data if k.startswith(VECTOR))  # type: ignore[attr-defined]
    await cache.store.delete(key)  # as if stored by a replica without the second model
    hit = await cache.lookup(_req("Can I send back something I bought?", "r"))
    assert hit.result == "semantic"
    assert strong.encoded.count(CACHED) == 2 and await cache.store.get(key) is not None
    await cache.close()


async def test_eviction_forgets_the_vector() -> None:
    cache, _, _ = await _cache(CFG.model_copy(update={"max_entries": 1}))
    assert any(k.startswith(VECTOR) for k in cache.store._data)  # type: ignore[attr-defined]
    await cache.put(_req("how do i return an item", "p2"), CachedAnswer("m", "x", "stop", 1, 1, None, 0))
    vectors = [k for k in cache.store._data if k.startswith(VECTOR)]  # type: ignore[attr-defined]
    assert len(vectors) == 1  # the evicted entry's went with it
    await cache.close()


async def test_no_borderline_hits_once_the_error_budget_has_tightened() -> None:
    cache, _, strong = await _cache(backends={})
    assert cache.verifier is not None
    cache.verifier.budget.threshold = 0.72  # the live wrong-hit rate was over the budget
    assert (await cache.lookup(_req("Can I send back something I bought?", "r"))).result == "miss"
    assert strong.encoded == [CACHED]
    cache.verifier.budget.threshold = CFG.similarity_threshold
    assert (await cache.lookup(_req("Can I send back something I bought?", "r2"))).result == "semantic"
    await cache.close()


def test_eval_scores_the_check_and_choose_confirm_picks_the_band(tmp_path: Path) -> None:
    pairs = [Pair(True, "paraphrase", CACHED, "Can I send back something I bought?"),
             Pair(False, "topic", CACHED, "Can I send back something I sold?"),
             Pair(True, "paraphrase", CACHED, "how do i return an item")]
    search = Table({q: s for q, (s, _) in QUESTIONS.items()})
    strong = Table({q: s for q, (_, s) in QUESTIONS.items()})
    sims = similarities(pairs, search, strong)
    assert sims.shape == (3, 2)
    assert score(pairs, sims, CFG).right_hits == 2 and score(pairs, sims, CFG).hits == 2
    assert score(pairs, sims[:, 0], CFG).hits == 1  # no second model: the fast path only
    tune = tmp_path / "pairs.tsv"
    tune.write_text("".join(f"{'same' if p.same else 'diff'}\t{p.a}\t{p.b}\n" for p in pairs))
    floor, bar, s = choose_confirm(CFG, search, strong, 1.0, tune_files=(tune,))
    assert s.precision == 1.0 and s.recall == 1.0
    assert floor == 0.60 and 0.51 <= bar <= 0.80  # the highest floor, a bar between the two


def test_the_bundled_model_is_assembled_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{bundled.MPNET}/modules.json", "[]")
    data = buf.getvalue()
    parts = []
    for i in range(3):
        parts.append(tmp_path / f"part{i}")
        parts[-1].write_bytes(data[i * len(data) // 3:(i + 1) * len(data) // 3])
    monkeypatch.setattr(bundled, "_parts", lambda: parts)
    monkeypatch.setattr(bundled, "MPNET_ZIP_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="sha256"):
        bundled.mpnet_path(tmp_path / "models")
    assert not (tmp_path / "models" / bundled.MPNET).exists()
    monkeypatch.setattr(bundled, "MPNET_ZIP_SHA256", hashlib.sha256(data).hexdigest())
    path = bundled.mpnet_path(tmp_path / "models")
    assert (path / "modules.json").read_text() == "[]"
    assert [p.name for p in (tmp_path / "models").iterdir()] == [bundled.MPNET]  # no leftovers


# -- the real models --------------------------------------------------------------------
ACCEPTED = [("do u ship internationally", "Can you send orders to other countries?"),
            ("how long is the guarantee on your products", "What warranty period do your goods come with?")]
REJECTED = [("how much does a passport cost", "how long does a passport take to arrive"),
            ("what are the side effects of the covid vaccine", "how effective is the covid vaccine")]


@pytest.mark.slow
@pytest.mark.parametrize(("cached", "asked", "served"),
                         [(*p, True) for p in ACCEPTED] + [(*p, False) for p in REJECTED])
async def test_real_models_confirm_a_paraphrase_and_refuse_a_near_miss(
        cached: str, asked: str, served: bool) -> None:
    from redline.cache.embedder import load_minilm

    cfg = CacheConfig()  # the defaults, check on
    cfg = cfg.model_copy(update={"confirm": True})
    strong = load_model(cfg, 1)
    assert strong is not None, "all-mpnet-base-v2 is not installed (make install)"
    search = load_minilm(None, 1)
    rows = search.encode([cached, asked])
    similarity = float(rows[0] @ rows[1])
    assert cfg.confirm_floor <= similarity < cfg.similarity_threshold  # borderline in MiniLM
    cache = ResponseCache(cfg, MemoryStore(), embedder=search, confirm_embedder=strong)
    await cache.start()
    await cache.put(_req(cached, "put"), CachedAnswer("m", "the answer", "stop", 5, 2, None, 0))
    out = await cache.lookup(_req(asked, "ask"))
    assert out.result == ("semantic" if served else "miss")
    await cache.close()
