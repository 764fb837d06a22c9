"""Structured outputs on the embedded engine (the real SmolLM2): fifty-odd schemas of varied
shapes (numeric bounds among them) at temperature 0.7; every answer that stops parses and
validates with `jsonschema`, and at least 95 % of them stop within max_tokens."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from structured_schemas import SCHEMAS

from redline.backends.local import LocalBackend
from redline.config import ModelConfig
from redline.types import GenerationRequest, Message, ResponseFormat, SamplingParams, assemble

pytestmark = pytest.mark.slow

SMOL = "smollm2-135m-instruct"


async def _answers(max_tokens: int) -> list[tuple[str | None, str]]:
    cfg = ModelConfig(name=SMOL, bundled=SMOL, warmup=False, n_seq_max=8, n_ctx=512)
    backend = LocalBackend(cfg, Path(".redline/models"))
    await backend.start()
    limit = asyncio.Semaphore(8)

    async def one(i: int, prompt: str, schema: dict[str, Any]) -> tuple[str | None, str]:
        request = GenerationRequest(
            model=SMOL, messages=(Message("user", f"{prompt} Answer in JSON."),),
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=i),
            response_format=ResponseFormat("json_schema", f"s{i}", schema, True))
        async with limit:
            chunks = [c async for c in backend.stream(request)]
        answer = assemble(chunks)[0]
        return answer.finish_reason, "".join(answer.text)

    try:
        return await asyncio.gather(*(one(i, p, s) for i, (p, s) in enumerate(SCHEMAS)))
    finally:
        await backend.close()


@pytest.mark.timeout(1800)  # fifty answers: minutes on a loaded 2-core machine
def test_fifty_schemas_give_valid_json() -> None:
    answers = asyncio.run(_answers(max_tokens=96))
    stopped = 0
    for (prompt, schema), (reason, text) in zip(SCHEMAS, answers, strict=True):
        assert reason in ("stop", "length"), (prompt, reason)
        if reason != "stop":
            continue
        stopped += 1
        jsonschema.validate(json.loads(text), schema)  # raises: the test fails, naming it
    assert stopped >= 0.95 * len(SCHEMAS), [(p, a) for (p, _), a in zip(SCHEMAS, answers,
                                                                          strict=True)
                                             if a[0] != "stop"]
