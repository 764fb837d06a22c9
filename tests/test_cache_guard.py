"""The near-miss guard and the cache keys, without a model."""

from __future__ import annotations

import pytest

from redline.cache.guard import allows, differences
from redline.cache.keys import cache_keys
from redline.types import GenerationRequest, Message, SamplingParams


@pytest.mark.parametrize("a,b,reason", [
    ("Where is my order 1042?", "Where is my order 2977?", "numbers"),
    ("Book a table for two", "Book a table for 3", "numbers"),
    ("How do I enable 2FA?", "How do I disable 2FA?", "opposites"),
    ("How do I subscribe to the newsletter?", "How do I unsubscribe from the newsletter?", "opposites"),
    ("Is the shop open on Sunday?", "Is the shop closed on Sunday?", "opposites"),
    ("What is the capital of France?", "What is the capital of Germany?", "names"),
    ("Flights from London to Paris", "Flights from London to Berlin", "names"),
    ("Do you ship to the US?", "Do you ship to the UK?", "names"),
    ("I can't log in", "I can log in", "negation"),
    ("Is there a fee for returns?", "Is there no fee for returns?", "negation"),
    ("Email me at a@b.com", "Email me at c@d.com", "names"),
])
def test_near_misses_are_refused(a: str, b: str, reason: str) -> None:
    assert reason in differences(a, b)
    assert reason in differences(b, a)


@pytest.mark.parametrize("a,b", [
    ("How do I reset my password?", "how can i reset my password"),
    ("How do I turn on dark mode?", "How do I enable dark mode?"),
    ("What's the refund policy for order 1042?", "What is the refund policy on order #1042"),
    ('Print "hello world" in Python', 'how to print "Hello World" in python'),
    ("Do you ship to the US?", "do you ship to the us?"),
    ("Can I pay with two cards?", "Is it possible to pay with 2 cards?"),
    ("Price is 1,000 dollars?", "price is 1000 dollars?"),
])
def test_paraphrases_pass(a: str, b: str) -> None:
    assert allows(a, b), differences(a, b)


def _req(*msgs: tuple[str, str], tenant: str = "t", model: str = "m",
         **sampling: object) -> GenerationRequest:
    params = SamplingParams(**{"temperature": 0.0, **sampling})  # type: ignore[arg-type]
    return GenerationRequest(model=model, sampling=params, tenant=tenant,
                             messages=tuple(Message(r, c) for r, c in msgs))


def test_exact_key_normalises_whitespace_and_scopes_everything_else() -> None:
    base = cache_keys(_req(("user", "Hello  there\n")), "m")
    assert cache_keys(_req(("user", " Hello there")), "m").exact == base.exact
    for other in (_req(("user", "hello there")), _req(("user", "Hello there"), tenant="u"),
                  _req(("user", "Hello there"), max_tokens=5), _req(("user", "Hello there"), seed=1),
                  _req(("system", "Be brief"), ("user", "Hello there"))):
        assert cache_keys(other, "m").exact != base.exact
    assert cache_keys(_req(("user", "Hello there")), "other").exact != base.exact


def test_partition_fixes_system_prompt_history_tenant_and_sampling() -> None:
    a = cache_keys(_req(("system", "S"), ("user", "How are you?")), "m")
    b = cache_keys(_req(("system", "S"), ("user", "How are you doing?")), "m")
    assert a.partition == b.partition and a.question == "How are you?"
    assert cache_keys(_req(("system", "T"), ("user", "How are you?")), "m").partition != a.partition
    assert cache_keys(_req(("system", "S"), ("user", "How are you?"), tenant="x"), "m").partition \
        != a.partition
    assert cache_keys(_req(("system", "S"), ("user", "Hi"), ("assistant", "Yo"), ("user", "How are you?")),
                      "m").partition != a.partition
    text = GenerationRequest(model="m", sampling=SamplingParams(temperature=0), prompt="Once")
    assert cache_keys(text, "m").partition is None  # text completions: exact only
