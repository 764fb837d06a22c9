"""POST /v1/messages with the official `anthropic` client, through a remote backend (the
fake upstream): text, streaming, a tool-use round trip, images, counting tokens, errors in
Anthropic's shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import gateway_support
import httpx
import pytest

from redline.backends.fake_upstream import Dist, UpstreamSpec

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[anthropic.Anthropic, str, str]]:
    with gateway_support.gateway(tmp_path_factory.mktemp("messages"),
                                 UpstreamSpec(ttft=Dist(0.0), tpot=Dist(0.0), cached_tokens=1,
                                              tokenize=True),
                                 local=True) as (gw, up):
        client = anthropic.Anthropic(base_url=gw, api_key="x", max_retries=0)
        yield client, gw, up
        client.close()


def test_text(gateway: Any) -> None:
    client, gw, _ = gateway
    msg = client.messages.create(model="remote", max_tokens=3, messages=ASK,
                                 system="Be brief.", stop_sequences=["zzz"])
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "remote"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "tok tok tok"  # type: ignore[union-attr]
    assert msg.stop_reason == "max_tokens"
    assert msg.usage.output_tokens == 3 and msg.usage.cache_read_input_tokens == 1
    # Anthropic's total input is input_tokens + cache_read_input_tokens: the cached token
    # is not also in input_tokens
    plain = client.messages.create(model="remote", max_tokens=3, messages=ASK)
    chat = httpx.post(f"{gw}/v1/chat/completions", timeout=30,
                      json={"model": "remote", "max_tokens": 3, "messages": ASK}).json()
    assert plain.usage.input_tokens + 1 == chat["usage"]["prompt_tokens"]
    # `auto`: the message names the model that answered, as a chat completion does
    raw = client.messages.with_raw_response.create(model="auto", max_tokens=3, messages=ASK)
    assert raw.parse().model == raw.headers["x-redline-model"] != "auto"
    with client.messages.stream(model="auto", max_tokens=3, messages=ASK) as stream:
        assert stream.get_final_message().model in ("remote", "local")


def test_streaming(gateway: Any) -> None:
    client, _, _ = gateway
    with client.messages.stream(model="remote", max_tokens=4, messages=ASK) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert texts == ["tok", " tok", " tok", " tok"]
    assert final.content[0].text == "tok tok tok tok"  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 4
    # the prompt's tokens too (message_start goes out before they are counted)
    assert final.usage.input_tokens > 0 and final.usage.cache_read_input_tokens == 1


def test_a_tool_use_round_trip(gateway: Any) -> None:
    client, _, up = gateway
    messages: list[Any] = list(ASK)
    first = client.messages.create(model="remote", max_tokens=64, messages=messages,
                                   tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    use = first.content[0]
    assert use.type == "tool_use" and use.name == "get_weather"
    assert use.input == {"city": "tok"}
    with client.messages.stream(model="remote", max_tokens=64, messages=messages,
                                tools=[WEATHER]) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].type == "tool_use" and streamed.content[0].input == {"city": "tok"}
    messages += [{"role": "assistant", "content": first.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "sunny"}]}]
    final = client.messages.create(model="remote", max_tokens=64, messages=messages,
                                   tools=[WEATHER])
    assert final.stop_reason == "end_turn"
    assert final.content[0].text == "result: sunny."  # type: ignore[union-attr]
    sent = httpx.get(f"{up}/last").json()  # what the OpenAI-compatible upstream was asked
    assert sent["messages"][1]["tool_calls"][0]["id"] == use.id
    assert sent["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": use.id}
    assert sent["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]


def test_images_reach_the_upstream(gateway: Any) -> None:
    client, _, _ = gateway
    msg = client.messages.create(model="remote", max_tokens=1, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "text", "text": "What is it?"}]}])
    assert msg.content[0].text == "images:1"  # type: ignore[union-attr]


def test_errors_are_anthropic_shaped(gateway: Any) -> None:
    client, url, _ = gateway
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="remote", max_tokens=0, messages=ASK)
    assert err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=5, messages=ASK)
    with pytest.raises(anthropic.BadRequestError) as err:  # the embedded engine has no tools
        client.messages.create(model="local", max_tokens=5, messages=ASK, tools=[WEATHER])
    assert "tools" in err.value.body["error"]["message"]  # type: ignore[index]
    r = httpx.post(f"{url}/v1/messages", json={"model": "remote", "max_tokens": 5,
                                               "messages": ASK, "thinking": {"type": "enabled"}})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_count_tokens_counts_what_the_message_is_charged(gateway: Any) -> None:
    """messages.count_tokens: a remote model's engine counts the chat redline would send it
    (its /tokenize), and the count is the input the message's usage then says (its
    input_tokens and cache_read_input_tokens together);
    errors in Anthropic's shape."""
    client, url, up = gateway
    ask: dict[str, Any] = {"model": "remote", "messages": ASK, "system": "Be brief.",
                           "tools": [WEATHER]}
    counted = client.messages.count_tokens(**ask)
    sent = httpx.get(f"{up}/last").json()
    assert [m["content"] for m in sent["messages"]] == ["Be brief.", ASK[0]["content"]]
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    used = client.messages.create(**ask, max_tokens=3)
    # the whole prompt: what the usage splits into uncached and cache-read tokens
    assert counted.input_tokens == used.usage.input_tokens + (
        used.usage.cache_read_input_tokens or 0)
    assert client.messages.count_tokens(model="remote", messages=ASK).input_tokens \
        < counted.input_tokens
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="nope", messages=ASK)
    for bad in ({"model": "local"}, {"model": "auto"}, {"max_tokens": 5}, {"messages": []}):
        r = httpx.post(f"{url}/v1/messages/count_tokens", json={**ask, **bad})
        assert r.status_code == 400 and r.json()["type"] == "error", (bad, r.text)


