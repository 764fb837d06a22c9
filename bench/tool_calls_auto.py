"""`tool_choice: auto` on the embedded engine: how many answers that try a tool call give a
valid one, with the lazy grammar (a call the model starts is constrained to a listed tool
and its schema) and without it (the call parsed from free text), same prompts and seeds,
in one run, alternating; and when an answer's first tool-call fragment comes (under the
grammar a call is streamed as it is written; parsed from free text it comes whole).

Each answer is one of: `valid` (tool_calls parsed, every call's arguments valid for its
tool's schema by `jsonschema`), `invalid` (a call attempted, `<tool_call>` or a
`"name":`/`"arguments"` object in the text, or parsed calls whose arguments fail the
schema), `text` (no call tried), `cut` (max_tokens reached inside the answer).

Usage: .venv/bin/python bench/tool_calls_auto.py [--model qwen2.5-coder-0.5b-instruct]
           [--seeds 3] [--temperature 0.7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redline.backends import local_features  # noqa: E402
from redline.backends.local import LocalBackend  # noqa: E402
from redline.config import ModelConfig  # noqa: E402
from redline.types import (  # noqa: E402
    FunctionTool,
    GenerationRequest,
    Message,
    SamplingParams,
    ToolChoice,
    assemble,
)

TOOLS = (
    FunctionTool("get_weather", "Current weather in a city", {
        "type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}),
    FunctionTool("convert_currency", "Convert an amount between currencies", {
        "type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0},
            "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "to": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["amount", "from", "to"], "additionalProperties": False}),
    FunctionTool("book_flight", "Book a flight", {
        "type": "object", "properties": {
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["origin", "destination", "date", "passengers"],
        "additionalProperties": False}),
)
SCHEMAS = {t.name: t.parameters for t in TOOLS}
PROMPTS = [
    "What's the weather in Paris right now, in celsius?",
    "Is it hot in Phoenix today? Use fahrenheit.",
    "Weather for Tokyo please.",
    "How cold is it in Oslo?",
    "Convert 250 US dollars to euros.",
    "How many yen is 80 pounds sterling?",
    "Change 1200 CAD into USD.",
    "What is 99.5 EUR in Swiss francs?",
    "Book me a flight from JFK to LAX on 2026-12-24 for 2 people.",
    "I need one seat from London Heathrow to Paris CDG on March 3rd 2027.",
    "Fly 4 of us from SFO to Seattle on 2027-01-15.",
    "Get a flight Boston to Miami next Friday, 2026-12-11, just me.",
]


# the time of each answer's first tool-call fragment and its end, per mode (streamed under
# the grammar: the header comes when the name is written; parsed: the call comes whole)
FIRST_CALL: dict[str, list[tuple[float, float]]] = {}
MODE = [""]


def classify(text: str, calls: list[Any], finish: str | None) -> str:
    if calls:
        for call in calls:
            try:
                args = json.loads(call.arguments or "{}")
                jsonschema.validate(args, SCHEMAS[call.name])
            except (ValueError, KeyError, jsonschema.ValidationError):
                return "invalid"
        return "valid"
    if finish == "length":
        return "cut"
    tried = "<tool_call>" in text or ('"name"' in text and '"arguments"' in text)
    return "invalid" if tried else "text"


async def answer(backend: LocalBackend, prompt: str, seed: int, temperature: float,
                 max_tokens: int) -> tuple[str, float, int, str]:
    request = GenerationRequest(
        model=backend.cfg.name, messages=(Message("user", prompt),), tools=TOOLS,
        tool_choice=ToolChoice("auto"),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed))
    t0 = time.perf_counter()
    chunks = []
    first_call = None
    async for c in backend.stream(request):
        chunks.append(c)
        if first_call is None and c.tool_calls:
            first_call = time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    if first_call is not None:
        FIRST_CALL.setdefault(MODE[0], []).append((first_call, seconds))
    a = assemble(chunks)[0]
    calls = list(a.tool_calls())
    tokens = sum(c.usage.completion_tokens for c in chunks if c.usage is not None)
    return classify("".join(a.text), calls, a.finish_reason), seconds, tokens, "".join(a.text)[:160] + (
        f" {[(c.name, c.arguments) for c in calls]}" if calls else "")


async def main(model: str, seeds: int, temperature: float, max_tokens: int,
               show: bool) -> None:
    cfg = ModelConfig(name=model, bundled=model, warmup=False, n_seq_max=1, n_ctx=2048,
                      capabilities=["chat", "tools"])
    backend = LocalBackend(cfg, ROOT / ".redline" / "models")
    await backend.start()
    lazy = local_features.lazy_grammar
    results: dict[str, Counter[str]] = {"lazy grammar": Counter(), "parse only": Counter()}
    seconds: dict[str, float] = {k: 0.0 for k in results}
    tokens: dict[str, int] = {k: 0 for k in results}
    try:
        for seed in range(seeds):
            for i, prompt in enumerate(PROMPTS):
                # alternating, and which goes first too: the second reuses the first's
                # prompt from the prefix cache
                modes = list(results) if (i + seed) % 2 == 0 else list(results)[::-1]
                for mode in modes:
                    local_features.lazy_grammar = lazy if mode == "lazy grammar" else (  # type: ignore[assignment]
                        lambda *a, **k: None)
                    MODE[0] = mode
                    kind, s, n, shown = await answer(backend, prompt, seed, temperature,
                                                     max_tokens)
                    results[mode][kind] += 1
                    seconds[mode] += s
                    tokens[mode] += n
                    if show:
                        print(f"[{mode}] {kind}: {shown!r}", flush=True)
            print(f"seed {seed} done: " + "; ".join(
                f"{m}: {dict(c)}" for m, c in results.items()), flush=True)
    finally:
        local_features.lazy_grammar = lazy  # type: ignore[assignment]
        await backend.close()
    print(f"\n{model}, {len(PROMPTS)} prompts x {seeds} seeds, temperature {temperature}, "
          f"max_tokens {max_tokens}")
    print("| mode | valid | invalid | text | cut | valid of attempted | seconds | tokens | "
          "ms a token |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, c in results.items():
        attempted = c["valid"] + c["invalid"]
        share = f"{c['valid'] / attempted:.1%}" if attempted else "-"
        print(f"| {mode} | {c['valid']} | {c['invalid']} | {c['text']} | {c['cut']} | "
              f"{share} | {seconds[mode]:.1f} | {tokens[mode]} | "
              f"{1000 * seconds[mode] / max(tokens[mode], 1):.1f} |")
    print("\n| mode | answers with a call | first call fragment p50 | its end p50 | "
          "first fragment / end, median |")
    print("|---|---|---|---|---|")
    for mode in results:
        pairs = FIRST_CALL.get(mode, [])
        if pairs:
            print(f"| {mode} | {len(pairs)} | "
                  f"{statistics.median(p[0] for p in pairs):.2f} s | "
                  f"{statistics.median(p[1] for p in pairs):.2f} s | "
                  f"{statistics.median(p[0] / p[1] for p in pairs):.2f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--show", action="store_true")
    args = ap.parse_args()
    asyncio.run(main(args.model, args.seeds, args.temperature, args.max_tokens, args.show))
