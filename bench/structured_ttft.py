"""json_schema-constrained vs unconstrained answers on the embedded engine (issue 19).

One engine of the bundled SmolLM2-135M in this process (no HTTP: the figure is about the
grammar in the sampler, not the server). The same prompts are asked twice in one mixed run,
once free and once with a `json_schema` (the constrained and the free sequences decode in
the same batches), `--concurrency` at a time, `--max-tokens` tokens each, temperature 0.7,
seeded. Reported per kind: TTFT p50 (stream open until the first chunk), inter-token
latency p50 and p90 (gaps between chunks that carry tokens), and decode tok/s per sequence
(tokens after the first over the time after the first), with the constrained/free ratio
of the ITL p50 (the issue's bound: at most 1.2).

Needs a quiet machine for its timings; run small where it is not:
    .venv/bin/python bench/structured_ttft.py --requests 8 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from redline.backends.local import LocalBackend
from redline.config import ModelConfig
from redline.types import GenerationRequest, Message, ResponseFormat, SamplingParams

SMOL = "smollm2-135m-instruct"


def _s(n: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


TASKS: list[tuple[str, dict[str, Any]]] = [
    ("Describe a person.", _obj({"name": _s(20), "age": {"type": "integer", "minimum": 0,
                                                         "maximum": 120}, "city": _s(20)})),
    ("Describe a product for sale.", _obj({"name": _s(24), "price": {"type": "number"},
                                           "in_stock": {"type": "boolean"}})),
    ("Give an order of items.", _obj({"order_id": {"type": "integer"}, "items": {
        "type": "array", "maxItems": 3, "items": _obj({"sku": _s(10), "qty": {
            "type": "integer", "minimum": 1, "maximum": 9}})}})),
    ("Summarise a movie.", _obj({"title": _s(30), "year": {"type": "integer", "minimum": 1900,
                                                           "maximum": 2030},
                                 "genres": {"type": "array", "items": _s(12), "maxItems": 3},
                                 "summary": _s(80)})),
]


async def _one(backend: LocalBackend, request: GenerationRequest) -> dict[str, Any]:
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    async for chunk in backend.stream(request):
        if chunk.tokens:
            stamps.append(time.perf_counter())
            tokens += chunk.tokens
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    decode_s = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return {"ttft": (stamps[0] - t0) if stamps else None, "gaps": gaps,
            "tok_s": (tokens - 1) / decode_s if decode_s > 0 else None}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = ModelConfig(name=SMOL, bundled=SMOL, n_seq_max=max(8, args.concurrency),
                      n_threads=args.threads, n_ctx=1024)
    backend = LocalBackend(cfg, Path(".redline/models"))
    await backend.start()
    gate = asyncio.Semaphore(args.concurrency)
    jobs: list[tuple[str, GenerationRequest]] = []
    for i in range(args.requests):
        prompt, schema = TASKS[i % len(TASKS)]
        msgs = (Message("user", f"{prompt} Answer in JSON."),)
        sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.7, seed=i)
        jobs.append(("free", GenerationRequest(model=SMOL, messages=msgs, sampling=sampling)))
        jobs.append(("json_schema", GenerationRequest(
            model=SMOL, messages=msgs, sampling=sampling,
            response_format=ResponseFormat("json_schema", "t", schema, True))))

    async def gated(kind: str, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        async with gate:
            return kind, await _one(backend, request)

    try:
        results = await asyncio.gather(*(gated(k, r) for k, r in jobs))
    finally:
        await backend.close()
    out: dict[str, Any] = {"requests_per_kind": args.requests, "concurrency": args.concurrency,
                           "max_tokens": args.max_tokens}
    for kind in ("free", "json_schema"):
        rows = [r for k, r in results if k == kind]
        gaps = sorted(g for r in rows for g in r["gaps"])
        ttfts = [r["ttft"] for r in rows if r["ttft"] is not None]
        rates = [r["tok_s"] for r in rows if r["tok_s"] is not None]
        out[kind] = {
            "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1) if ttfts else None,
            "itl_p50_ms": round(statistics.median(gaps) * 1000, 1) if gaps else None,
            "itl_p90_ms": round(gaps[int(0.9 * (len(gaps) - 1))] * 1000, 1) if gaps else None,
            "tok_s_per_seq_p50": round(statistics.median(rates), 1) if rates else None,
        }
    free, constrained = out["free"]["itl_p50_ms"], out["json_schema"]["itl_p50_ms"]
    out["itl_ratio"] = round(constrained / free, 2) if free and constrained else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32, help="prompts (each asked twice)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="0: all cores")
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
