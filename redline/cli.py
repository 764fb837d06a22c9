"""The one command line: `redline serve | bench | ...`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from redline.config import load_config

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
    from redline.api.app import create_app
    from redline.api.server import run

    overrides = {}
    cfg = load_config(args.config)
    if args.host or args.port is not None:
        server = cfg.server.model_copy(update={k: v for k, v in
                                               (("host", args.host), ("port", args.port)) if v is not None})
        overrides["server"] = server
        cfg = cfg.model_copy(update=overrides)
    logging.basicConfig(level=cfg.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(cfg)
    # header/body timeouts, connection cap, drain on SIGTERM (cfg.limits)
    run(app, cfg.server.host, cfg.server.port, cfg.limits, cfg.server.log_level)
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

    cfg = load_config(args.config)
    cfg = cfg.model_copy(update={"jobs": cfg.jobs.model_copy(update={"worker_in_server": True})})
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
