"""One typed configuration, parsed once at the edge.

Sources, later wins: defaults < YAML file (`--config`) < environment variables
`REDLINE_<SECTION>__<KEY>` (e.g. `REDLINE_SERVER__PORT=9000`,
`REDLINE_STORE__URL=redis://localhost:6379/0`). This is the only module that reads
the environment. Each component is handed its own section, never the whole config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_body_bytes: int = Field(1 << 20, ge=1024, description="413 above this request size")
    data_dir: str = Field(".redline", description="SQLite files and assembled models live here")
    log_level: str = "info"
    max_n: int = Field(8, ge=1, le=128, description="most choices (`n`) one request may ask for")
    library_threads: int | None = Field(
        None, ge=0, description="threads that torch (the MiniLM embedder) and BLAS (numpy's "
        "OpenBLAS: the semantic index) may use in this process; 0 = their defaults (every core); "
        "None = 1 when a local model runs in this process, else their defaults. llama.cpp keeps "
        "every core busy, and these libraries' idle threads spin or make its threads sleep at "
        "barriers: measured on 2 cores, 15 % (torch) and 60 % (OpenBLAS) of batched decoding "
        "lost, see docs/BENCHMARKS.md")


Capability = Literal["chat", "completions", "tools", "json_schema", "vision", "logprobs"]
# a remote OpenAI-compatible engine is asked for everything: the upstream decides
REMOTE_CAPABILITIES: frozenset[str] = frozenset(
    ("chat", "completions", "tools", "json_schema", "vision", "logprobs"))
# what the embedded engine can serve on a local model (grows with the engine)
LOCAL_CAPABILITIES: frozenset[str] = frozenset(("chat", "completions", "logprobs", "json_schema"))
# bundled models trained on the tool-call format the embedded engine renders (engine/tools.py);
# another local model serves tools only where its `capabilities` list them
TOOL_MODELS: frozenset[str] = frozenset(("qwen2.5-coder-0.5b-instruct",))


class PlacementConfig(_Section):
    """How a model with several replicas picks one for a request (backends/pool.py)."""

    policy: Literal["prefix", "least_loaded", "round_robin"] = Field(
        default="prefix",
        description="prefix: the replica whose engine probably holds the longest part of the "
        "prompt, against its load (bounded); least_loaded: fewest requests in flight; "
        "round_robin: in turn. Each is measured in docs/BENCHMARKS.md (prefix routing)")
    block_tokens: int = Field(default=16, ge=1, description="tokens per cached block, as the "
                              "engine caches them (vLLM and SGLang: 16)")
    chars_per_token: float = Field(default=4.0, gt=0, description="the prompt is hashed as "
                                   "UTF-8 text in blocks of block_tokens x this many bytes")
    cache_blocks: int | None = Field(
        default=None, ge=1,
        description="blocks each replica's engine keeps (the index evicts like it); None: "
        "n_ctx x n_seq_max / block_tokens for a local model, 16384 for a remote one")
    load_bound: float = Field(default=1.25, ge=1.0, description="no replica is given a request "
                              "that takes it above this multiple of the mean load (bounded load)")
    load_floor: int = Field(default=2, ge=1, description="a replica below this many requests in "
                            "flight is never over the bound (at low load a multiple of the mean "
                            "is < 2)")
    load_cost_tokens: float | None = Field(
        default=None, ge=0, description="one request in flight on a replica weighs as much as this "
        "many prompt tokens it must compute. None: 1024 for embedded engines (on a CPU each request "
        "in flight slows every step, and the host prompt cache keeps most prefixes anyway), 256 for "
        "remote ones (measured in docs/BENCHMARKS.md, prefix routing)")
    sessions: bool = Field(default=True, description="a request with a session key (X-Session-ID, "
                           "else `user`) goes to the replica its session used, while that one "
                           "is healthy")
    session_capacity: int = Field(default=100_000, ge=1, description="sessions remembered (LRU)")
    migrate: Literal["auto", "continue_final_message", "prefill", "text_only", "off"] = Field(
        default="auto",
        description="a stream whose replica dies mid-answer continues on another replica "
        "(backends/continuation.py): continue_final_message (vLLM, SGLang), prefill (llama.cpp's "
        "server), text_only (completions only; chat streams end with an error event), off. "
        "auto: continue_final_message, which the embedded engine and vLLM take")

    def load_cost(self, local: bool) -> float:
        """What one request in flight weighs in placement, in prompt tokens, for a pool of
        embedded (`local`) or remote engines."""
        if self.load_cost_tokens is not None:
            return self.load_cost_tokens
        return 1024.0 if local else 256.0


class SpeculativeConfig(_Section):
    """Speculative decoding on the embedded engine without a draft model: n-gram prompt
    lookup (engine/speculative.py). Every request, greedy or sampled: the answer's
    distribution is unchanged (a seeded one gives the same text)."""

    method: Literal["ngram", "off"] = "ngram"
    max_draft: int = Field(4, ge=1, le=64, description="draft tokens per step, at most (the "
                           "length adapts per sequence to what the model accepts)")
    min_match: int = Field(2, ge=1, description="shortest suffix of the sequence looked up")
    max_match: int = Field(4, ge=1, description="longest suffix looked up (tried first)")
    max_decoding: int = Field(2, ge=1, description="draft only while at most this many "
                              "sequences decode (a busy batch has no compute to spare)")

    @model_validator(mode="after")
    def _matches(self) -> SpeculativeConfig:
        if self.min_match > self.max_match:
            raise ValueError("speculative: min_match must not exceed max_match")
        return self


class ModelConfig(_Section):
    """One model the server offers. `backend: local` runs it in the embedded engine."""

    name: str
    backend: Literal["local", "openai"] = "local"
    capabilities: list[Capability] | None = Field(
        None, description="what this model serves; a request that needs anything else is a 400 "
        "with `param` set, and routing (`auto`, fallbacks) only picks models that have it. None: "
        "every capability for a remote backend (the upstream decides), what the embedded engine "
        "can serve for a local one. A base model lists no `chat`: it serves completions only")
    # local: a GGUF path, or a bundled model name (see redline.models)
    path: str | None = None
    bundled: str | None = None
    chat_template: Literal["auto", "builtin", "gemma", "chatml"] = Field(
        "auto", description="auto: the Jinja chat template the GGUF carries, rendered as "
        "transformers and vLLM render it (engine/template.py); builtin: llama.cpp's own rendering "
        "of the template it recognises in the file (role and text only: no default system turn, "
        "no native tool prompt); gemma, chatml: that built-in template")
    weights: str = Field("as-shipped", description="'as-shipped'; a GGUF type (BF16, F16, Q8_0, "
                         "...) to convert the file to once, at first load (kept in data_dir/models);"
                         " or 'auto': BF16 where the CPU has AVX512-BF16 (llama.cpp's fastest "
                         "batched path there), else as shipped. Check a type with `redline "
                         "optimize` first: it measures the quality loss")
    n_ctx: int = Field(2048, ge=64, description="context per sequence, tokens")
    n_seq_max: int = Field(8, ge=1, le=64, description="sequences decoded together")
    n_batch: int = Field(512, ge=32, description="tokens per decode step (chunked prefill)")
    n_threads: int = Field(0, ge=0, description="0 = all cores")
    warmup: bool = True
    prefix_reuse: bool = True
    trust_request_chat_template: bool = Field(
        False, description="take a request's own `chat_template` (Jinja, rendered in the same "
        "sandbox as the model's), as vLLM's --trust-request-chat-template does; else such a "
        "request is a 400")
    prefix_cache_tokens: int | None = Field(
        None, ge=0, description="KV cells that idle sequences keep for prefix reuse, all together; "
        "past it the least recently used are forgotten first (copied to the host cache first). "
        "None: n_ctx (one context's worth). Every decode step attends over all the cells in use: "
        "2,048 idle cells made one stream's TPOT 12-18 % slower here; fewer cost less, but then "
        "identical greedy requests may get different answers more often (the KV layout changes "
        "the attention's float sums)")
    prefix_cache_tokens_decoding: int | None = Field(
        0, ge=0, description="the same bound when a newcomer has taken what it reuses and "
        "while sequences decode, if they hold at most half the slots: a slot free for 50 ms "
        "gives its cells past it to the host cache (the idle engine has copied them there "
        "already), from which a prompt that wants them copies them back (1.6 ms for 600 "
        "tokens). Idle cells slow every decode step (2,100 of them: one stream 7-12 % slower "
        "here); an idle engine keeps them for the next request, and with most slots busy a "
        "freed slot is taken again soon. None: prefix_cache_tokens")
    host_cache_mb: int = Field(
        1024, ge=0, description="host memory for prompts' KV state that the KV cells let go "
        "(past prefix_cache_tokens): a prompt that shares a longer prefix with a saved one is "
        "copied back instead of computed (llama-server's --cache-ram); least recently used out "
        "first; 0: off")
    judge_false_wrong: float | None = Field(
        None, ge=0.0, le=1.0, description="the error budget's judge on this model's answers: "
        "the share of right semantic hits it calls wrong (`redline eval-judge` measures it). "
        "None: the bundled model's measured value, else 0 (the judge is taken at its word)")
    judge_true_wrong: float | None = Field(
        None, ge=0.0, le=1.0, description="the same judge: the share of wrong semantic hits it "
        "calls wrong. None: the bundled model's measured value, else 1")
    size_rank: int = Field(1, description="1 = smallest; routing orders models by it")
    scheduling: Literal["priority", "fcfs"] = Field(
        "priority", description="local: 'priority' prefills tier S before waiting A and B work, "
        "and under pressure a tier-B sequence gives its slot to a tier-S one (preempted, it is "
        "recomputed later and its stream goes on); 'fcfs': first come, first served. Either way "
        "a stream nobody reads (its client left) yields its slot to one that somebody does")
    prefill_slack: float | None = Field(
        0.5, gt=0, description="local: while streams decode, a step carries only the prompt "
        "tokens that fit in this share of a decode-only step (measured), so their inter-token "
        "latency stays within (1 + slack)x their TPOT; None: the rest of n_batch every step")
    prefill_floor_tokens: int = Field(
        8, ge=1, description="local: prompt tokens a step carries at least while streams "
        "decode (prefill_slack's budget never goes below it). 8: the decoding streams' ITL p99 "
        "during a 1,500-token prefill was ~3x their TPOT here, the newcomer's TTFT ~10 s; 1: "
        "2.0x, and ~19 s (docs/BENCHMARKS.md)")
    prefill_protect_share: float = Field(
        0.5, ge=0.0, le=1.0, description="local: prefill_slack holds a long prompt back only "
        "while at least this share of the slots decode (at least one); beside fewer, it takes "
        "the rest of n_batch every step: their tokens wait for its chunks, its first token "
        "does not wait for theirs. 0: always held back")
    prefill_yield_to_waiting: bool = Field(
        True, description="local: prefill_slack holds a long prompt back (on the side or in "
        "chunks) only while it waits alone for its first token: with another long prompt in "
        "its slot or a request queued for a slot, prompts take the rest of n_batch in turn "
        "and the streams' tokens wait for their chunks, as in llama-server (8 clients with "
        "1,563-token prompts: first token 0.83-0.88x llama-server's instead of 1.9-2.3x, "
        "docs/BENCHMARKS.md). "
        "False: held back whenever prefill_protect_share of the slots decode")
    prefill_side: bool = Field(
        True, description="local: a long prompt that prefill_slack would hold back (at least "
        "prefill_protect_share of the slots decode) runs instead in a context of its own on "
        "a share of the threads (slack / (1 + slack), at least 1, at most half: 1 of 2), in "
        "whole n_batch chunks, while the streams decode on the rest; its cells are then "
        "copied into its slot. 7 streams beside a 1,500-token "
        "prompt: their ITL p99 ~2x their TPOT and its first token in ~5 s, against ~3-4x and "
        "~12 s held back (docs/BENCHMARKS.md). Needs n_threads >= 2; costs a second "
        "context's KV (n_ctx cells) and compute buffers (+76 MB resident for the two default "
        "models)")
    kv_layout: Literal["unified", "per_slot"] = Field(
        "per_slot", description="local: 'per_slot': one KV stream per slot, as llama-server's "
        "-np: a step attends over each sequence's own cells only; a prefix from another slot "
        "is a whole-stream copy, and a batch runs as one forward pass per run of consecutive "
        "slots with equal token counts (throwaway tokens join them where that is cheaper). "
        "'unified': one KV buffer that every slot's cells share (a prefix another slot holds "
        "is reused by a metadata copy, one pass a step); each step attends over every cell in "
        "use, so long prompts at several streams slow every step (a 512-token chunk ~2x with "
        "7 others holding 1,600 cells each; docs/BENCHMARKS.md)")
    speculative: SpeculativeConfig = Field(
        default_factory=lambda: SpeculativeConfig(method="off"),
        description="local: n-gram speculative decoding, e.g. `{method: ngram, max_draft: 4}`; "
        "`off` or `ngram` alone for the method with its defaults. Off by default: on a 2-core "
        "CPU verifying drafts cost more than it saved (docs/BENCHMARKS.md); measure first")
    upstream_priority: Literal["off", "lower-first", "higher-first"] = Field(
        "off", description="openai: the engine runs with priority scheduling (vLLM "
        "`--scheduling-policy priority`: lower-first; SGLang `--enable-priority-scheduling`: "
        "higher-first unless `--schedule-low-priority-values-first`); the request's tier is "
        "sent as its `priority` field (S before A before B). 'off': no field is added")
    # openai: a remote OpenAI-compatible engine
    url: str | None = None
    urls: list[str] = Field(default_factory=list, description="replicas of one model: a pool, "
                            "chosen by `placement` (with `url`, if set)")
    upstream_model: str | None = None
    api_key: str | None = None
    replicas: int = Field(default=1, ge=1, le=64, description="local: engines of this model in "
                          "this process, one pool (each with n_threads threads)")
    placement: PlacementConfig = Field(default_factory=PlacementConfig,
                                       description="replica choice when there are several")
    connect_timeout_s: float = Field(2.0, gt=0, description="to open a connection upstream")
    ttft_timeout_s: float = Field(30.0, gt=0, description="upstream silent this long before "
                                  "its first token: an error (retried)")
    read_timeout_s: float = Field(60.0, gt=0, description="between two chunks once streaming")

    @field_validator("speculative", mode="before")
    @classmethod
    def _speculative_shorthand(cls, value: Any) -> Any:
        return {"method": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _source(self) -> ModelConfig:
        if self.weights not in ("as-shipped", "auto"):
            from redline.models import check_weights_type

            check_weights_type(self.weights)
        if self.backend == "local" and not (self.path or self.bundled):
            raise ValueError(f"model {self.name!r}: a local model needs `path` or `bundled`")
        if self.backend == "openai" and not (self.url or self.urls):
            raise ValueError(f"model {self.name!r}: an openai backend needs `url` or `urls`")
        return self

    def has(self, capability: str) -> bool:
        return capability in self.effective_capabilities()

    def effective_capabilities(self) -> frozenset[str]:
        if self.capabilities is not None:
            return frozenset(self.capabilities)
        if self.backend == "openai":
            return REMOTE_CAPABILITIES
        return LOCAL_CAPABILITIES | ({"tools"} if self.bundled in TOOL_MODELS else set())

    def replica_urls(self) -> list[str]:
        return ([self.url] if self.url else []) + [u for u in self.urls if u != self.url]

    def cache_blocks(self) -> int:
        """Blocks each replica's prefix cache holds, for the pool's index to mirror."""
        p = self.placement
        if p.cache_blocks is not None:
            return p.cache_blocks
        if self.backend == "local":  # a slot keeps its last sequence's KV (engine/scheduler.py)
            return max(1, self.n_ctx * self.n_seq_max // p.block_tokens)
        return 16384

    def load_cost_tokens(self) -> float:
        """What one request in flight weighs in placement, in prompt tokens."""
        return self.placement.load_cost(self.backend == "local")


def _default_models() -> list[ModelConfig]:
    return [
        # auto: BF16 on AVX512-BF16 CPUs; it passes the `redline optimize` gate for SmolLM2
        # (perplexity -0.36 %, same question accuracy) and doubles prefill speed there
        ModelConfig(name="smollm2-135m-instruct", bundled="smollm2-135m-instruct", size_rank=1,
                    weights="auto"),
        # the large model: an instruction-tuned chat model (~3.5× SmolLM2's compute a token).
        # It replaced gemma3-270m here, a base model that does not follow chat turns (still
        # bundled: `bundled: gemma3-270m`, `capabilities: [completions]`)
        ModelConfig(name="qwen2.5-coder-0.5b-instruct", bundled="qwen2.5-coder-0.5b-instruct",
                    size_rank=2),
    ]


class StreamsConfig(_Section):
    resume_grace_s: float = Field(30.0, ge=0, description="generation goes on this long without a client")
    journal_ttl_s: float = Field(600.0, ge=1)
    journal_flush_s: float = Field(0.025, gt=0, description="the journal is written this often: "
                                   "one write (one transaction) takes what every stream produced "
                                   "meanwhile (readers of this replica never wait for it)")
    follow_stall_s: float = Field(60.0, gt=0, description="a resume through another replica gives up "
                                  "when its journal has no new event for this long")
    progress: bool = Field(True, description="chunks carry redline.progress (tokens, expected, eta)")
    journal_live: bool = Field(False, description="journal every stream as it goes (one group write "
                               "every journal_flush_s), with its request: when its gateway dies, a "
                               "resume through another gateway continues the answer "
                               "(streams/takeover.py); off: only streams whose client left are")


class ResponsesConfig(_Section):
    """The Responses API's stored responses (POST /v1/responses with store: true)."""

    ttl_s: float = Field(30 * 24 * 3600.0, gt=0, description="a stored response (and its input "
                         "items) expires this long after it was written")


