"""The way into a generation, per request and per key: what a key may do before it runs.

`GenerationGate.enter(scope, gen)` is called once by every generating route (chat and
text completions, messages, responses; embeddings, as a request that generates nothing)
once the body is read, in this order:

    model allowlist (404, as for a model that does not exist)
    → token budget of the period (429 insufficient_quota)
    → concurrent generations (429 rate_limit_exceeded + Retry-After)
    → token reservation (api/limits.py: 429 + Retry-After)

Concurrent generations are counted per tenant (a managed key with limits of its own:
per key; an open server: per client address), from admission until the generation ends
as the pipeline reports it (`on_finish`), on this replica or, when the limits live in
Redis, across replicas (api/slots.py): a stream whose client left and which still
generates for a resume keeps its slot until it ends or is aborted. A
request that fails before it generates gives its slot back when its response ends
(`ReleaseSlots`); one whose end is never reported is freed after `generation_lease_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from redline.api.keyring import ManagedKeys, key_label
from redline.api.limits import TenantLimiter, estimate_tokens, limit_key
from redline.api.slots import GenerationSlots
from redline.config import ApiKey, LimitsConfig
from redline.errors import AuthenticationFailed, ModelNotFound, RateLimited
from redline.store.base import Store, StoreUnavailable
from redline.store.leases import RedisLeases
from redline.telemetry.usage import UsageLog
from redline.types import Finished, GenerationRequest

SLOT_RETRY_AFTER_S = 1.0  # a slot frees when some generation ends: no window to wait for


def budget_key(key_id: str, period_s: int, now: float) -> tuple[str, float]:
    """The store counter of a key's budget in the period that holds `now`, and how long
    it has to live (to the period's end)."""
    period = int(now) // period_s
    return f"budget:{key_id}:{period}", max(1.0, (period + 1) * period_s - now)


class GenerationGate:
    """`enter` for each live request; a pipeline observer (`on_finish`) for its end."""

    def __init__(self, limiter: TenantLimiter, limits: LimitsConfig, usage: UsageLog,
                 store: Store, leases: RedisLeases | None = None) -> None:
        """`leases`: count the concurrent generations in Redis, across replicas."""
        self.limiter, self.usage, self.store = limiter, usage, store
        self.default_cap = limits.max_concurrent
        self.slots = GenerationSlots(limits.generation_lease_s, leases)
        self.budgets: dict[str, tuple[str, float]] = {}  # request id -> (counter, ttl)
        self.pending: set[asyncio.Task[None]] = set()

    async def check(self, scope: Scope, gen: GenerationRequest) -> None:
        """The key's allowlist and budget only: what a request that becomes a job (it
        takes no slot; its tokens are charged as it runs) must pass as well."""
        await self.check_model(scope, gen.model)

    async def check_model(self, scope: Scope, model: str) -> None:
        """A request that generates nothing (embeddings) but names a model: the key's
        allowlist and budget, as for a completion."""
        await self._check_key(scope.get("state", {}).get("api_key"), key_label(scope), model)

    async def check_budget(self, scope: Scope) -> None:
        """The key's budget only (a batch: its lines' models are checked as they run)."""
        await self._check_key(scope.get("state", {}).get("api_key"), key_label(scope), None)

    async def _check_key(self, key: ApiKey | None, label: str, model: str | None) -> None:
        if key is None:
            return
        if model is not None and key.models is not None and model not in key.models:
            raise ModelNotFound(f"The model `{model}` does not exist or you do not have "
                                "access to it.", param="model")
        if key.budget_tokens is not None:
            await self._check_budget(key.budget_tokens, key.budget_period_s, label)

    async def enter_job(self, gen: GenerationRequest, label: str, key: ApiKey | None) -> None:
        """A job or batch line made with the key `label` (`key`: its entry; None when it
        is gone or unknown here) is held to that key as a live request is: its allowlist
        and budget now, its tokens charged to the budget and its usage counted under it
        when it ends."""
        await self._check_key(key, label, gen.model)
        if key is not None and key.budget_tokens is not None:
            if len(self.budgets) > 100_000:  # lines that failed before they ran: the oldest go
                for rid in list(self.budgets)[:50_000]:
                    del self.budgets[rid]
            self.budgets[gen.id] = budget_key(label, key.budget_period_s, time.time())
        self.usage.note_key(gen.id, label)

    def forget(self, request_id: str) -> None:
        """A request let in by `enter_job` that will not run after all."""
        self.budgets.pop(request_id, None)
        self.usage.keys.pop(request_id, None)

    async def enter(self, scope: Scope, gen: GenerationRequest, checked: bool = False) -> None:
        """`checked`: the caller ran `check` for this request already (one budget read)."""
        state = scope.setdefault("state", {})
        key: ApiKey | None = state.get("api_key")
        label = key_label(scope)
        if not checked:
            await self.check(scope, gen)
        if key is not None and key.budget_tokens is not None:  # charged when it ends
            self.budgets[gen.id] = budget_key(label, key.budget_period_s, time.time())
        who = limit_key(scope, self.limiter.keyed)
        cap = (key.max_concurrent if key is not None else None) or self.default_cap
        if cap is not None:
            if not await self.slots.acquire(who, gen.id, cap):
                self.budgets.pop(gen.id, None)
                raise RateLimited(f"Too many concurrent generations: limit {cap} at once "
                                  "(streams still generating for a resume count). Please try "
                                  f"again in {SLOT_RETRY_AFTER_S:g}s.",
                                  retry_after=SLOT_RETRY_AFTER_S)
            state.setdefault("slots", []).append(gen.id)
        verdict = await self.limiter.reserve(who, gen.id, estimate_tokens(gen))
        if not verdict.allowed:
            self.slots.release(gen.id)
            self.budgets.pop(gen.id, None)
            raise RateLimited(verdict.message, retry_after=verdict.retry_after)
        self.usage.note_key(gen.id, label)
        state.setdefault("entered", []).append((gen.id, gen.tenant, gen.model))

    async def _check_budget(self, budget: int, period_s: int, label: str) -> None:
        counter, left = budget_key(label, period_s, time.time())
        try:
            spent = int(await self.store.get(counter) or b"0")
        except StoreUnavailable:
            spent = 0  # fail open, as the rate limits do
        if spent >= budget:
            raise RateLimited(f"You exceeded your current quota: this key's budget of "
                              f"{budget} tokens per {period_s} s is spent.",
                              code="insufficient_quota", retry_after=left)

    def on_finish(self, done: Finished) -> None:
        rid = done.request.id
        self.slots.release(rid)
        budget = self.budgets.pop(rid, None)
        if budget is None:
            return
        usage = done.usage
        tokens = usage.total_tokens if usage is not None else done.output_tokens
        if tokens > 0:
            self._charge_later(budget, tokens)

    def _charge_later(self, budget: tuple[str, float], tokens: int) -> None:
        """Add `tokens` to a budget counter in the store, off the caller's path."""
        task = asyncio.get_running_loop().create_task(self._charge(budget, tokens))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _charge(self, budget: tuple[str, float], tokens: int) -> None:
        try:
            await self.store.incr(budget[0], tokens, ttl=budget[1])
        except StoreUnavailable:
            pass  # fail open: this answer is not charged to the budget

    def leave(self, scope: Scope, generating: bool, status: int) -> None:
        """The response ended: its slots go back unless its generation goes on without it
        (a stream: it reports its own end); a request that never generated is counted."""
        if generating:
            return
        state = scope.get("state", {})
        for rid in state.get("slots", ()):
            self.slots.release(rid)
            self.budgets.pop(rid, None)
        for rid, tenant, model in state.get("entered", ()):
            self.usage.failed(rid, tenant, model, status)

    async def close(self) -> None:
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)
        await self.slots.close()


