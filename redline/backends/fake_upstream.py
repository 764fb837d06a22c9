"""A fake OpenAI-compatible engine served over real HTTP, for tests and benchmarks of
the remote backend, pools, hedging, breakers and the planner.

It behaves like a capacity-limited engine (vLLM at its batch limit): at most
`capacity` requests generate at once, the rest wait in FIFO order before their first
token. TTFT and TPOT are drawn from configurable distributions, a share of requests
fail, and it counts what it saw, including requests whose client went away
(`cancelled`), at `GET /stats`; `GET /last` is the last request body it was sent.
With `tokenize` it serves vLLM's `POST /tokenize` too.

It answers in OpenAI's exact shapes (fake_answers.py says what): tool calls streamed
as fragments, logprobs, `n` choices, image parts, response formats, and usage (with
`prompt_tokens_details.cached_tokens` when the spec sets `cached_tokens`).

With `prefix_cache_blocks` it also simulates an engine's prefix cache (vLLM's automatic
prefix caching): the prompt's words are its tokens, cut in blocks of `block_tokens`, each
block's hash chained to the ones before; an LRU of that many blocks is what it holds, the
prompt's longest held run of blocks is its cache hit (reported in `usage` as
`prompt_tokens_details.cached_tokens`, and summed in `/stats` as `prompt_tokens` and
`cached_tokens`), and `prefill_per_token` is paid for the other prompt tokens only.

Continuations (stream migration, routing/migrate.py): a chat request whose last message
is the assistant's with `continue_final_message: true` (vLLM's and SGLang's field;
`add_generation_prompt` must then be false, as vLLM requires), or any final assistant
message with `prefill_assistant` (llama.cpp server's default), is answered with the rest
of the answer to the messages before it: the pieces the assistant message already holds
are not sent again. With `numbered`, the plain answer is "t1 t2 t3 ..." (a lost or
repeated piece shows) and a text completion whose prompt ends with the answer's first
pieces continues after them. `die_at`: a stream is cut (the connection dropped, no
[DONE], like an engine killed mid-generation) just before its answer's piece number
`die_at` + 1, unless the stream began past it (a continuation goes on); a request that
is not streamed is answered whole.

    python -m redline.backends.fake_upstream --port 9001 --ttft 0.1 --tpot 0.01 --capacity 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from redline.backends.fake_answers import Answer, embedding_answer, prompt_words, rerank_answer
from redline.backends.prefix_index import PrefixIndex, chain_hashes


@dataclass
class Dist:
    """A latency distribution: `base` seconds ± `jitter` (uniform), and with probability
    `slow_p` a slow draw of `slow` seconds instead (the long tail)."""

    base: float = 0.0
    jitter: float = 0.0
    slow_p: float = 0.0
    slow: float = 0.0

    def draw(self, rng: random.Random) -> float:
        if self.slow_p and rng.random() < self.slow_p:
            return self.slow
        return max(0.0, self.base + (rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0))


@dataclass
class UpstreamSpec:
    ttft: Dist = field(default_factory=Dist)
    tpot: Dist = field(default_factory=Dist)
    prefill_per_token: float = 0.0  # added to TTFT per prompt word
    capacity: int = 1_000_000  # requests generating at once; the rest queue
    fail_rate: float = 0.0  # answered with 500 before any token
    max_tokens_cap: int | None = None
    seed: int = 0
    cached_tokens: int | None = None  # reported as usage.prompt_tokens_details.cached_tokens
    prefix_cache_blocks: int = 0  # 0: no prefix cache simulated
    block_tokens: int = 16
    numbered: bool = False  # "t1 t2 ..." rather than "tok tok ..."
    die_at: int = 0  # cut a stream after its answer's first `die_at` pieces (0: never)
    prefill_assistant: bool = False  # a final assistant message is continued (llama.cpp)
    tokenize: bool = False  # serves vLLM's POST /tokenize: a prompt's words are its tokens


@dataclass
class Stats:
    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    active: int = 0
    max_active: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens found in the simulated prefix cache
    died: int = 0  # streams cut by `die_at`
    continued: int = 0  # continuations answered


class _Died(Exception):
    """Raised inside a streamed body: the server drops the connection mid-answer."""


def create_upstream(spec: UpstreamSpec, name: str = "fake-upstream") -> Starlette:
    rng = random.Random(spec.seed)
    last_body: list[dict[str, Any]] = []
    slots = asyncio.Semaphore(spec.capacity)
    stats = Stats()
    cache = PrefixIndex(spec.prefix_cache_blocks) if spec.prefix_cache_blocks else None

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model"}]})

    async def stats_route(_: Request) -> Response:
        return JSONResponse(asdict(stats))

    async def reset(_: Request) -> Response:
        for k in asdict(stats):
            setattr(stats, k, 0)
        return JSONResponse({"ok": True})

    async def chat(request: Request) -> Response:
        return await _generate(request, chat=True)

    async def text(request: Request) -> Response:
        return await _generate(request, chat=False)

    async def _generate(request: Request, chat: bool) -> Response:
        body = await request.json()
        last_body[:] = [body]
        stats.requests += 1
        if spec.fail_rate and rng.random() < spec.fail_rate:
            stats.failed += 1
            return JSONResponse({"error": {"message": "injected failure", "type": "server_error",
                                           "param": None, "code": None}}, status_code=500)
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if spec.max_tokens_cap:
            n = min(n, spec.max_tokens_cap)
        words = prompt_words(body, chat)
        base, prefix = _continuation(body, chat, spec)
        if chat and base is not body and body.get("add_generation_prompt", True):
            return JSONResponse({"error": {  # vLLM's refusal of both at once
                "message": "Cannot set both `continue_final_message` and "
                           "`add_generation_prompt` to True.",
                "type": "BadRequestError", "param": None, "code": 400}}, status_code=400)
        cached = 0
        if cache is not None:  # the simulated engine's prefix cache
            blocks = _token_blocks(_prompt_tokens(body, chat), spec.block_tokens)
            cached = cache.match(blocks) * spec.block_tokens
            cache.add(blocks)
        stats.prompt_tokens += words
        stats.cached_tokens += cached
        start = 0  # answer pieces sent before (by another replica): a continuation
        if base is not body or (spec.numbered and not chat):
            # room for every piece the prefix may hold (each is at least one character)
            room = n + len(prefix if chat else str(body.get("prompt") or ""))
            answer = Answer(base, chat, room, words, cached if cache is not None else
                            spec.cached_tokens, f"call_{rng.getrandbits(48):012x}", spec.numbered)
            skip = answer.suffix_steps(str(body.get("prompt") or "")) if not chat else 0
            start = answer.continued(prefix if chat else "".join(
                str(p) for p, _ in answer.choices[0].steps[:skip]), n)
            if start or base is not body:
                stats.continued += 1
        else:
            answer = Answer(body, chat, n, words, cached if cache is not None else spec.cached_tokens,
                            f"call_{rng.getrandbits(48):012x}", spec.numbered)
        ttft = spec.ttft.draw(rng) + spec.prefill_per_token * max(0, words - cached)
        tpots = [spec.tpot.draw(rng) for _ in range(max(0, answer.steps - 1))]
        gen = _events(answer, ttft, tpots, start if body.get("stream") else None)
        if not body.get("stream"):
            async for _ in gen:
                pass
            return JSONResponse(answer.whole())
        return StreamingResponse(gen, media_type="text/event-stream")

    async def _events(answer: Answer, ttft: float, tpots: list[float],
                      start: int | None = 0) -> Any:
        """`start`: answer pieces sent before this stream (None: not streamed, never cut)."""
        finished = False
        async with slots:
            stats.active += 1
            stats.max_active = max(stats.max_active, stats.active)
            try:
                await asyncio.sleep(ttft)
                for i in range(answer.steps):
                    if i:
                        await asyncio.sleep(tpots[i - 1])
                    if spec.die_at and start is not None and start < spec.die_at == start + i:
                        stats.died += 1
                        raise _Died(f"died after {spec.die_at} pieces")
                    for chunk in answer.step(i):
                        yield f"data: {json.dumps(chunk)}\n\n"
                for chunk in answer.tail():
                    yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"
                finished = True
                stats.completed += 1
            finally:
                stats.active -= 1
                if not finished:
                    stats.cancelled += 1

    async def embeddings(request: Request) -> Response:
        body = await request.json()
        last_body[:] = [body]
        return JSONResponse(embedding_answer(body))

    async def rerank(request: Request) -> Response:
        body = await request.json()
        last_body[:] = [body]
        if not body.get("documents"):
            return JSONResponse({"error": {"message": "documents is empty", "type": "BadRequestError",
                                           "code": 400}}, status_code=400)
        return JSONResponse(rerank_answer(body))

    async def tokenize(request: Request) -> Response:
        """vLLM's /tokenize, counting as usage counts here (a word a token)."""
        body = await request.json()
        last_body[:] = [body]
        words = prompt_words(body, "messages" in body)
        return JSONResponse({"count": words, "max_model_len": 4096,
                             "tokens": list(range(words)), "token_strs": None})

    async def last(_: Request) -> Response:
        return JSONResponse(last_body[0] if last_body else None)

    app = Starlette(routes=[
        Route("/v1/models", models), Route("/stats", stats_route), Route("/last", last),
        Route("/reset", reset, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", text, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        *(Route(p, rerank, methods=["POST"]) for p in ("/rerank", "/v1/rerank", "/v2/rerank")),
        Route("/readyz", lambda _: JSONResponse({"ok": True})),
        *([Route("/tokenize", tokenize, methods=["POST"])] if spec.tokenize else []),
    ])
    app.state.stats = stats
    return app


def _continuation(body: dict[str, Any], chat: bool,
                  spec: UpstreamSpec) -> tuple[dict[str, Any], str]:
    """(the request whose answer is continued, the text already generated): for a chat
    continuation, the body without its final assistant message; else the body itself."""
    messages = body.get("messages") or []
    if not chat or not messages or messages[-1].get("role") != "assistant":
        return body, ""
    if not (body.get("continue_final_message") or spec.prefill_assistant):
        return body, ""
    base = {k: v for k, v in body.items()
            if k not in ("continue_final_message", "add_generation_prompt")}
    base["messages"] = messages[:-1]
    return base, str(messages[-1].get("content") or "")


def _prompt_tokens(body: dict[str, Any], chat: bool) -> list[str]:
    """The prompt's words: its tokens here."""
    if chat:
        return " ".join(str(m.get("content") or "") for m in body.get("messages") or []).split()
    return str(body.get("prompt") or "").split()


def _token_blocks(tokens: list[str], block_tokens: int) -> list[bytes]:
    n = len(tokens) // block_tokens
    return chain_hashes(" ".join(tokens[i * block_tokens:(i + 1) * block_tokens]).encode()
                        for i in range(n))


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9001)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--ttft-jitter", type=float, default=0.0)
    p.add_argument("--slow-p", type=float, default=0.0, help="share of slow first tokens")
    p.add_argument("--slow", type=float, default=0.0, help="TTFT of a slow one, seconds")
    p.add_argument("--tpot", type=float, default=0.01)
    p.add_argument("--tpot-jitter", type=float, default=0.0,
                   help="each gap between tokens is tpot ± this (uniform): streams drift apart")
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix-cache-blocks", type=int, default=0,
                   help="simulate a prefix cache of this many blocks (0: none)")
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--numbered", action="store_true", help='answer "t1 t2 ..." (not "tok tok")')
    p.add_argument("--die-at", type=int, default=0,
                   help="cut every stream after its answer's first N pieces (0: never)")
    p.add_argument("--prefill-per-token", type=float, default=0.0,
                   help="seconds of TTFT per prompt token not in the prefix cache")
    a = p.parse_args()
    spec = UpstreamSpec(ttft=Dist(a.ttft, a.ttft_jitter, a.slow_p, a.slow), tpot=Dist(a.tpot, a.tpot_jitter),
                        prefill_per_token=a.prefill_per_token,
                        capacity=a.capacity, fail_rate=a.fail_rate, seed=a.seed,
                        prefix_cache_blocks=a.prefix_cache_blocks, block_tokens=a.block_tokens,
                        numbered=a.numbered, die_at=a.die_at)
    uvicorn.run(create_upstream(spec), host=a.host, port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