class TierBudget(_Section):
    """What a tier promises; None means no limit. `max_inflight` is its admission limit."""

    ttft_s: float | None = Field(None, gt=0)
    total_s: float | None = Field(None, gt=0)
    max_inflight: int = Field(64, ge=1, description="more of this tier at once: 503 + Retry-After")


def _default_tiers() -> dict[Literal["S", "A", "B"], TierBudget]:
    return {"S": TierBudget(ttft_s=1.0, total_s=3.0, max_inflight=128),
            "A": TierBudget(ttft_s=3.0, max_inflight=64),
            "B": TierBudget(max_inflight=32)}


def _default_shed_at() -> dict[Literal["S", "A", "B"], float]:
    return {"B": 0.5, "A": 0.8, "S": 1.0}


class RouteRule(_Section):
    """Overrides the classifier: the first rule whose regex matches the last user message wins."""

    match: str
    tier: Literal["S", "A", "B"] | None = None
    model: str | None = None


class RoutingConfig(_Section):
    @field_validator("tiers", "shed_at", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any, info: ValidationInfo) -> Any:
        """Each tier given is merged over its default (a budget field by field), and a
        tier not given keeps its default: a request the router puts in that tier has a
        budget and a shedding point either way."""
        if not isinstance(value, dict):
            return value
        # an environment variable's key comes lowercased (REDLINE_ROUTING__TIERS__A__TTFT_S)
        value = {k.upper() if isinstance(k, str) and k.upper() in ("S", "A", "B") else k: v
                 for k, v in value.items()}
        defaults: dict[Any, Any] = (_default_tiers() if info.field_name == "tiers"
                                    else _default_shed_at())
        out: dict[Any, Any] = {}
        for name, default in defaults.items():
            given = value.get(name)
            if isinstance(given, TierBudget):
                given = given.model_dump(exclude_unset=True)
            if isinstance(default, TierBudget) and isinstance(given, dict):
                out[name] = default.model_dump() | given
            else:
                out[name] = default if given is None else given
        return out | {k: v for k, v in value.items() if k not in out}

    mode: Literal["slo", "fcfs"] = Field(
        "slo", description="fcfs: no tiers, planner, shedding or hedging (the baseline)")
    tiers: dict[Literal["S", "A", "B"], TierBudget] = Field(
        default_factory=_default_tiers, description="each tier's budget; what a config leaves "
        "out (a tier, or a field of one) keeps its default")
    classifier: Literal["features", "embeddings", "off"] = Field(
        "features", description="how `auto` picks tier and model class (off: tier S, default model)")
    classifier_min_confidence: float = Field(
        0.75, ge=0.0, le=1.0, description="below this calibrated confidence the classifier does "
        "not guess: the documented rules decide the tier, else classifier_default_tier (0.75: the "
        "best out-of-fold accuracy on the tuning part, issue 22)")
    classifier_default_tier: Literal["S", "A", "B"] = Field(
        "S", description="the tier when the classifier is unsure and no rule matches")
    rules: list[RouteRule] = Field(default_factory=list)
    fallbacks: dict[str, list[str]] = Field(default_factory=dict,
                                            description="model -> models to try when it fails")
    shed_at: dict[Literal["S", "A", "B"], float] = Field(
        default_factory=_default_shed_at,
        description="shed a tier when requests in flight reach this share of max_inflight")
    max_inflight: int = Field(256, ge=1, description="requests in flight, all tiers")
    hedge: bool = Field(True, description="tier S: a second copy after the replica's p90 TTFT")
    hedge_budget: float = Field(0.1, ge=0, le=1, description="hedges per request, at most")
    hedge_min_delay_s: float = Field(0.02, ge=0)
    retry_budget: float = Field(0.5, ge=0, description="retries per request, at most (token bucket); "
                                "well above the error rate it must ride out (0.3 ran dry at 20 %)")
    max_attempts: int = Field(5, ge=1, description="tries of one request, before its first token")
    breaker_threshold: int = Field(10, ge=1, description="consecutive failures that open a breaker "
                                   "(10: a dead backend, not a flaky one; retries cover those)")
    breaker_ttl_s: float = Field(10.0, gt=0, description="an open breaker tries again after this")
    shorten: bool = Field(True, description="tier S: cap max_tokens so the answer fits its budget")
    quality_total_s: float | None = Field(
        8.0, gt=0, description="`auto` sends a complex request to a larger (slower) model only "
        "while that model is predicted to finish it within this many seconds, its queue and "
        "the shared cores included; else to the one that finishes soonest. None: whenever "
        "it meets the tier's budget")
    quality_headroom: float = Field(
        0.5, gt=0, le=1, description="`auto` pays for a slower local model only while the "
        "local engines used less than this share of the shared cores over the last 10 s "
        "(the soonest to finish is always allowed): a mixed load that keeps the cores busy "
        "gets the fast model's latency, not a queue behind the slow one")


