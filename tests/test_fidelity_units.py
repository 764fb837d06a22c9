"""The typed request's checks without a server: cache keys over every output-changing
field, the semantic cache's single-turn text-only rule, capability refusals, the chunk
encoder's shapes for tool-call fragments, logprobs and several choices."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from redline.api.capabilities import check
from redline.api.chunks import ChunkEncoder
from redline.api.schemas import ChatCompletionRequest
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.cache.keys import cache_keys
from redline.config import RedlineConfig
from redline.errors import InvalidRequest
from redline.jobs.spec import JobSpec
from redline.routing.capabilities import Capabilities
from redline.routing.router import Router
from redline.telemetry.metrics import Metrics
from redline.types import Chunk, GenerationRequest, TokenLogprob, ToolCallDelta, TopLogprob, Usage, assemble

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
OTHER = {"type": "function", "function": {"name": "g"}}


def gen(**body: Any) -> Any:
    fields = {"model": "m", "messages": [{"role": "user", "content": "What is 2+2?"}], **body}
    return ChatCompletionRequest.model_validate(fields).to_generation(None, "t")


@pytest.mark.parametrize("a, b", [
    ({}, {"tools": [TOOL]}),
    ({"tools": [TOOL]}, {"tools": [OTHER]}),
    ({"tools": [TOOL]}, {"tools": [TOOL], "tool_choice": "required"}),
    ({}, {"response_format": {"type": "json_object"}}),
    ({"response_format": {"type": "json_object"}},
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
    ({}, {"n": 2}), ({}, {"logprobs": True}), ({}, {"presence_penalty": 1.0}),
    ({}, {"logit_bias": {"5": 1.0}}), ({}, {"seed": 3}), ({}, {"reasoning_effort": "low"}),
    ({}, {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]}),
])
def test_output_changing_fields_change_the_exact_key(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert cache_keys(gen(**a), "m").exact != cache_keys(gen(**b), "m").exact


def test_plain_keys_and_the_semantic_rule() -> None:
    plain = cache_keys(gen(), "m")
    assert plain.partition is not None and plain.question == "What is 2+2?"
    system = gen(messages=[{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "What is 2+2?"}])
    assert cache_keys(system, "m").partition is not None  # a system prompt is still one turn
    for other in (gen(tools=[TOOL]), gen(n=2), gen(reasoning_effort="low"),
                  gen(messages=[{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "hello"},
                                {"role": "user", "content": "What is 2+2?"}]),
                  gen(messages=[{"role": "user", "content": [
                      {"type": "text", "text": "What is it?"},
                      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}])):
        assert cache_keys(other, "m").partition is None


def test_answers_the_cache_cannot_hold_bypass_it() -> None:
    assert gen().use_cache and gen(response_format={"type": "json_object"}).use_cache
    for body in ({"tools": [TOOL]}, {"n": 2}, {"logprobs": True}):
        assert not gen(**body).use_cache


def _router_check(cfg: RedlineConfig, request: GenerationRequest) -> None:
    """The one capability check (Router.check), with the configured models' capabilities."""
    router = Router({m.name: FakeBackend(m.name) for m in cfg.models}, cfg.models[0].name,
                    cfg.routing, Metrics(enabled=False),
                    capabilities=Capabilities.of_models(cfg.models))
    router.check(request)


def test_capabilities_are_checked_against_the_configured_model() -> None:
    cfg = RedlineConfig(models=[{"name": "m", "bundled": "x"},
                                {"name": "base", "bundled": "x", "capabilities": ["completions"]}],
                        server={"max_n": 2})
    # the embedded engine serves logprobs, JSON by grammar, several choices, penalties and
    # logit_bias
    for request in (gen(), gen(logprobs=True, top_logprobs=5),
                    gen(response_format={"type": "json_object"}, n=2, presence_penalty=0.5,
                        frequency_penalty=-0.5, logit_bias={"42": -100})):
        check(cfg, request)
        _router_check(cfg, request)
    capability_cases = [
        ({"tools": [TOOL]}, "tools"),  # this model has no tool format
        ({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "messages")]
    for body, param in capability_cases:  # the router's (routing/capabilities.py)
        check(cfg, gen(**body))
        with pytest.raises(InvalidRequest) as err:
            _router_check(cfg, gen(**body))
        assert err.value.param == param, body
    unenforceable = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "patternProperties": {"^a": {"type": "string"}}}}}
    engine_cases = [({"n": 3}, "n"), ({"reasoning_effort": "low"}, "reasoning_effort"),
                    ({"response_format": unenforceable}, "response_format")]
    for body, param in engine_cases:  # the api's (api/capabilities.py)
        with pytest.raises(InvalidRequest) as err:
            check(cfg, gen(**body))
        assert err.value.param == param, body
    with pytest.raises(InvalidRequest) as err:
        _router_check(cfg, replace(gen(), model="base"))
    assert err.value.param == "model" and "completions only" in str(err.value)
    assert err.value.code == "model_not_supported"
    with pytest.raises(InvalidRequest) as err:  # no model serves tools: auto cannot either
        _router_check(cfg, replace(gen(tools=[TOOL]), model="auto"))
    assert err.value.param == "tools"
    remote = RedlineConfig(models=[{"name": "m", "backend": "openai", "url": "http://x"}])
    request = gen(tools=[TOOL], logprobs=True, n=2, reasoning_effort="low")
    check(remote, request)
    _router_check(remote, request)


