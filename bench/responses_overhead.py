"""The Responses route's overhead against chat completions on the same upstream (issue 20):
one redline in front of the fake upstream (TTFT 0, 1 ms/token), streamed requests one at a
time, paired and alternating in one run: each pair sends the same question through
/v1/chat/completions and /v1/responses (store: true, the default: the record is written
before response.completed), the order flipped every pair. TTFT is the time to the first
text delta. An A/A row pairs chat with chat the same way (the noise floor).
Usage: .venv/bin/python bench/responses_overhead.py --pairs 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, pct  # noqa: E402

CHAT = ("/v1/chat/completions", b'"content"', {"model": "m", "max_tokens": 16, "stream": True,
                                               "messages": [{"role": "user", "content": "hi"}]})
RESP = ("/v1/responses", b"response.output_text.delta",
        {"model": "m", "max_output_tokens": 16, "stream": True, "input": "hi"})


def ttft(client: httpx.Client, url: str, route: tuple[str, bytes, dict[str, object]]) -> float:
    path, marker, body = route
    t0 = time.perf_counter()
    with client.stream("POST", url + path, json=body) as r:
        got = b""
        first = None
        for raw in r.iter_raw():
            got += raw
            if first is None and marker in got:
                first = time.perf_counter() - t0
        assert r.status_code == 200 and first is not None, got[:300]
    return first


def paired(client: httpx.Client, url: str, a: tuple[str, bytes, dict[str, object]],
           b: tuple[str, bytes, dict[str, object]], pairs: int) -> dict[str, float]:
    diffs, xs, ys = [], [], []
    for i in range(pairs):
        if i % 2:
            y, x = ttft(client, url, b), ttft(client, url, a)
        else:
            x, y = ttft(client, url, a), ttft(client, url, b)
        xs.append(x)
        ys.append(y)
        diffs.append(y - x)
    ms = 1000.0
    return {"a_p50_ms": round(pct(xs, 50) * ms, 3), "b_p50_ms": round(pct(ys, 50) * ms, 3),
            "added_p50_ms": round(statistics.median(diffs) * ms, 3),
            "added_p90_ms": round(pct(diffs, 90) * ms, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=300)
    args = ap.parse_args()
    procs = Procs()
    try:
        up = procs.upstream(ttft=0.0, tpot=0.001)
        url = procs.gateway([{"name": "m", "backend": "openai", "url": up}],
                            routing={"classifier": "off"})
        with httpx.Client(timeout=60) as client:
            paired(client, url, CHAT, RESP, 30)  # warm-up
            out = {"A/A (chat vs chat)": paired(client, url, CHAT, CHAT, args.pairs),
                   "responses vs chat": paired(client, url, CHAT, RESP, args.pairs)}
        print(json.dumps(out, indent=2))
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