class SmtpConfig(_Section):
    """Where job e-mails go out. `tls`: "starttls" upgrades a plain connection, "tls" is
    implicit TLS (port 465), "none" is for a relay on a trusted network."""

    host: str | None = Field(None, description="unset: e-mail notification is refused")
    port: int = Field(587, ge=1, le=65535)
    username: str | None = None
    password: str | None = None
    tls: Literal["none", "starttls", "tls"] = "starttls"
    sender: str = "redline@localhost"
    timeout_s: float = Field(30.0, gt=0)


class ScheduledJob(_Section):
    """A periodic question answered ahead of time: `body` is a /v1/chat/completions (or
    /v1/completions) body; its answer refreshes the cache for the next asker."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    cron: str = Field(..., description="5 fields: minute hour day month day_of_week")
    endpoint: Literal["/v1/chat/completions", "/v1/completions"] = "/v1/chat/completions"
    body: dict[str, Any]


class JobsConfig(_Section):
    """The async tier. Jobs and files live in SQLite under data_dir, or in Redis when
    `store.url` is redis://, where any number of `redline worker` processes share them."""

    worker_in_server: bool = Field(True, description="the server runs a worker too")
    concurrency: int = Field(2, ge=1, le=256, description="jobs run at once per worker process")
    lease_s: float = Field(30.0, gt=0, description="a running job whose worker is silent this "
                           "long is run again (the worker heartbeats every lease_s/3)")
    max_attempts: int = Field(3, ge=1, description="runs of one job (crashes and server errors)")
    poll_s: float = Field(0.2, gt=0, description="idle queue polling interval")
    batch_concurrency: int = Field(4, ge=1, le=256, description="requests of one batch at once")
    max_file_bytes: int = Field(100 << 20, ge=1024, description="largest /v1/files upload")
    webhook_secret: str | None = Field(None, description="HMAC-SHA256 key for X-Redline-Signature")
    webhook_allow_private: bool = Field(False, description="allow loopback/private webhook hosts")
    webhook_timeout_s: float = Field(10.0, gt=0)
    webhook_attempts: int = Field(5, ge=1, le=20)
    webhook_backoff_s: float = Field(1.0, ge=0, description="first retry delay; doubles each try")
    durable: bool = Field(True, description="SQLite records and queue fsync each commit "
                          "(synchronous=FULL): an accepted (202) job survives a power cut, "
                          "not only a process kill; false: no fsync (faster acceptance)")
    redis_timeout_s: float = Field(2.0, gt=0, description="connect and read timeout of the "
                                   "jobs' Redis clients: a paused Redis is a fast 503")
    batch_max_lines: int = Field(50_000, ge=1, description="requests in one batch (OpenAI's)")
    batch_max_bytes: int = Field(200 << 20, ge=1024, description="a batch's input file (OpenAI's)")
    notify_lanes: int = Field(8, ge=1, le=256, description="notifications sent at once per "
                              "worker process (their own lanes: never a job's slot)")
    smtp: SmtpConfig = SmtpConfig()
    schedule: list[ScheduledJob] = Field(default_factory=list)