def test_jobs_keep_the_body_of_what_the_typed_copy_cannot_carry() -> None:
    assert JobSpec.of("chat", gen()).body is None
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]}
    assert JobSpec.of("chat", gen(tools=[TOOL]), body=body).body == body
    with pytest.raises(InvalidRequest) as err:  # no body to keep: refused, never dropped
        JobSpec.of("chat", gen(tools=[TOOL]))
    assert err.value.param == "body"


def test_the_encoder_writes_fragments_logprobs_and_choices_as_openai_does() -> None:
    enc = ChunkEncoder("chat", "req-1", "m", include_usage=True)
    head = Chunk(tool_calls=(ToolCallDelta(0, "call_1", "function", "f", ""),), tokens=1, index=1)
    frag = Chunk(tool_calls=(ToolCallDelta(0, arguments='{"a"'),), tokens=1, index=1)
    lp = TokenLogprob("hi", -0.5, (104, 105), (TopLogprob("hi", -0.5, (104, 105)),))
    text = Chunk(text="hi", logprobs=(lp,), tokens=1)
    assert json.loads(enc.delta(head, None))["choices"][0] == {
        "index": 1, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                              "function": {"name": "f", "arguments": ""}}]},
        "logprobs": None, "finish_reason": None}
    assert json.loads(enc.delta(frag, None))["choices"][0]["delta"] == {
        "tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}
    assert json.loads(enc.delta(text, None))["choices"][0]["logprobs"] == {
        "content": [{"token": "hi", "logprob": -0.5, "bytes": [104, 105],
                     "top_logprobs": [{"token": "hi", "logprob": -0.5, "bytes": [104, 105]}]}],
        "refusal": None}
    frag2 = Chunk(tool_calls=(ToolCallDelta(0, arguments=': 1}'),), index=1, ends_choice="tool_calls")
    whole = json.loads(enc.full(assemble([text, head, frag, frag2], 2),
                                Usage(3, 4, cached_tokens=1)))
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert whole["choices"][1]["message"] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    assert whole["choices"][1]["finish_reason"] == "tool_calls"
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                              "prompt_tokens_details": {"cached_tokens": 1}}


def test_the_cache_keeps_answers_to_different_formats_and_tools_apart(tmp_path: Any) -> None:
    """Through the API (a fake backend, the real cache with a hashing embedder): the same
    question with another response_format or tools is never served the first's answer,
    exactly or semantically; the same request again is."""
    import time

    from fastapi.testclient import TestClient

    from redline.api.app import create_app
    from redline.backends.fake import FakeBackend
    from redline.cache.embedder import HashingEmbedder

    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, store={"url": "memory://"},
                        cache={"similarity_threshold": 0.5})
    app = create_app(cfg, backends={"fake": FakeBackend(words=("a", "b"))})
    services_of(app).pipeline.cache.embedder = HashingEmbedder()

    def ask(c: TestClient, **extra: Any) -> str:
        r = c.post("/v1/chat/completions", json={
            "model": "fake", "temperature": 0, "max_tokens": 2,
            "messages": [{"role": "user", "content": "How do I reset my password?"}], **extra})
        assert r.status_code == 200, r.text
        cache = services_of(app).pipeline.cache
        deadline = time.monotonic() + 10
        while cache._tasks and time.monotonic() < deadline:  # the answer stored
            time.sleep(0.01)
        return str(r.headers["x-redline-cache"])

    with TestClient(app) as c:
        deadline = time.monotonic() + 120
        while c.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ask(c) == "miss"
        assert ask(c) == "hit"
        assert ask(c, response_format={"type": "json_object"}) == "miss"
        assert ask(c, response_format={"type": "json_object"}) == "hit"
        assert ask(c, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object"}}}) == "miss"
        assert ask(c, tools=[TOOL]) == "bypass"  # a tool-call answer is never stored or served
        assert ask(c, tools=[TOOL]) == "bypass"
        assert ask(c, seed=1) == "miss"


def test_a_prompt_list_goes_upstream_whole_and_bypasses_the_cache() -> None:
    from redline.api.schemas import CompletionRequest
    from redline.backends.openai_wire import request_body

    def text(prompt: Any, **body: Any) -> GenerationRequest:
        return CompletionRequest.model_validate({"model": "m", "prompt": prompt, **body}) \
            .to_generation(None, "t")

    several = text(["a b", "c d"], n=3)
    assert several.prompt == "a b" and several.prompts == ("a b", "c d")
    assert several.choices == 6 and not several.use_cache and not several.is_plain()
    assert request_body(several, "up")[1]["prompt"] == ["a b", "c d"]
    one = text(["a b"])  # a list of one is that prompt, as before
    assert one.prompts == () and one.choices == 1 and one.use_cache
    assert request_body(one, "up")[1]["prompt"] == "a b"


RICH = {"model": "m", "messages": [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {
        "url": "data:image/png;base64,AAAA", "detail": "low"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "d", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["a", "b"]}},
                              "required": ["city"]}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                                                "strict": True}},
    "parallel_tool_calls": False, "user": "u", "some_unknown": {"a": [1, 2]}}


def test_a_rich_requests_exact_cache_key_is_stable() -> None:
    """The exact key of a request with parts, tool calls, tools, tool_choice, a response
    format and a passed-through field is pinned: entries already cached stay reachable
    when the key's code changes (it did: asdict's deep copy gave way to a JSON hook)."""
    from redline.cache.keys import cache_keys

    gen = ChatCompletionRequest.model_validate(RICH).to_generation(None, "t")
    assert cache_keys(gen, "m").exact == "2e51ab2556ecd5d10b386313a050baa963be0bfd"
    other = ChatCompletionRequest.model_validate({**RICH, "parallel_tool_calls": True})
    assert cache_keys(other.to_generation(None, "t"), "m").exact != cache_keys(gen, "m").exact