class ReleaseSlots:
    """ASGI middleware: a request's generation slots go back when its response ends,
    unless it is an event stream (whose generation may go on for a resume, and reports
    its own end to the gate)."""

    def __init__(self, app: ASGIApp, gate: GenerationGate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        streamed, status = False, 499  # no answer sent: the client left

        def watch(message: Message) -> Awaitable[None]:
            # not a coroutine of its own: the server's send, as it is, for every event
            nonlocal streamed, status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                streamed = any(name == b"content-type" and value.startswith(b"text/event-stream")
                               for name, value in message.get("headers", ()))
            return send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            if status == 499:  # failed before an answer began: the server's error
                status = 500
            raise
        finally:
            self.gate.leave(scope, streamed, status)


class JobGate:
    """Background jobs and batch lines through their tenant's limits as they run (the
    jobs' `Gate`): each counts one request and reserves its tokens; over the limit it
    waits for the window (Retry-After) instead of failing, so a batch paces itself and
    leaves its tenant's live requests only what is left. One made with an API key is
    also held to that key (`GenerationGate.enter_job`): a model outside its allowlist is
    a 404 and a spent budget a 429 for it, its tokens are charged to the key's budget
    and its usage is counted under the key."""

    def __init__(self, limiter: TenantLimiter, gate: GenerationGate | None = None,
                 keys: ManagedKeys | None = None, config_keys: Sequence[ApiKey] = ()) -> None:
        """`gate`, `keys`, `config_keys`: to hold each job to the key it was made with."""
        self.limiter, self.gate, self.keys = limiter, gate, keys
        self.config_keys = {k.name: k for k in config_keys}

    async def enter(self, tenant: str, request: Any, key: str | None = None) -> None:
        who = tenant
        if key is not None and self.gate is not None:
            entry = await self._key(key)
            await self.gate.enter_job(request, key, entry)
            if entry is not None and key not in self.config_keys and (
                    entry.rpm or entry.tpm or entry.max_concurrent):
                who = "key:" + key  # a managed key with limits of its own (limit_key)
                self.limiter.learn_key(key, entry)
        try:
            await self._pace(who, request)
        except BaseException:
            if self.gate is not None:
                self.gate.forget(request.id)
            raise

    async def _key(self, label: str) -> ApiKey | None:
        """The entry of the key a job names: a config key by name, a managed one by id.
        A managed key revoked since the job was accepted: the job does not run (401), as
        the key's own requests are refused."""
        if label in self.config_keys:
            return self.config_keys[label]
        if self.keys is None or not label.startswith("key_"):
            return None
        try:
            record = await self.keys.by_id(label)
        except StoreUnavailable:
            return None  # fail open, as the budget check does
        if record is None:
            raise AuthenticationFailed(f"The API key {label} this work was made with was "
                                       "revoked; it did not run.")
        return record.key

    async def _pace(self, tenant: str, request: Any) -> None:
        limiter = self.limiter
        tokens, tpm = estimate_tokens(request), limiter.quota(tenant).tpm
        if tpm and tokens > tpm:  # it would wait forever: the client's mistake, a 429 now
            raise RateLimited(f"This request may use {tokens} tokens, more than the "
                              f"{tpm} tokens per window this key has.")
        while True:
            verdict = await limiter.reserve(tenant, request.id, tokens)
            if verdict.allowed:
                verdict = await limiter.count_request(tenant)
                if verdict.allowed:
                    return
                taken = limiter.reserved.pop(request.id, None)
                if taken is not None:
                    await limiter.settle(taken, 0)  # not running yet: give the tokens back
            await asyncio.sleep(min(max(verdict.retry_after, 0.05), float(limiter.window)))


__all__ = ["GenerationGate", "JobGate", "ReleaseSlots", "budget_key"]