class ApiKey(_Section):
    """One API key: its sha256 hex digest (the plain key is never stored) and a name,
    which becomes the request's tenant. `rpm`/`tpm` override the defaults in `limits`."""

    name: str = Field(..., min_length=1)
    sha256: str = Field(..., pattern=r"^[0-9a-fA-F]{64}$")
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    role: Literal["admin", "user"] = Field("user", description="admin: /v1/admin/* and "
                                           "experiment management; user: the API only")
    models: list[str] | None = Field(None, description="the models this key may use (`auto` "
                                     "only if listed; embedding models too); another is a 404 "
                                     "for it. None: every model")
    max_concurrent: int | None = Field(None, ge=1, description="generations at once (streams "
                                       "whose client left count until they end); overrides "
                                       "limits.max_concurrent")
    budget_tokens: int | None = Field(None, ge=1, description="tokens per budget period; spent: 429")
    budget_period_s: int = Field(30 * 86400, ge=60, description="the budget's period, in fixed "
                                 "windows from the Unix epoch (86400: each UTC day)")


class AuthConfig(_Section):
    keys: list[ApiKey] = Field(default_factory=list, description="none = open (the embedded default)")
    protect_ops: bool = Field(False, description="/healthz, /readyz, /metrics need a key too")
    key_cache_s: float = Field(1.0, ge=0, description="a managed key (POST /v1/admin/keys) is "
                               "remembered this long per replica: a revocation reaches every "
                               "replica within it; a new key works everywhere at once")