def _post(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", json={"model": "remote", "max_tokens": 3,
                                                  "messages": ASK, **body})


def test_what_claude_code_sends_is_taken(gateway: Any) -> None:
    """The fields of Anthropic's newer API that Claude Code sends on every call: a system
    message among the turns, adaptive thinking, a context edit that keeps everything,
    output_config (its effort as chat's reasoning_effort, its format as a JSON schema),
    a top-level cache_control, and an answer's thinking blocks given back (kept, not
    replayed to the engine)."""
    client, url, up = gateway
    turns = [{"role": "user", "content": "Hi."},
             {"role": "system", "content": [{"type": "text", "text": "Agents: none."}]},
             {"role": "assistant", "content": [
                 {"type": "thinking", "thinking": "A greeting.", "signature": "s"},
                 {"type": "redacted_thinking", "data": "xyz"},
                 {"type": "text", "text": "Hello."}]},
             {"role": "user", "content": "Again."}]
    msg = client.messages.create(
        model="remote", max_tokens=3, messages=turns,  # type: ignore[arg-type]
        thinking={"type": "adaptive"}, cache_control={"type": "ephemeral"},
        extra_body={"context_management": {"edits": [
            {"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "xhigh"}})
    assert msg.content and msg.content[-1].type == "text"
    sent = httpx.get(f"{up}/last").json()
    assert [(m["role"], m["content"]) for m in sent["messages"]] == [
        ("user", "Hi."), ("system", "Agents: none."), ("assistant", "Hello."),
        ("user", "Again.")]
    assert sent["reasoning_effort"] == "high"  # xhigh: the highest chat has
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert _post(url, output_config={"format": {"type": "json_schema", "schema": schema}}
                 ).status_code == 200
    sent = httpx.get(f"{up}/last").json()
    assert sent["response_format"]["json_schema"]["schema"] == schema
    assert "reasoning_effort" not in sent
    # one capacity and one speed here: the standard ones, whichever service tier is asked
    for tier in ("auto", "standard_only"):
        assert _post(url, service_tier=tier, speed="standard").status_code == 200
    counted = httpx.post(f"{url}/v1/messages/count_tokens", json={
        "model": "remote", "messages": ASK, "thinking": {"type": "adaptive"},
        "output_config": {"effort": "low"}})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


@pytest.mark.parametrize(("body", "says"), [
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
    ({"thinking": {"type": "disabled"}}, "thinking"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
     "context_management"),
    ({"output_config": {"effort": "extreme"}}, "effort"),
    ({"speed": "fast"}, "speed"),  # redline has no faster mode to give
    ({"service_tier": "priority"}, "service_tier"),
    ({"output_config": {"format": {"type": "yaml"}}}, "output_config.format"),
    ({"model": "local", "output_config": {"effort": "low"}}, "reasoning_effort"),
    ({"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]},
     "system message"),
    ({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
     "thinking blocks"),
])
def test_what_redline_cannot_hold_to_is_refused(gateway: Any, body: dict[str, Any],
                                                says: str) -> None:
    r = _post(gateway[1], **body)
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert says in r.json()["error"]["message"], r.text


def test_a_final_assistant_turn_is_continued(gateway: Any) -> None:
    """Anthropic's prefill: the answer continues a final assistant turn. A remote engine is
    asked as vLLM takes it (the embedded engine's own: tests/test_api_fidelity_local.py);
    trailing whitespace in it is a 400, as Anthropic answers."""
    client, gw, up = gateway
    client.messages.create(model="remote", max_tokens=2, messages=[
        *ASK, {"role": "assistant", "content": "The weather is"}])
    sent = httpx.get(f"{up}/last").json()
    assert sent["messages"][-1] == {"role": "assistant", "content": "The weather is"}
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    client.messages.create(model="remote", max_tokens=2, messages=ASK)
    assert "continue_final_message" not in httpx.get(f"{up}/last").json()
    r = _post(gw, model="remote", max_tokens=2,
              messages=[*ASK, {"role": "assistant", "content": "The weather is "}])
    assert r.status_code == 400 and "trailing whitespace" in r.json()["error"]["message"]
