"""`redline precompute --from LOG --top N`: answer the N most frequent questions of a
log ahead of time, through the normal HTTP pipeline, so they are cache hits when asked.

LOG is JSONL of requests (a chat or text completion body per line, or an OpenAI batch
line whose `body` is one), or plain text, one question per line. Identical requests
are counted together (stream flags and user ids aside), so each of the top N is
answered once; with its own model and sampling parameters, so the cache key matches
the traffic that will ask it again.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

_IGNORED = ("stream", "stream_options", "user", "cache", "background", "notify")


@dataclass
class Outcome:
    asked: int
    results: Counter[str]  # X-Redline-Cache value (or "error <status>") per request


def read_requests(path: str | Path, model: str, max_tokens: int) -> list[dict[str, Any]]:
    bodies = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        body: Any = None
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                obj = None
            if isinstance(obj, dict):
                body = obj.get("body", obj)
        if not isinstance(body, dict) or not ("messages" in body or "prompt" in body):
            body = {"model": model, "temperature": 0, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": line}]}
        bodies.append({k: v for k, v in body.items() if k not in _IGNORED})
    return bodies


def most_frequent(bodies: Iterable[dict[str, Any]], top: int) -> list[tuple[int, dict[str, Any]]]:
    counts: Counter[str] = Counter(json.dumps(b, sort_keys=True) for b in bodies)
    return [(n, json.loads(raw)) for raw, n in counts.most_common(top)]


async def answer(client: httpx.AsyncClient, top: list[tuple[int, dict[str, Any]]],
                 headers: dict[str, str] | None = None) -> Outcome:
    results: Counter[str] = Counter()
    for _, body in top:
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        r = await client.post(path, json={**body, "stream": False}, headers=headers or {})
        results[r.headers.get("x-redline-cache", "?") if r.status_code == 200
                else f"error {r.status_code}"] += 1
    return Outcome(len(top), results)