class LimitsConfig(_Section):
    """Per-tenant rate limits (429 + Retry-After) and the slow-client guards."""

    rpm: int | None = Field(None, ge=1, description="requests per minute per key; None = no limit")
    tpm: int | None = Field(None, ge=1, description="tokens per minute per key; None = no limit")
    window_s: int = Field(60, ge=1, description="the window rpm and tpm count over; 60 = per minute")
    storage_url: str | None = Field(None, description="limits storage; None: redis when store.url "
                                    "is redis://, else memory")
    header_timeout_s: float = Field(10.0, gt=0, description="request headers complete by then")
    body_timeout_s: float = Field(30.0, gt=0, description="request body read whole by then")
    keep_alive_s: float = Field(5.0, gt=0, description="idle keep-alive connections closed after")
    max_connections: int = Field(1024, ge=1, description="more open connections: 503 at once")
    drain_timeout_s: float = Field(30.0, ge=0, description="SIGTERM: running requests get this long")
    max_concurrent: int | None = Field(None, ge=1, description="generations at once per tenant "
                                       "(abandoned streams still generating count); over it: "
                                       "429. Counted in Redis across replicas when the limits "
                                       "live there, else on each replica. None = no cap")
    generation_lease_s: float = Field(3600.0, gt=0, description="a generation slot whose end "
                                      "was never reported is freed after this long (a backstop)")
    concurrent_lease_s: float = Field(15.0, gt=0, description="in Redis, each slot is a lease "
                                      "its replica renews every third of this while the "
                                      "generation runs: a crashed replica's slots come back "
                                      "after it")


