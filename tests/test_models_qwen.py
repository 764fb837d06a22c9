"""The default large model, Qwen2.5-Coder-0.5B-Instruct, assembled from its six PyPI part
packages: checked against its digest, and a chat model that answers a question."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.backends.local import LocalBackend
from redline.config import load_config
from redline.models import QWEN_PARTS, assemble_parts, bundled_path
from redline.types import GenerationRequest, Message, SamplingParams

pytestmark = pytest.mark.slow
NAME = "qwen2.5-coder-0.5b-instruct"


def test_parts_with_another_digest_are_refused_and_leave_no_file(tmp_path: Path) -> None:
    target = tmp_path / "q.gguf"
    with pytest.raises(ValueError, match="sha256"):
        assemble_parts(QWEN_PARTS, target, "0" * 64)
    assert list(tmp_path.iterdir()) == []


def test_assembled_once_then_reused(tmp_path: Path) -> None:
    path = bundled_path(NAME, tmp_path)
    assert path.read_bytes()[:4] == b"GGUF"
    mtime = path.stat().st_mtime_ns
    assert bundled_path(NAME, tmp_path) == path and path.stat().st_mtime_ns == mtime


async def test_the_default_large_model_answers_chat() -> None:
    cfg = load_config().model(NAME)
    assert cfg is not None and cfg.has("chat")
    cfg = cfg.model_copy(update={"warmup": False, "n_seq_max": 2, "n_ctx": 512})
    backend = LocalBackend(cfg, Path(".redline/models"))
    await backend.start()
    try:
        req = GenerationRequest(model=NAME, messages=(
            Message("user", "What is the capital of France? One word."),),
            sampling=SamplingParams(max_tokens=12, temperature=0.0))
        text = "".join([c.text async for c in backend.stream(req)])
    finally:
        await backend.close()
    assert "paris" in text.lower()
