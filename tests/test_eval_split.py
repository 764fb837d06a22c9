"""The tuning/test split of the labelled data (issue 22) is fixed, disjoint, and never read
by a tuning step."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from redline.cache.embedder import HashingEmbedder
from redline.cache.evaluate import choose_confirm, choose_threshold, load_pairs, score, similarities
from redline.config import CacheConfig
from redline.routing.classifier import Classifier

ROOT = Path(__file__).resolve().parent.parent
CACHE_TEST = ROOT / "bench" / "data" / "cache_pairs_test.tsv"
ROUTER_TEST = ROOT / "bench" / "data" / "router_test.jsonl"
CACHE_TUNE = (ROOT / "bench" / "data" / "cache_pairs.tsv", ROOT / "bench" / "data" / "cache_pairs_tune.tsv")
ROUTER_TUNE = (ROOT / "redline" / "routing" / "data" / "labelled.jsonl",
               ROOT / "redline" / "routing" / "data" / "tune.jsonl")
TEST_PARTS = (CACHE_TEST, ROUTER_TEST)

# paths opened while a `watching()` block runs; one audit hook for the whole test process
# (audit hooks cannot be removed, so it only records while a block is active)
_OPENED: list[list[str]] = []


def _hook(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _OPENED and isinstance(args[0], (str, Path)):
        _OPENED[-1].append(str(Path(str(args[0])).resolve()))


sys.addaudithook(_hook)


@contextmanager
def watching() -> Iterator[list[str]]:
    opened: list[str] = []
    _OPENED.append(opened)
    try:
        yield opened
    finally:
        _OPENED.remove(opened)


def _readme_hash(name: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(re.escape(name) + r"`[^\n]*`([0-9a-f]{64})`", text)
    assert m, f"README.md gives no sha256 for {name}"
    return m.group(1)


@pytest.mark.parametrize("path", TEST_PARTS, ids=lambda p: p.name)
def test_the_test_parts_are_the_committed_ones(path: Path) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == _readme_hash(str(path.relative_to(ROOT))), \
        f"{path.name} changed since the split was committed: a test part is never edited"


def _questions(path: Path) -> set[str]:
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if line.strip()]
    return {" ".join(q.lower().rstrip("?").split()) for r in rows for q in r[-2:]}


def _prompts(path: Path) -> set[str]:
    return {json.loads(line)["text"].lower() for line in path.read_text().splitlines() if line.strip()}


def test_the_parts_share_no_question_or_prompt() -> None:
    tune_q = set().union(*(_questions(p) for p in CACHE_TUNE))
    assert not _questions(CACHE_TEST) & tune_q
    tune_p = set().union(*(_prompts(p) for p in ROUTER_TUNE))
    assert not _prompts(ROUTER_TEST) & tune_p
    assert len(_questions(CACHE_TEST)) >= 400 and len(_prompts(ROUTER_TEST)) >= 120


def test_the_watch_sees_a_test_part_being_read() -> None:
    # the check below can fail: reading a test part is seen
    with watching() as opened:
        CACHE_TEST.read_text()
    assert str(CACHE_TEST) in opened


def _assert_reads_no_test_part(step: Callable[[], object]) -> None:
    with watching() as opened:
        step()
    read = {str(p) for p in TEST_PARTS} & set(opened)
    assert not read, f"a tuning step read the test part: {read}"


def test_training_the_classifier_reads_no_test_part() -> None:
    _assert_reads_no_test_part(Classifier)


def test_choosing_the_cache_threshold_reads_no_test_part() -> None:
    cfg = CacheConfig()
    _assert_reads_no_test_part(lambda: choose_threshold(cfg, HashingEmbedder(), 0.9))


def test_choosing_the_borderline_check_reads_no_test_part() -> None:
    cfg = CacheConfig()
    _assert_reads_no_test_part(lambda: choose_confirm(cfg, HashingEmbedder(), HashingEmbedder(64), 0.5))


# The goal is precision >= 0.98 on the test part. Measured at the default settings
# (threshold 0.70 chosen on the tuning part, guard on): 0.977 (42 of 43 hits right), recall
# 0.442 -- just short, so the gate holds the line where it is and the goal stays open
# (docs/BENCHMARKS.md). Raise PRECISION_FLOOR to GOAL once a change reaches it.
GOAL = 0.98
PRECISION_FLOOR = 0.97
RECALL_FLOOR = 0.40


@pytest.mark.slow
def test_semantic_cache_on_the_test_part_keeps_its_precision() -> None:
    from redline.cache.confirm import load_model
    from redline.cache.embedder import load_minilm, resolve_dtype

    cfg = CacheConfig()  # as served: the borderline check too, when it is on by default
    pairs = load_pairs(CACHE_TEST)
    # as the server's cache runs it: traced, BF16 on this CPU
    fast = load_minilm(None, 0, resolve_dtype(cfg.embedder_dtype), traced=True)
    s = score(pairs, similarities(pairs, fast, load_model(cfg, 0)), cfg)
    print(f"test part: precision {s.precision:.3f} (goal {GOAL}), recall {s.recall:.3f}, "
          f"wrong hits {s.wrong_by_kind}")
    assert s.precision >= PRECISION_FLOOR, s.wrong_by_kind
    assert s.recall >= RECALL_FLOOR


def test_router_on_the_test_part_reaches_the_goal() -> None:
    # the goal: tier accuracy >= 0.9 on the test part, at the default settings
    from redline.config import RoutingConfig
    from redline.routing.classifier import text_features
    from redline.routing.evaluate import report

    cfg = RoutingConfig()
    tune, test, table = report(text_features, cfg.classifier_min_confidence, cfg.classifier_default_tier)
    print(table)
    assert test.tier_accuracy >= 0.9
    assert all(recall >= 0.8 for _, recall, _ in test.per_tier.values())


def test_the_router_report_reads_the_test_part_only_to_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    # training inside the report (out-of-fold and final) reads no test part: the test file
    # is opened once, by the report's own loader, and never by a Classifier
    from redline.routing import evaluate

    seen: list[int] = []

    class Watched(Classifier):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            with watching() as opened:
                super().__init__(*args, **kwargs)
            assert not {str(p) for p in TEST_PARTS} & set(opened)
            seen.append(1)

    monkeypatch.setattr(evaluate, "Classifier", Watched)
    from redline.routing.classifier import text_features

    evaluate.report(text_features, 0.75)
    assert len(seen) == 6  # five folds and the final model


def test_pair_files_in_the_plain_three_column_form_and_with_a_header(tmp_path: Path) -> None:
    plain = tmp_path / "plain.tsv"
    plain.write_text("same\thow do i reset my password\thow can i reset my password\n"
                     "diff\tflights to rome\tflights to oslo\n")
    pairs = load_pairs(plain)
    assert [(p.same, p.kind, p.b) for p in pairs] == [(True, "-", "how can i reset my password"),
                                                     (False, "-", "flights to oslo")]
    headed = tmp_path / "headed.tsv"
    headed.write_text("label\tkind\tquestion_a\tquestion_b\ndiff\ttime\tat 6 am\tat 6 pm\n")
    assert load_pairs(headed)[0].kind == "time"
    bad = tmp_path / "bad.tsv"
    bad.write_text("same\tonly one question\n")
    with pytest.raises(ValueError, match="row 1 has 2 fields"):
        load_pairs(bad)
    bad.write_text("maybe\ta\tb\n")
    with pytest.raises(ValueError, match="same or diff"):
        load_pairs(bad)


@pytest.mark.slow
def test_the_bf16_embedder_changes_no_served_decision() -> None:
    # cache.embedder_dtype: auto computes in BF16 where the CPU has it, through the traced
    # graph; the threshold was chosen in float32 by sentence-transformers. Over both parts'
    # pairs, each cosine moves by < 0.01 (measured: p50 0.0004, max 0.004), no pair is
    # served differently at the default settings, and the rows stay float32 of unit length
    # (pooled and normalised in float32)
    from redline.cache.embedder import load_minilm
    from redline.cache.response_cache import accepts

    cfg = CacheConfig()
    pairs = [p for path in (*CACHE_TUNE, CACHE_TEST) for p in load_pairs(path)]
    f = similarities(pairs, load_minilm(None, 0, "float32"))[:, 0]
    for half in (load_minilm(None, 0, "bfloat16"), load_minilm(None, 0, "bfloat16", traced=True)):
        h = similarities(pairs, half)[:, 0]
        assert 0.0 < np.abs(f - h).max() < 0.01  # > 0: it did run in BF16
        assert [accepts(cfg, p.b, p.a, float(x)) for p, x in zip(pairs, f, strict=True)] == \
            [accepts(cfg, p.b, p.a, float(x)) for p, x in zip(pairs, h, strict=True)]
        rows = half.encode([p.a for p in pairs[:40]])
        assert rows.dtype == np.float32
        assert np.abs(np.linalg.norm(rows, axis=1) - 1.0).max() < 1e-5
    assert half.graph  # the traced graph passed its check and ran


@pytest.mark.slow
def test_the_traced_embedder_answers_what_sentence_transformers_answers() -> None:
    # in float32 the traced graph, the pooling and the cut are sentence-transformers' own
    # arithmetic: the same rows to ~1e-7, a padded batch or one text at a time
    from redline.cache.embedder import load_minilm

    texts = ["hi", "Where is my parcel? It was due last Tuesday.", "word " * 300,
             "How do I reset my password without the email on my account?"]
    exact, traced = load_minilm(None, 0, "float32"), load_minilm(None, 0, "float32", traced=True)
    assert traced.graph and not exact.graph
    assert np.abs(exact.encode(texts) - traced.encode(texts)).max() < 1e-5
    assert np.abs(exact.encode(texts[1:2]) - traced.encode(texts[1:2])).max() < 1e-5
    assert np.abs(exact.encode(texts, 6) - traced.encode(texts, 6)).max() < 1e-5
    assert np.abs(traced.encode(texts, 6)[2] - traced.encode(["word word word word"])[0]).max() < 1e-5


@pytest.mark.slow
def test_a_traced_graph_that_differs_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    import redline.cache.embedder as embedder

    texts = ["hi", "Where is my parcel? It was due last Tuesday."]
    plain = embedder.load_minilm(None, 0, "float32")
    exact = plain.encode(texts)
    # the check finds any difference too large: the transformer runs eagerly, pooled here
    monkeypatch.setattr(embedder, "_TRACE_TOLERANCE", -1.0)
    eager = embedder.MiniLMEmbedder(None, 0, "float32", traced=True).load()
    assert not eager.graph
    assert np.abs(eager.encode(texts) - exact).max() < 1e-5
    # a pooling other than the mean: sentence-transformers' encode, untraced
    monkeypatch.setattr(type(plain._model[1]), "get_config_dict",
                        lambda self: {"pooling_mode": "cls"})
    other = embedder.MiniLMEmbedder(None, 0, "float32", traced=True).load()
    assert not other.graph
    assert np.abs(other.encode(texts) - exact).max() == 0.0


def test_the_embedder_dtype_follows_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import redline.models
    from redline.cache.embedder import resolve_dtype

    monkeypatch.setattr(redline.models, "cpu_native_bf16", lambda: True)
    assert resolve_dtype("auto") == "bfloat16"
    assert resolve_dtype("float32") == "float32"
    monkeypatch.setattr(redline.models, "cpu_native_bf16", lambda: False)
    assert resolve_dtype("auto") == "float32"
    assert resolve_dtype("bfloat16") == "bfloat16"
    assert redline.models.cpu_bf16_flag("flags\t\t: fpu avx512f avx512_bf16 amx_tile\n")
    assert not redline.models.cpu_bf16_flag("flags\t\t: fpu avx512f avx2\n")


def test_one_minilm_copy_per_directory_threads_and_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    # the defaults spelt out or left out are one copy (each load reads the weights, ~3 s)
    from redline.cache.embedder import MiniLMEmbedder, load_minilm

    monkeypatch.setattr(MiniLMEmbedder, "load", lambda self: self)  # no weights read here
    plain = load_minilm("/no/such/model", 7)
    assert load_minilm("/no/such/model", 7, "float32") is plain
    assert load_minilm(path="/no/such/model", threads=7) is plain
    assert load_minilm("/no/such/model", 7, "bfloat16") is not plain
    assert load_minilm("/no/such/model", 7, "float32", traced=True) is not plain
    assert load_minilm("/no/such/model", 7, "float32", True) is \
        load_minilm("/no/such/model", 7, traced=True)