class StoreConfig(_Section):
    """Where shared state lives (caches, stream journals, jobs, limits): one store per app."""

    url: str | None = Field(None, description="memory://, sqlite:///relative.db, "
                            "sqlite:////absolute.db or redis://host:port/db; "
                            "None: sqlite file redline.db under server.data_dir")

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str | None) -> str | None:
        if url is not None and url.split("://", 1)[0] not in (
                "memory", "sqlite", "redis", "rediss", "unix"):
            raise ValueError(f"store.url {url!r}: use memory://, sqlite:///…, redis://…")
        return url


class CacheConfig(_Section):
    """The response cache: exact, then semantic (see redline/cache/)."""

    enabled: bool = True
    ttl_s: float = Field(86400.0, gt=0, description="a cached answer is served this long")
    max_entries: int = Field(10000, ge=1, description="answers kept; the oldest go first")
    semantic: bool = Field(True, description="also serve answers to paraphrased questions")
    similarity_threshold: float = Field(0.70, ge=0.0, le=1.0,
                                        description="cosine similarity a semantic hit needs (0.70: "
                                        "`redline eval-cache --choose 1.0`, no wrong hit on the "
                                        "tuning part of the labelled pairs)")
    guard: bool = Field(True, description="refuse semantic hits whose questions differ in numbers, "
                        "names, negation, opposite words, times, units, order or one swapped word")
    cache_sampled: bool = Field(False, description="also cache requests with temperature > 0")
    semantic_skip: bool = Field(True, description="skip the semantic lookup (its embedding, "
                                "before the first token) while on recent traffic it would not "
                                "pay: the share of questions it would serve (95% upper bound, "
                                "last 256) times a miss's answer time below a lookup's time. "
                                "Answers are still stored, and every one tells whether it would "
                                "have been served (cache/payoff.py)")
    embedder_path: str | None = Field(None, description="sentence-transformers model dir; "
                                      "None: the bundled all-MiniLM-L6-v2")
    embed_batch: int = Field(32, ge=1, description="questions embedded together at most: those "
                             "that arrive while the embedder is busy go in its next pass (1: one "
                             "at a time; 4 questions at once at an idle server: first token p50 "
                             "0.26 s vs 0.30 s, docs/BENCHMARKS.md)")
    embedder_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="the embedder's arithmetic (auto: bfloat16 where the CPU has "
        "AVX512-BF16: ~10 ms a question instead of ~17; similarities move by 0.0004 at the "
        "median, and no labelled pair is served differently; docs/BENCHMARKS.md)")
    # the borderline check (cache/confirm.py): a second, stronger embedder for candidates
    # between confirm_floor and similarity_threshold
    confirm: bool = Field(False, description="serve a borderline candidate when a stronger "
                          "embedder confirms it (without that model: off, and logged). Off by "
                          "default: on the test part it gained recall 0.442 -> 0.484 and lost "
                          "precision 0.977 -> 0.958, and a confirmed hit costs ~5x a fast one "
                          "(docs/BENCHMARKS.md, issue 22)")
    confirm_floor: float = Field(0.47, ge=0.0, le=1.0,
                                 description="MiniLM similarity from which a candidate is "
                                 "checked by the stronger embedder (0.47: `redline eval-cache "
                                 "--choose 1.0`, the highest floor with the most recall at no "
                                 "wrong hit on the tuning part)")
    confirm_threshold: float = Field(0.71, ge=0.0, le=1.0,
                                     description="the stronger embedder's similarity a "
                                     "borderline candidate needs (0.71: `redline eval-cache "
                                     "--choose 1.0`, no wrong hit on the tuning part)")
    confirm_path: str | None = Field(None, description="sentence-transformers model dir for the "
                                     "check; None: the bundled all-mpnet-base-v2")
    # the error budget (cache/verify.py): checked on live traffic, kept by the threshold
    max_wrong_hit_rate: float = Field(0.02, gt=0.0, le=1.0,
                                      description="share of semantic hits allowed to serve the "
                                      "answer to a different question; above it (95% bound) "
                                      "the threshold rises, then semantic hits turn off")
    shadow_sample: float = Field(0.05, ge=0.0, le=1.0,
                                 description="share of semantic hits (and of would-be hits not "
                                 "served) checked against the model's own answer, made while "
                                 "the engine is idle (every 1/x-th one); 0: no checks, the "
                                 "threshold stays put")
    shadow_agreement: float = Field(0.80, ge=0.0, le=1.0,
                                    description="answer-embedding similarity at which the served "
                                    "and the model's answers agree (same numbers, times, units too)")
    judge: Literal["answers", "questions"] = Field(
        "answers", description="how a check decides a hit was wrong: `answers` compares the "
        "served answer with the model's own (cache/judge.py); `questions` asks `judge_model` "
        "whether the question asked and the cached one are the same (yes/no log-odds)")
    judge_model: str | None = Field(None, description="the questions judge's model; None: the "
                                    "largest local chat model, else the largest chat model")
    judge_threshold: float | None = Field(None, description="the questions judge's cut: a "
                                          "log-odds of yes over no below it is a wrong hit; "
                                          "None: the bundled judge model's measured cut, else 0")
    judge_false_wrong: float | None = Field(None, ge=0.0, le=1.0, description="the questions "
                                            "judge's share of right hits called wrong (`redline "
                                            "eval-judge --judge questions`); None: measured for "
                                            "a bundled judge model, else 0")
    judge_true_wrong: float | None = Field(None, ge=0.0, le=1.0, description="its share of "
                                           "wrong hits called wrong; None: as above, else 1")
    threshold_step: float = Field(0.02, gt=0.0, le=0.2,
                                  description="how far one tightening or loosening moves the "
                                  "threshold")
    loosen_after: int = Field(50, ge=1, description="checks between two moves of the threshold "
                              "before it may loosen again (loosening is slow on purpose)")


