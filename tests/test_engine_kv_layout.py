"""`kv_layout: per_slot`: a model setting that reaches the engine (one KV stream per
slot). The runner's and the engine's own checks run for both layouts in
tests/test_engine_model.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from redline.backends.local import LocalBackend
from redline.config import ModelConfig
from redline.types import GenerationRequest, Message, SamplingParams


def test_the_layout_is_a_model_setting():
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct").kv_layout == "unified"
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct", kv_layout="per_slot").kv_layout \
        == "per_slot"
    with pytest.raises(ValueError):
        ModelConfig(name="m", bundled="smollm2-135m-instruct", kv_layout="paged")


@pytest.mark.slow
async def test_the_model_setting_reaches_the_engine_and_it_serves():
    backend = LocalBackend(ModelConfig(name="smol", bundled="smollm2-135m-instruct", n_threads=2,
                                       n_seq_max=2, n_ctx=1024, kv_layout="per_slot"),
                           Path(".redline/models"))
    await backend.start()  # warm-up runs on the per-slot context too
    try:
        assert backend.engine is not None and not backend.engine.runner.unified
        req = GenerationRequest(model="smol", messages=(Message("user", "Name three colours."),),
                                sampling=SamplingParams(max_tokens=8, temperature=0.0))
        text = "".join([c.text async for c in backend.stream(req)])
        assert text.strip()
    finally:
        await backend.close()
