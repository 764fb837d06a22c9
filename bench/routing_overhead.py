"""Gateway overhead: added TTFT in front of a fast fake upstream (TTFT 0, 1 ms/token,
16 tokens) at 64 concurrent streams: direct to the upstream, through redline, and through
LiteLLM's proxy, all in the same run on the same upstream. LiteLLM lives in its own venv
(`python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install 'litellm[proxy]'`).
Each target is measured in steady state: after a warm-up run, a closed loop whose first
4 x concurrency requests (the ramp, where every client starts in the same millisecond)
are left out. `--tpot-jitter` draws each upstream gap from tpot ± jitter, so that the
streams drift apart as real ones do; without it, identical requests stay in lockstep and
all clients restart together every answer (a burst of 64 new requests at once).
`--gateway-nice -5` gives both gateways (redline and LiteLLM alike) a higher scheduling
priority than the load generator and the upstream, as if they had cores of their own.
Usage: flock /tmp/redline-cpu.lock .venv/bin/python bench/routing_overhead.py
       .venv/bin/python bench/routing_overhead.py --tpot 0.02 --tpot-jitter 0.01 --tokens 32
       .venv/bin/python bench/routing_overhead.py --tpot 0.02 --tpot-jitter 0.01 --tokens 32 --gateway-nice -5
       .venv/bin/python bench/routing_overhead.py --tpot 0.02 --tpot-jitter 0.01 --tokens 32 --probes 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, closed_loop, free_port, summary  # noqa: E402

KEY = "sk-bench-" + secrets.token_hex(16)


def litellm(procs: Procs, upstream: str, venv: Path, cpus: set[int] | None = None,
            nice: int = 0) -> str:
    port = free_port()
    cfg = {"model_list": [{"model_name": "m", "litellm_params": {
        "model": "openai/m", "api_base": f"{upstream}/v1", "api_key": "none"}}],
        "litellm_settings": {"drop_params": True},
        "general_settings": {"master_key": KEY}}  # it refuses to start without one
    path = procs.tmp / "litellm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return procs.start([str(venv / "bin" / "litellm"), "--config", str(path), "--port", str(port),
                        "--num_workers", "1"], f"http://127.0.0.1:{port}", "/health/liveliness", cpus,
                       nice)


async def run(n: int, concurrency: int, venv: Path | None, tpot: float = 0.001,
              tokens: int = 16, pin: bool = False, jitter: float = 0.0,
              nice: int = 0, probes: int = 0) -> dict[str, object]:
    gateway_cpus = None
    if pin:  # the load generator and the upstream on CPU 0 (children inherit it)
        os.sched_setaffinity(0, {0})
        gateway_cpus = {1}
    procs = Procs()
    try:
        up = procs.upstream(ttft=0.0, tpot=tpot, tpot_jitter=jitter)
        targets = {"direct": up,
                   "redline": procs.gateway([{"name": "m", "backend": "openai", "url": up}],
                                            cpus=gateway_cpus, nice=nice, routing={"classifier": "off"})}
        if venv is not None and (venv / "bin" / "litellm").exists():
            targets["litellm"] = litellm(procs, up, venv, gateway_cpus, nice)
        body = {"model": "m", "max_tokens": tokens, "messages": [{"role": "user", "content": "hi"}]}
        out: dict[str, object] = {}
        for name, url in targets.items():
            auth = {"Authorization": f"Bearer {KEY}"} if name == "litellm" else None
            await closed_loop(url, [body] * 200, concurrency, auth)  # warm up (JIT caches, pools)
            # steady state: the loop's first requests (all clients at once) are left out
            main = closed_loop(url, [body] * n, concurrency, auth, warmup=4 * concurrency)
            if probes and name != "direct":
                # direct requests to the upstream at the same moments (see --probes)
                probe = closed_loop(up, [body] * max(1, n * probes // concurrency), probes,
                                    warmup=4 * probes)
                res, probed = await asyncio.gather(main, probe)
            else:
                res, probed = await main, []
            ok = [r for r in res if r.ok]
            out[name] = {"answered": len(ok), "ttft": summary([r.ttft for r in ok]),
                         "total": summary([r.total for r in ok])}
            if probed:
                t, d = out[name]["ttft"], summary([r.ttft for r in probed if r.ok])  # type: ignore[index]
                out[name]["probe"] = {"direct_ttft": d, "added_ttft_ms": {  # type: ignore[index]
                    q: (t[q] - d[q]) * 1000 for q in ("p50", "p99")}}
        direct = out["direct"]["ttft"]  # type: ignore[index]
        for name in targets:
            if name != "direct":
                t = out[name]["ttft"]  # type: ignore[index]
                out[name]["added_ttft_ms"] = {q: (t[q] - direct[q]) * 1000 for q in ("p50", "p99")}  # type: ignore[index]
        return out
    finally:
        procs.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=3000)
    p.add_argument("-c", "--concurrency", type=int, default=64)
    p.add_argument("--litellm-venv", default="/tmp/litellm-venv")
    p.add_argument("--tpot", type=float, default=0.001, help="upstream seconds per token")
    p.add_argument("--tokens", type=int, default=16, help="max_tokens of each request")
    p.add_argument("--tpot-jitter", type=float, default=0.0,
                   help="upstream gaps are tpot ± this: without it, identical requests in a "
                        "closed loop stay in lockstep and all 64 restart in the same millisecond")
    p.add_argument("--pin", action="store_true",
                   help="each gateway on CPU 1, the load generator and the upstream on CPU 0: "
                        "the gateway as if on its own core, as in production (Linux)")
    p.add_argument("--gateway-nice", type=int, default=0,
                   help="each gateway's scheduling priority, e.g. -5: on this box the gateways "
                        "share two cores with the load generator and the upstream, and the "
                        "scheduler's fairness makes the busiest process (the gateway) wait "
                        "for the others; a negative nice stands in for cores of its own "
                        "(needs root)")
    p.add_argument("--probes", type=int, default=0,
                   help="also run this many clients straight to the upstream while each "
                        "gateway is measured, and report the gateway's TTFT minus theirs "
                        "(`probe`): a baseline taken at the same moments, where the separate "
                        "direct phase meets other moments of a noisy machine (the probes "
                        "add their streams to the load)")
    a = p.parse_args()
    venv = Path(a.litellm_venv) if a.litellm_venv else None
    print(json.dumps(asyncio.run(run(a.n, a.concurrency, venv, a.tpot, a.tokens, a.pin, a.tpot_jitter,
                                     a.gateway_nice, a.probes)), indent=2))


if __name__ == "__main__":
    main()