_ARM_SAMPLING = {"temperature", "top_p", "top_k", "max_tokens", "seed"}


class ArmConfig(_Section):
    """One arm of an A/B test: what it changes for the requests assigned to it."""

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    weight: float = Field(1.0, gt=0, description="share of units, relative to the other arms")
    model: str | None = Field(None, description="serve this arm's requests with this model")
    tier: Literal["S", "A", "B"] | None = None
    sampling: dict[str, float | int] = Field(default_factory=dict,
                                             description=f"overrides: {', '.join(sorted(_ARM_SAMPLING))}")
    settings: dict[str, Any] = Field(default_factory=dict,
                                     description="free overrides other stages may read (by name)")

    @field_validator("sampling")
    @classmethod
    def _known(cls, v: dict[str, float | int]) -> dict[str, float | int]:
        unknown = set(v) - _ARM_SAMPLING
        if unknown:
            raise ValueError(f"unknown sampling override(s) {sorted(unknown)}; "
                             f"known: {sorted(_ARM_SAMPLING)}")
        return v


class ExperimentConfig(_Section):
    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    unit: Literal["user", "tenant", "auto"] = Field(
        "auto", description="sticky on the request's `user`, its API key, or user else key")
    models: list[str] = Field(default_factory=list,
                              description="enrol requests for these models (empty: every request)")
    arms: list[ArmConfig] = Field(..., min_length=2)
    enabled: bool = True

    @model_validator(mode="after")
    def _arm_names(self) -> ExperimentConfig:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"experiment {self.name!r}: arm names must be unique: {names}")
        return self


