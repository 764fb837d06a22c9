"""Issue 23's fair-prefill figure over HTTP, next to llama-server's in the same run: the
inter-token latency of running streams while a long prompt arrives.

    .venv/bin/python bench/prefill_itl_peer.py --llama-server .bench-peer/build/bin/llama-server

Both servers load the same file (SmolLM2-135M, `weights: auto`); llama-server runs with
`-t 2 -c 16384 -np 8` and its other defaults. Each round, per server (servers interleaved):
`--streams` streaming requests decode long greedy answers (`ignore_eos`); once each has
given `--warm-tokens` tokens, a prompt of about `--prompt` tokens arrives (streamed, its
own new text, so no cache holds it); the streams then run to their end (a stream whose
client leaves goes on in redline, for a resume, and would load the cores during the other
server's round). The client stamps every token as it arrives. TPOT is
the median gap between the streams' tokens before the prompt came, once all of them were
decoding (no gap that spans the streams' own prompts); "during" is every gap
that ended after it arrived and began before its first token. The goal: ITL p99 during
the prefill <= 2x TPOT. redline is asked in tier A with its response cache off. The
gaps' p99 before the prompt came (the client's and the machine's own jitter) is printed
too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_peer import (  # noqa: E402
    MODEL,
    PEER_FLAGS,
    REDLINE_EXTRA,
    find_or_build_llama_server,
    start_llama_server,
    start_redline,
)
from engine_prefill_itl import TEXT, print_table, split_gaps  # noqa: E402

from redline.bench.report import percentile  # noqa: E402
from redline.models import bundled_path, served_path  # noqa: E402


async def stream_tokens(client: httpx.AsyncClient, body: dict[str, Any], stamps: list[float],
                        stop: asyncio.Event) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            choices = event.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                stamps.append(time.perf_counter())
            if stop.is_set():
                return


async def one_round(url: str, extra: dict[str, Any], streams: int, prompt_words: int,
                    warm: int, salt: str) -> tuple[list[float], list[float], float]:
    """(gaps before the prompt came, gaps during its prefill, its TTFT)"""
    stamps: list[list[float]] = [[] for _ in range(streams)]
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=streams + 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        tasks = [asyncio.create_task(stream_tokens(client, {
            "model": MODEL, "stream": True, "temperature": 0, "ignore_eos": True,
            "max_tokens": warm + 500, **extra,
            "messages": [{"role": "user", "content": f"Tell story {salt}-{i} about the sea."}]},
            stamps[i], stop)) for i in range(streams)]
        while not all(len(s) >= warm for s in stamps):
            if any(t.done() for t in tasks):
                raise RuntimeError("a stream ended before the prompt arrived")
            await asyncio.sleep(0.005)
        text = f"Log {salt}. " + " ".join([TEXT] * (prompt_words // len(TEXT.split()) + 1))
        body = {"model": MODEL, "stream": True, "temperature": 0, "max_tokens": 2, **extra,
                "messages": [{"role": "user", "content": text + "\nWhich ship came first?"}]}
        arrived = time.perf_counter()
        first: list[float] = []
        await stream_tokens(client, body, first, asyncio.Event())
        # the streams run to their end: a stream whose client leaves goes on generating in
        # redline (for a resume), and would load the cores during the next server's round
        await asyncio.gather(*tasks)
    ttft_at = first[0] if first else time.perf_counter()
    steady = max(s[0] for s in stamps)  # every stream decoding: their own prompts are done
    before, during = split_gaps(stamps, arrived, ttft_at, steady)
    return before, during, ttft_at - arrived


def prompt_tokens(url: str, words: int) -> int:
    text = "Log probe. " + " ".join([TEXT] * (words // len(TEXT.split()) + 1))
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
        "model": MODEL, "max_tokens": 1, "temperature": 0,
        "messages": [{"role": "user", "content": text + "\nWhich ship came first?"}]}).json()
    return int(r["usage"]["prompt_tokens"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-server", default=None, help="path of a built llama-server")
    ap.add_argument("--streams", type=int, default=7)
    ap.add_argument("--prompt-words", type=int, default=1100, help="~1,500 tokens")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm-tokens", type=int, default=24)
    ap.add_argument("--redline-config", default=None, help="a YAML config instead of the "
                    "default (e.g. models[].prefill_floor_tokens: 1)")
    args = ap.parse_args()
    binary = find_or_build_llama_server(args.llama_server)
    model_file = served_path(bundled_path(MODEL, ROOT / ".redline" / "models"), "auto")
    tmp = Path(tempfile.mkdtemp(prefix="redline-itl-"))
    procs = []
    got: dict[str, tuple[list[float], list[float], list[float]]] = {}
    try:
        p1, red_url = start_redline(tmp, args.redline_config)
        p2, peer_url = start_llama_server(binary, model_file)
        procs += [p1, p2]
        servers = {"redline": (red_url, REDLINE_EXTRA), "llama-server": (peer_url, {})}
        n_prompt = prompt_tokens(peer_url, args.prompt_words)
        for r in range(args.rounds):
            order = list(servers) if r % 2 == 0 else list(servers)[::-1]
            for name in order:
                url, extra = servers[name]
                before, during, ttft = asyncio.run(one_round(
                    url, extra, args.streams, args.prompt_words, args.warm_tokens, f"{name[0]}{r}"))
                b, d, t = got.setdefault(name, ([], [], []))
                b.extend(before)
                d.extend(during)
                t.append(ttft)
                print(f"round {r + 1} {name}: TPOT {statistics.median(before) * 1e3:.1f} ms, ITL "
                      f"p99 during {percentile(during, 99) * 1e3:.1f} ms, newcomer TTFT {ttft:.2f} s",
                      file=sys.stderr, flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    print(f"\n{args.streams} streams decoding, a {n_prompt}-token prompt arrives; {model_file.name}; "
          f"llama-server {' '.join(PEER_FLAGS)}; {args.rounds} rounds per server, interleaved; "
          "client-side token stamps over HTTP/SSE\n")
    print_table("server", got)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
