"""Two Responses API figures of issue 20 on the embedded engine (bundled SmolLM2):

1. turns: a conversation of `--turns` short turns continued by `previous_response_id`,
   against the same turns resent whole each turn through chat completions (prefix reuse
   on in both: the engine's own). TTFT per turn (to the first text delta), streamed, one
   request at a time, the two modes alternating conversation by conversation (the order
   flipped every round). Each conversation starts with its own tag, so no conversation
   reuses another's prefix; within one, every turn can reuse the turns before it.
2. resume: a streamed response is cut after a random number of events, then resumed on a
   NEW connection (`GET /v1/responses/{id}?stream=true&starting_after=N`); measured from
   the start of that request (TCP connect included) to the first resumed event. With
   `--redis`, two replicas share a redis-server started here and the resume goes to the
   other replica (across replicas).

Full figures (a quiet machine):
    .venv/bin/python bench/responses_turns.py --rounds 10 --turns 10 --resume-trials 200 --redis
Small check:
    .venv/bin/python bench/responses_turns.py --rounds 1 --turns 3 --resume-trials 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streams_server import SMOL, server  # noqa: E402

QUESTIONS = ["Name a fruit.", "Name a colour.", "Name a city.", "Name an animal.",
             "Name a river.", "Name a tree.", "Name a metal.", "Name a planet.",
             "Name a flower.", "Name an instrument.", "Name a sport.", "Name a country."]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def _stream(client: httpx.Client, method: str, url: str, body: dict[str, Any] | None,
            marker: bytes) -> tuple[float, bytes]:
    """(seconds to the first event holding `marker`, the whole stream)."""
    t0 = time.perf_counter()
    got, first = b"", None
    with client.stream(method, url, json=body) as r:
        for raw in r.iter_raw():
            got += raw
            if first is None and marker in got:
                first = time.perf_counter() - t0
        if r.status_code != 200 or first is None:
            raise RuntimeError(f"{url}: {r.status_code} {got[:300]!r}")
    return first, got


def _final(stream: bytes) -> dict[str, Any]:
    for block in reversed(stream.split(b"\n\n")):
        if b'"type":"response.' in block and b"data: " in block:
            return json.loads(block.split(b"data: ", 1)[1])["response"]  # type: ignore[no-any-return]
    raise RuntimeError("no final event")


def responses_turns(client: httpx.Client, url: str, tag: str, turns: int,
                    max_tokens: int) -> list[float]:
    out, previous = [], None
    for i in range(turns):
        text = (f"[{tag}] " if i == 0 else "") + QUESTIONS[i % len(QUESTIONS)]
        body: dict[str, Any] = {"model": SMOL, "input": text, "stream": True, "cache": False,
                                "temperature": 0, "max_output_tokens": max_tokens}
        if previous:
            body["previous_response_id"] = previous
        ttft, got = _stream(client, "POST", f"{url}/v1/responses", body,
                            b"response.output_text.delta")
        out.append(ttft)
        previous = _final(got)["id"]
    return out


def chat_turns(client: httpx.Client, url: str, tag: str, turns: int,
               max_tokens: int) -> list[float]:
    out: list[float] = []
    history: list[dict[str, str]] = []
    for i in range(turns):
        text = (f"[{tag}] " if i == 0 else "") + QUESTIONS[i % len(QUESTIONS)]
        history.append({"role": "user", "content": text})
        body = {"model": SMOL, "messages": history, "stream": True, "cache": False,
                "temperature": 0, "max_tokens": max_tokens}
        ttft, got = _stream(client, "POST", f"{url}/v1/chat/completions", body, b'"content":"')
        out.append(ttft)
        answer = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                         for line in got.decode().splitlines()
                         if line.startswith('data: {"') and json.loads(line[6:]).get("choices"))
        history.append({"role": "assistant", "content": answer})
    return out


def turns_figure(url: str, rounds: int, turns: int, max_tokens: int) -> dict[str, Any]:
    per: dict[str, list[list[float]]] = {"responses": [], "chat": []}
    with httpx.Client(timeout=120) as client:
        responses_turns(client, url, "warm-up", 2, max_tokens)
        for r in range(rounds):
            order = ["responses", "chat"] if r % 2 == 0 else ["chat", "responses"]
            for mode in order:
                run = responses_turns if mode == "responses" else chat_turns
                per[mode].append(run(client, url, f"conversation {r} {mode}", turns, max_tokens))
    ms = 1000.0
    table = {mode: [round(statistics.median(c[t] for c in runs) * ms, 1) for t in range(turns)]
             for mode, runs in per.items()}
    last = turns - 1
    return {"ttft_p50_ms_per_turn": table,
            "responses_last_vs_first": round(table["responses"][last] / table["responses"][0], 2),
            "responses_vs_chat_last_turn": round(table["responses"][last] / table["chat"][last], 3)}


def _resume(url: str, rid: str, after: int, headers: dict[str, str]) -> float:
    """Seconds from a new connection's resume request to its first bytes; reads on to
    the end (the stream finishes)."""
    with httpx.Client(timeout=30, headers=headers) as fresh:  # a new connection
        t0 = time.perf_counter()
        first = None
        with fresh.stream("GET", f"{url}/v1/responses/{rid}",
                          params={"stream": "true", "starting_after": after}) as r:
            for raw in r.iter_raw():
                if raw and first is None:
                    first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError(f"resume of {rid} after {after}: {r.status_code}, no event")
        return first


def resume_figure(start_url: str, resume_url: str, trials: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    waits: list[float] = []
    skipped = stalled = 0
    headers = {"Authorization": "Bearer bench"}
    with httpx.Client(timeout=120, headers=headers) as client:
        for _ in range(trials):
            cut = rng.randint(3, 40)
            body = {"model": SMOL, "input": f"Count from {rng.randint(1, 50)} to 200, separated "
                    "by commas.", "stream": True, "cache": False, "max_output_tokens": 96}
            with client.stream("POST", f"{start_url}/v1/responses", json=body) as r:
                rid, got = r.headers["x-request-id"], b""
                for raw in r.iter_raw():
                    got += raw
                    if got.count(b"\n\n") >= cut:
                        break
            if b"[DONE]" in got:  # it ended before the cut: nothing to resume
                skipped += 1
                continue
            seen = got.count(b"\n\n")  # whole events read before the cut
            try:
                waits.append(_resume(resume_url, rid, seen - 1, headers))
            except httpx.TimeoutException:  # no event for 30 s: counted, not waited for
                stalled += 1
    ms = 1000.0
    return {"trials": trials, "skipped": skipped, "stalled": stalled,
            "across_replicas": start_url != resume_url,
            "reconnect_to_next_event_ms": {"p50": round(_pct(waits, 50) * ms, 2),
                                           "p90": round(_pct(waits, 90) * ms, 2),
                                           "p99": round(_pct(waits, 99) * ms, 2)}}


@contextlib.contextmanager
def redis(enabled: bool) -> Iterator[str | None]:
    if not enabled:
        yield None
        return
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a running redline (else one is started)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=12, help="per turn (short turns)")
    ap.add_argument("--resume-trials", type=int, default=200)
    ap.add_argument("--redis", action="store_true", help="two replicas on a redis-server; "
                    "resume on the other one")
    ap.add_argument("--seed", type=int, default=20)
    args = ap.parse_args()
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(redis(args.redis))
        a = stack.enter_context(server(args.url, store_url=store))
        b = stack.enter_context(server(None, store_url=store)) if store else a
        if args.rounds:  # each figure printed as soon as it is there
            out["turns"] = turns_figure(a, args.rounds, args.turns, args.max_tokens)
            print(json.dumps({"turns": out["turns"]}), flush=True)
        if args.resume_trials:
            out["resume"] = resume_figure(a, b, args.resume_trials, args.seed)
            print(json.dumps({"resume": out["resume"]}), flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