class ExperimentsConfig(_Section):
    """A/B tests on live traffic; the first arm of each is its control."""

    active: list[ExperimentConfig] = Field(default_factory=list)
    alpha: float = Field(0.05, gt=0, lt=1, description="significance level of the tests")
    max_samples: int = Field(20000, ge=10, description="latest completions kept per arm")


class TelemetryConfig(_Section):
    metrics: bool = Field(True, description="false: Prometheus metrics and live stats record nothing")
    slow_log_size: int = Field(200, ge=1, description="long-tail records kept (ring, and in the store)")
    usage_flush_s: float = Field(1.0, gt=0, description="per-key usage is written to the store "
                                 "this often (one write of everything counted meanwhile)")
    usage_retention_s: float = Field(90 * 86400.0, gt=0, description="hourly usage counts are kept "
                                     "this long")


class RedlineConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="REDLINE_", env_nested_delimiter="__", extra="forbid"
    )

    server: ServerConfig = ServerConfig()
    models: list[ModelConfig] = Field(default_factory=_default_models)
    default_model: str | None = None
    streams: StreamsConfig = StreamsConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    jobs: JobsConfig = JobsConfig()
    routing: RoutingConfig = RoutingConfig()
    store: StoreConfig = StoreConfig()
    cache: CacheConfig = CacheConfig()
    experiments: ExperimentsConfig = ExperimentsConfig()
    responses: ResponsesConfig = ResponsesConfig()

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique: {names}")
        if not models:
            raise ValueError("at least one model is needed")
        return models

    @model_validator(mode="after")
    def _default(self) -> RedlineConfig:
        names = [m.name for m in self.models]
        if self.default_model is None:
            self.default_model = names[0]
        elif self.default_model not in names:
            raise ValueError(f"default_model {self.default_model!r} is not one of {names}")
        if self.store.url is None:  # four slashes when data_dir is absolute (see store.factory)
            self.store.url = f"sqlite:///{Path(self.server.data_dir, 'redline.db')}"
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # environment beats the file (init kwargs carry the file's content)
        return (env_settings, init_settings)

    def data_path(self, *parts: str) -> Path:
        path = Path(self.server.data_dir, *parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)


def load_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> RedlineConfig:
    """Read the YAML file (if any), then the environment; `overrides` win over the file."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config must be a mapping")
        data.update(loaded)
    data.update(overrides)
    return RedlineConfig(**data)
