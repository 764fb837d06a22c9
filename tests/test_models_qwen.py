"""The default large model, Qwen2.5-Coder-0.5B-Instruct, assembled from its six PyPI part
packages: checked against its digest, and a chat model that answers a question."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from redline.backends.local import LocalBackend
from redline.config import load_config
from redline.models import QWEN_PARTS, assemble_parts, bundled_path
from redline.types import (
    FunctionTool,
    GenerationRequest,
    Message,
    SamplingParams,
    ToolChoice,
    assemble,
)

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


def test_auto_weights_pick_bf16_only_where_cpu_and_build_have_its_kernels() -> None:
    """`weights: auto` -> BF16 needs AVX512-BF16 in the CPU *and* in the llama.cpp build: a
    wheel compiled on another CPU runs BF16 one stream at half speed (issue 23)."""
    from redline.models import bf16_usable

    cpu = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
    old_cpu = "processor\t: 0\nflags\t\t: fpu sse avx2 fma\n"
    native = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_BF16 = 1 | OPENMP = 1 |"
    generic = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | OPENMP = 1 |"
    assert bf16_usable(cpu, native)
    assert not bf16_usable(cpu, generic)  # the CPU could, this build cannot
    assert not bf16_usable(old_cpu, native)
    assert not bf16_usable(old_cpu, generic)


async def test_the_default_large_model_calls_a_tool_when_free_to() -> None:
    """`tool_choice: auto`: Qwen2.5-Coder answers a call as a bare JSON object, without the
    <tool_call> tags; it comes back as a tool call, as llama-server gives it."""
    cfg = load_config().model(NAME)
    assert cfg is not None and cfg.has("tools")
    cfg = cfg.model_copy(update={"warmup": False, "n_seq_max": 2, "n_ctx": 1024})
    backend = LocalBackend(cfg, Path(".redline/models"))
    await backend.start()
    weather = FunctionTool("get_weather", "The current weather in a city", {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    try:
        req = GenerationRequest(model=NAME, messages=(
            Message("user", "What is the weather in Paris right now?"),),
            sampling=SamplingParams(max_tokens=60, temperature=0.0),
            tools=(weather,), tool_choice=ToolChoice("auto"))
        chunks = [c async for c in backend.stream(req)]
    finally:
        await backend.close()
    calls = [d for c in chunks for d in c.tool_calls]
    assert [d.name for d in calls if d.name] == ["get_weather"]
    assert json.loads("".join(d.arguments or "" for d in calls)) == {"city": "Paris"}
    assert "".join(c.text for c in chunks).strip() == ""
    assert chunks[-1].finish_reason == "tool_calls"


async def test_the_default_large_model_fills_in_the_middle() -> None:
    """A text completion with `suffix`: Qwen2.5-Coder is asked in its FIM tokens (prefix,
    suffix, middle), and writes what goes between (code completion inside a file)."""
    cfg = load_config().model(NAME)
    assert cfg is not None
    cfg = cfg.model_copy(update={"warmup": False, "n_seq_max": 2, "n_ctx": 512})
    backend = LocalBackend(cfg, Path(".redline/models"))
    await backend.start()
    try:
        req = GenerationRequest(model=NAME, prompt="def add(a, b):\n    ",
                                suffix="\n\nprint(add(1, 2))\n",
                                sampling=SamplingParams(max_tokens=8, temperature=0.0))
        import llama_cpp as ll

        tokens = backend.tokens_of(req)
        assert backend.model is not None
        vocab = backend.model.vocab
        assert tokens[0] == ll.llama_vocab_fim_pre(vocab)
        assert tokens[-1] == ll.llama_vocab_fim_mid(vocab)
        assert ll.llama_vocab_fim_suf(vocab) in tokens
        text = "".join([c.text async for c in backend.stream(req)])
    finally:
        await backend.close()
    assert text.startswith("return a + b")


async def test_a_call_it_starts_when_free_to_keeps_to_the_schema() -> None:
    """`tool_choice: auto` with schemas a free answer breaks: sampled at 0.7, Qwen2.5-Coder
    fills a three-letter code with "sterling" or "London Heathrow" (bench/tool_calls_auto.py,
    4 of 12 calls without the grammar). Once it has begun a call of a listed tool, the lazy
    grammar holds the arguments to the schema: every call is valid."""
    cfg = load_config().model(NAME)
    assert cfg is not None
    cfg = cfg.model_copy(update={"warmup": False, "n_seq_max": 2, "n_ctx": 1024})
    backend = LocalBackend(cfg, Path(".redline/models"))
    await backend.start()
    code = {"type": "string", "pattern": "^[A-Z]{3}$"}
    convert = FunctionTool("convert_currency", "Convert an amount between currencies", {
        "type": "object", "properties": {"amount": {"type": "number"}, "from": code, "to": code},
        "required": ["amount", "from", "to"], "additionalProperties": False})
    flight = FunctionTool("book_flight", "Book a flight", {
        "type": "object", "properties": {"origin": code, "destination": code},
        "required": ["origin", "destination"], "additionalProperties": False})
    calls = []
    try:
        for seed, ask in enumerate(["How many yen is 80 pounds sterling?",
                                    "Book one seat from London Heathrow to Paris CDG.",
                                    "Fly me from Boston to Miami."]):
            req = GenerationRequest(model=NAME, messages=(Message("user", ask),),
                                    sampling=SamplingParams(max_tokens=80, temperature=0.7,
                                                            seed=seed),
                                    tools=(convert, flight), tool_choice=ToolChoice("auto"))
            chunks = [c async for c in backend.stream(req)]
            calls += [(c.name, json.loads(c.arguments)) for c in assemble(chunks)[0].tool_calls()]
    finally:
        await backend.close()
    assert len(calls) == 3, calls
    for name, args in calls:
        keys = ("from", "to") if name == "convert_currency" else ("origin", "destination")
        assert all(len(args[k]) == 3 and args[k].isupper() for k in keys), calls
