"""The one command line: `redline serve | bench | ...`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from redline.config import load_config

if TYPE_CHECKING:
    from redline.cache.evaluate import Pair

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[Command, Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, help: str) -> Callable[[Callable[[argparse.ArgumentParser], None]],
                                              Callable[[Command], Command]]:
    def with_args(add_args: Callable[[argparse.ArgumentParser], None]) -> Callable[[Command], Command]:
        def register(fn: Command) -> Command:
            COMMANDS[name] = (fn, add_args, help)
            return fn
        return register
    return with_args


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--host")
    p.add_argument("--port", type=int)


@command("serve", "run the server")(_serve_args)
def serve(args: argparse.Namespace) -> int:
    import asyncio

    from redline.api.app import create_app
    from redline.api.server import build
    from redline.api.services import services_of
    from redline.tuning import tune_collector_when, tune_threads

    overrides = {}
    cfg = load_config(args.config)
    if args.host or args.port is not None:
        server = cfg.server.model_copy(update={k: v for k, v in
                                               (("host", args.host), ("port", args.port)) if v is not None})
        overrides["server"] = server
        cfg = cfg.model_copy(update=overrides)
    logging.basicConfig(level=cfg.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_threads(cfg)  # this process's BLAS threads, before anything loads BLAS
    app = create_app(cfg)
    # header/body timeouts, connection cap, drain on SIGTERM (cfg.limits)
    http = build(app, cfg.server.host, cfg.server.port, cfg.limits, cfg.server.log_level)

    async def main() -> None:
        # the collector, once the models are loaded (redline/tuning.py)
        tuner = asyncio.create_task(tune_collector_when(services_of(app).started))
        try:
            await http.serve()
        finally:
            tuner.cancel()

    with asyncio.Runner(loop_factory=http.config.get_loop_factory()) as runner:
        runner.run(main())
    return 0


def _bench_args(p: argparse.ArgumentParser) -> None:
    from redline.bench.cli import add_args

    add_args(p)


@command("bench", "streaming load generator: TTFT, TPOT, ITL, E2E, tok/s")(_bench_args)
def bench(args: argparse.Namespace) -> int:
    from redline.bench.cli import run

    return run(args)


def _worker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (the server's: same store.url, models)")


@command("worker", "run queued jobs and batches (no HTTP); with store.url = redis://… "
         "any number share the queue")(_worker_args)
def worker(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from redline.api.app import create_app
    from redline.tuning import tune_threads

    cfg = load_config(args.config)
    cfg = cfg.model_copy(update={"jobs": cfg.jobs.model_copy(update={"worker_in_server": True})})
    tune_threads(cfg)
    logging.basicConfig(level=cfg.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the same app as `serve` (pipeline, cache, routing), run for its lifespan only
    app = create_app(cfg)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with app.router.lifespan_context(app):
            await stop.wait()  # then running jobs go back to the queue

    asyncio.run(run())
    return 0


def _optimize_args(p: argparse.ArgumentParser) -> None:
    from redline.optimize.cli import add_args

    add_args(p)


@command("optimize", "quantization ladder behind an accuracy gate: keeps the fastest variant "
         "that loses no more than --max-quality-loss")(_optimize_args)
def optimize(args: argparse.Namespace) -> int:
    from redline.optimize.cli import run

    return run(args)


def _precompute_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (its store is where answers go)")
    p.add_argument("--from", dest="source", required=True,
                   help="JSONL of request bodies, or plain text with one question per line")
    p.add_argument("--top", type=int, default=100, help="answer the N most frequent questions")
    p.add_argument("--url", help="a running server to ask instead of an in-process one")
    p.add_argument("--api-key", help="ask as this key (answers are cached per tenant)")
    p.add_argument("--model", default="auto", help="model for plain-text questions")
    p.add_argument("--max-tokens", type=int, default=256, help="max_tokens for plain-text questions")


@command("precompute", "answer a log's most frequent questions into the cache")(_precompute_args)
def precompute(args: argparse.Namespace) -> int:
    import asyncio

    import httpx

    from redline.cache.precompute import Outcome, answer, most_frequent, read_requests

    cfg = load_config(args.config)
    top = most_frequent(read_requests(args.source, args.model, args.max_tokens), args.top)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if cfg.store.url and cfg.store.url.startswith("memory:") and not args.url:
        print("warning: store.url is memory://, answers vanish when this command ends")

    async def run() -> Outcome:
        if args.url:
            async with httpx.AsyncClient(base_url=args.url, timeout=600) as client:
                return await answer(client, top, headers)
        from redline.api.inprocess import in_process_client

        async with in_process_client(cfg) as client:
            return await answer(client, top, headers)

    outcome = asyncio.run(run())
    print(f"asked {len(top)} distinct questions (of {sum(n for n, _ in top)} in the log's top "
          f"{args.top}): {dict(outcome.results)}")
    return 0


def _eval_cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("pairs", nargs="?", help="TSV: label(same|diff) [kind] question_a question_b; "
                   "none: the repository's tuning part next to its test part")
    p.add_argument("--config", help="YAML config file (cache.similarity_threshold, cache.guard)")
    p.add_argument("--threshold", type=float, help="override cache.similarity_threshold")
    p.add_argument("--sweep", action="store_true", help="also print a threshold sweep")
    p.add_argument("--choose", type=float, metavar="PRECISION",
                   help="the tuning step: print the lowest threshold with this precision on "
                   "the tuning part (reads no test part)")


@command("eval-cache", "precision, recall and wrong-hit rate of semantic hits on labelled pairs")(
    _eval_cache_args)
def eval_cache(args: argparse.Namespace) -> int:
    from redline.cache.confirm import load_model as load_confirm_model
    from redline.cache.embedder import load_minilm, resolve_dtype
    from redline.cache.evaluate import TEST_PAIRS, TUNE_PAIRS, load_pairs, report, similarities, split_report

    cfg = load_config(args.config).cache
    if args.threshold is not None:
        cfg = cfg.model_copy(update={"similarity_threshold": args.threshold})
    # no engine in this process; the arithmetic the server's cache uses
    embedder = load_minilm(cfg.embedder_path, 0, resolve_dtype(cfg.embedder_dtype), traced=True)
    # the check's model even where it is off, so the report shows it both ways
    strong = load_confirm_model(cfg.model_copy(update={"confirm": True}), 0)
    if args.choose is not None:
        from redline.cache.evaluate import choose_confirm, choose_threshold

        t, s = choose_threshold(cfg, embedder, args.choose)
        print(f"threshold {t:.2f}: tuning part precision {s.precision:.3f}, recall {s.recall:.3f}"
              f" ({s.hits} hits); set cache.similarity_threshold: {t:.2f}")
        if strong is not None:
            cfg = cfg.model_copy(update={"similarity_threshold": t})
            floor, bar, s = choose_confirm(cfg, embedder, strong, args.choose)
            print(f"borderline check from {floor:.2f}, confirmed at {bar:.2f}: tuning part "
                  f"precision {s.precision:.3f}, recall {s.recall:.3f} ({s.hits} hits); set "
                  f"cache.confirm_floor: {floor:.2f}, cache.confirm_threshold: {bar:.2f}")
        return 0
    if args.pairs:
        pairs = load_pairs(args.pairs)
        print(report(pairs, similarities(pairs, embedder, strong), cfg, sweep=args.sweep))
        return 0
    tune = [p for path in TUNE_PAIRS for p in load_pairs(path)]
    test = load_pairs(TEST_PAIRS)
    tune_sims = similarities(tune, embedder, strong)
    print(split_report(tune, tune_sims, test, similarities(test, embedder, strong), cfg))
    if args.sweep:
        print("\nsweep, tuning part only (thresholds are chosen here, never on the test part):")
        print(report(tune, tune_sims, cfg, sweep=True))
    return 0


def _eval_judge_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="an OpenAI-compatible server that serves the model "
                   "(e.g. a running `redline serve`; its cache is bypassed)")
    p.add_argument("--model", required=True, help="the model whose answers the judge compares")
    p.add_argument("--config", help="YAML config file (cache.shadow_agreement, cache.embedder_path)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--limit", type=int, default=0, help="first N pairs of each part (0: all)")
    p.add_argument("--api-key", default=None, help="a bearer key for the server")
    p.add_argument("--write", metavar="BUNDLED", help="keep the tuning part's rates for this "
                   "bundled model in redline/cache/data/judge.json (the test part is only printed)")
    p.add_argument("--judge", choices=("answers", "questions"), default="answers",
                   help="answers: compare the model's answers to each pair; questions: ask the "
                   "model whether the two questions are the same (cache.judge)")


@command("eval-judge", "how often the error budget's judge errs on a model's answers, on the "
         "tuning part and the test part of the labelled pairs")(_eval_judge_args)
def eval_judge(args: argparse.Namespace) -> int:
    import asyncio

    import httpx

    from redline.cache import judge
    from redline.cache.embedder import load_minilm, resolve_dtype
    from redline.cache.evaluate import TEST_PAIRS, TUNE_PAIRS, load_pairs
    from redline.cache.judge_eval import answers, rates, table, write

    cfg = load_config(args.config).cache
    tune = [p for path in TUNE_PAIRS for p in load_pairs(path)]
    test = load_pairs(TEST_PAIRS)
    if args.limit:
        tune, test = tune[:args.limit], test[:args.limit]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.judge == "questions":
        return _eval_question_judge(args, tune, test, headers)
    questions = sorted({q for p in tune + test for q in (p.a, p.b)})

    async def ask() -> dict[str, str]:
        async with httpx.AsyncClient(base_url=args.url, timeout=600, headers=headers) as client:
            return await answers(client, args.model, questions, args.max_tokens, args.concurrency)

    said = asyncio.run(ask())
    embedder = load_minilm(cfg.embedder_path, 0, resolve_dtype(cfg.embedder_dtype), traced=True)
    agreement = cfg.shadow_agreement
    print(f"model {args.model}, {len(questions)} questions answered (max_tokens "
          f"{args.max_tokens}, temperature 0); judge agreement {agreement:.2f}")
    found = {name: rates(pairs, said, embedder, agreement)
             for name, pairs in (("tuning", tune), ("test", test))}
    print(table(found))
    t = found["tuning"]
    print(f"set models[].judge_false_wrong: {t.false_wrong:.3f}, judge_true_wrong: "
          f"{t.true_wrong:.3f} for {args.model} (from the tuning part)")
    if args.write:
        write(judge.CALIBRATION, args.write, agreement, t, args.model, args.max_tokens)
        print(f"written for bundled {args.write!r} to {judge.CALIBRATION}")
    return 0


def _eval_question_judge(args: argparse.Namespace, tune: list[Pair], test: list[Pair],
                         headers: dict[str, str]) -> int:
    import asyncio

    import httpx

    from redline.cache import judge
    from redline.cache.judge_eval import choose_cut, question_odds, question_rates, table, write_questions

    async def ask() -> dict[tuple[str, str], float | None]:
        async with httpx.AsyncClient(base_url=args.url, timeout=600, headers=headers) as client:
            return await question_odds(client, args.model, tune + test, args.concurrency)

    odds = asyncio.run(ask())
    cut = choose_cut(tune, odds)  # the tuning part only
    none = sum(o is None for o in odds.values())
    print(f"model {args.model} as the questions judge, {len(odds)} pairs asked ({none} with no "
          f"yes or no); cut {cut:+.3f} (log-odds of yes, chosen on the tuning part)")
    found = {name: question_rates(pairs, odds, cut)
             for name, pairs in (("tuning", tune), ("test", test))}
    print(table(found))
    t = found["tuning"]
    print(f"set cache.judge_threshold: {cut:.3f}, judge_false_wrong: {t.false_wrong:.3f}, "
          f"judge_true_wrong: {t.true_wrong:.3f} for {args.model} (from the tuning part)")
    if args.write:
        write_questions(judge.CALIBRATION, args.write, cut, t, args.model)
        print(f"written for bundled {args.write!r} to {judge.CALIBRATION}")
    return 0


def _eval_router_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (routing.classifier, classifier_min_confidence)")
    p.add_argument("--classifier", choices=("features", "embeddings"),
                   help="override routing.classifier")
    p.add_argument("--min-confidence", type=float, help="override routing.classifier_min_confidence")


@command("eval-router", "the tier classifier: accuracy and per-class precision/recall on the "
         "tuning part (out-of-fold) and on the test part")(_eval_router_args)
def eval_router(args: argparse.Namespace) -> int:
    from redline.routing.classifier import EmbeddingFeatures, text_features
    from redline.routing.evaluate import report

    cfg = load_config(args.config).routing
    kind = args.classifier or cfg.classifier
    featurize = EmbeddingFeatures(0) if kind == "embeddings" else text_features
    min_confidence = cfg.classifier_min_confidence if args.min_confidence is None else args.min_confidence
    print(f"classifier: {kind}")
    print(report(featurize, min_confidence, cfg.classifier_default_tier)[2])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="redline", description="low-latency LLM serving")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, add_args, help_text) in COMMANDS.items():
        add_args(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    fn = COMMANDS[args.command][0]
    return fn(args)


if __name__ == "__main__":
    sys.exit(main())
