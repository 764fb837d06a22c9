"""`redline precompute` and `redline eval-cache`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_cache_api import make_app

from redline.cache.precompute import most_frequent, read_requests
from redline.cli import main


def test_read_requests_counts_jsonl_batch_lines_and_plain_text(tmp_path: Path) -> None:
    log = tmp_path / "log"
    chat = {"model": "fake", "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    log.write_text("\n".join([
        json.dumps({**chat, "stream": True}), json.dumps(chat),
        json.dumps({"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": chat}),
        "What are your hours?", "What are your hours?", "", "Bye"]))
    top = most_frequent(read_requests(log, "fake", 8), 2)
    assert [n for n, _ in top] == [3, 2]
    assert top[0][1] == chat
    assert top[1][1]["messages"][0]["content"] == "What are your hours?"
    assert top[1][1]["max_tokens"] == 8 and top[1][1]["temperature"] == 0


def test_precompute_answers_top_questions_into_the_cache(tmp_path: Path, live_app: Any,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    app, backend = make_app(tmp_path)
    server = live_app(app)
    log = tmp_path / "questions.txt"
    log.write_text("Where is my order?\n" * 3 + "How do I return an item?\n" * 2 + "Rare one\n")
    assert main(["precompute", "--from", str(log), "--top", "2", "--url", server.url,
                 "--model", "fake", "--max-tokens", "5"]) == 0
    assert "'miss': 2" in capsys.readouterr().out
    assert backend.calls == 2
    deadline = time.monotonic() + 5
    body = {"model": "fake", "temperature": 0, "max_tokens": 5,
            "messages": [{"role": "user", "content": "Where is my order?"}]}
    while True:
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body)
        if r.headers["x-redline-cache"] == "hit" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert r.headers["x-redline-cache"] == "hit"


@pytest.mark.slow
def test_eval_cache_prints_precision_recall_and_wrong_hits(capsys: pytest.CaptureFixture[str]) -> None:
    pairs = Path(__file__).resolve().parent.parent / "bench" / "data" / "cache_pairs.tsv"
    assert main(["eval-cache", str(pairs)]) == 0
    out = capsys.readouterr().out
    assert "precision" in out and "wrong-hit rate" in out and "<- configured" in out
    assert len(pairs.read_text().splitlines()) - 1 >= 100
