"""OpenAI's deprecated function calling (`functions`, `function_call`, `role: function`)
with the official `openai` client: read as tools and tool_choice, so every engine takes it
(the upstream, the fake one here, is sent tools), and answered in the legacy shape:
`message.function_call`, its stream's `delta.function_call`, finish reason
"function_call". The embedded engine on it: tests/test_models_qwen.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import gateway_support
import httpx
import openai
import pytest

from redline.api.chunks import ChunkEncoder
from redline.api.schemas import ChatCompletionRequest
from redline.backends.fake_upstream import Dist, UpstreamSpec
from redline.errors import InvalidRequest
from redline.types import ChoiceAnswer, Chunk, ToolCallDelta

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, str]]:
    with gateway_support.gateway(tmp_path_factory.mktemp("legacy"),
                                 UpstreamSpec(ttft=Dist(0.0), tpot=Dist(0.0))) as (gw, up):
        client = openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0)
        yield client, up
        client.close()


def test_a_function_call_round_trip(gateway: tuple[openai.OpenAI, str]) -> None:
    client, up = gateway
    r = client.chat.completions.create(model="remote", messages=ASK,  # type: ignore[call-overload]
                                       functions=[WEATHER],
                                       function_call={"name": "get_weather"})
    sent = httpx.get(f"{up}/last").json()  # the engine is asked with tools
    assert sent["tools"] == [{"type": "function", "function": WEATHER}]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "functions" not in sent and "function_call" not in sent
    choice = r.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    call = choice.message.function_call
    assert call is not None and call.name == "get_weather"
    args = json.loads(call.arguments)
    # the answer goes back as a `function` message after the assistant's function_call
    again = client.chat.completions.create(model="remote", functions=[WEATHER], messages=[
        *ASK, {"role": "assistant", "content": None,
               "function_call": {"name": "get_weather", "arguments": json.dumps(args)}},
        {"role": "function", "name": "get_weather", "content": "Sunny, 21 C"}])
    sent = httpx.get(f"{up}/last").json()
    call_id = sent["messages"][1]["tool_calls"][0]["id"]
    assert sent["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert sent["messages"][2] == {"role": "tool", "content": "Sunny, 21 C",
                                   "tool_call_id": call_id, "name": "get_weather"}
    assert again.choices[0].message.content == "result: Sunny, 21 C."
    assert again.choices[0].finish_reason == "stop"


def test_a_streamed_function_call(gateway: tuple[openai.OpenAI, str]) -> None:
    client, _ = gateway
    stream = client.chat.completions.create(model="remote", messages=ASK, stream=True,
                                            functions=[WEATHER], function_call="auto")
    name, args, finish = "", "", None
    for chunk in stream:
        for c in chunk.choices:
            delta = c.delta
            assert delta.tool_calls is None
            if delta.function_call is not None:
                name += delta.function_call.name or ""
                args += delta.function_call.arguments or ""
            finish = c.finish_reason or finish
    assert name == "get_weather" and isinstance(json.loads(args), dict)
    assert finish == "function_call"


@pytest.mark.parametrize(("body", "param"), [
    ({"functions": [WEATHER], "tools": [{"type": "function", "function": WEATHER}]},
     "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"functions": []}, "functions"),
    ({"functions": [WEATHER], "function_call": "required"}, "function_call"),
    ({"functions": [WEATHER], "function_call": {"name": "nope"}}, "function_call"),
    ({"functions": [{"description": "no name"}]}, "functions[0].name"),
    ({"functions": [WEATHER], "messages": [*ASK, {"role": "function", "name": "get_weather",
                                                  "content": "x"}]}, "messages[1]"),
    ({"functions": [WEATHER], "messages": [*ASK, {"role": "assistant",
                                                  "function_call": {"name": 3}}]},
     "messages[1].function_call"),
])
def test_what_the_legacy_fields_cannot_mean_is_a_400(gateway: tuple[openai.OpenAI, str],
                                                      body: dict[str, Any], param: str) -> None:
    client, _ = gateway
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="remote", **{"messages": ASK, **body})
    assert err.value.body["param"] == param  # type: ignore[index]


def test_the_legacy_fields_read_as_tools() -> None:
    gen = ChatCompletionRequest.model_validate({
        "model": "m", "messages": ASK, "functions": [WEATHER],
        "function_call": "none"}).to_generation(None, "t")
    assert [t.name for t in gen.tools] == ["get_weather"] and gen.legacy_functions
    assert gen.tool_choice is not None and gen.tool_choice.mode == "none"
    assert gen.parallel_tool_calls is False  # a legacy answer holds one call
    assert "functions" not in gen.extra and gen.unmodelled() == []
    plain = ChatCompletionRequest.model_validate({"model": "m", "messages": ASK}).to_generation(
        None, "t")
    assert not plain.legacy_functions
    with pytest.raises(InvalidRequest):
        ChatCompletionRequest.model_validate({"model": "m", "messages": ASK, "functions": [],
                                              "function_call": "auto"}).to_generation(None, "t")


def test_the_encoder_writes_the_legacy_shape() -> None:
    enc = ChunkEncoder("chat", "req-1", "m", legacy=True)
    header = Chunk(tool_calls=(ToolCallDelta(0, "call_1", "function", "get_weather", '{"ci'),))
    event = json.loads(enc.delta(header, None))
    assert event["choices"][0]["delta"] == {
        "function_call": {"name": "get_weather", "arguments": '{"ci'}}
    rest = json.loads(enc.delta(Chunk(tool_calls=(ToolCallDelta(0, arguments='ty": "P"}'),)),
                                None))
    assert rest["choices"][0]["delta"] == {"function_call": {"arguments": 'ty": "P"}'}}
    assert json.loads(enc.finish(0, "tool_calls", None))["choices"][0]["finish_reason"] == \
        "function_call"
    answer = ChoiceAnswer(0)
    for c in (header, Chunk(tool_calls=(ToolCallDelta(0, arguments='ty": "P"}'),),
                            finish_reason="tool_calls")):
        answer.add(c)
    whole = json.loads(enc.full([answer], None))["choices"][0]
    assert whole["message"] == {"role": "assistant", "content": None, "function_call": {
        "name": "get_weather", "arguments": '{"city": "P"}'}}
    assert whole["finish_reason"] == "function_call"
    # without it: tool calls, as before
    plain = json.loads(ChunkEncoder("chat", "req-1", "m").delta(header, None))
    assert "tool_calls" in plain["choices"][0]["delta"]


def test_a_400_on_the_tools_names_the_functions_the_client_sent() -> None:
    """The embedded engine cannot force a call whose schema its grammar cannot enforce:
    the 400 names `functions`, the field the client sent, not the tools it was read as."""
    from redline.api.capabilities import _local
    from redline.config import ModelConfig

    odd = {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "multipleOf": 3}}}}
    gen = ChatCompletionRequest.model_validate({
        "model": "m", "messages": ASK, "functions": [odd],
        "function_call": {"name": "f"}}).to_generation(None, "t")
    with pytest.raises(InvalidRequest) as err:
        _local(ModelConfig(name="m", bundled="smollm2-135m-instruct"), gen)
    assert err.value.param == "functions" and "'functions'" in err.value.message
    tools = ChatCompletionRequest.model_validate({
        "model": "m", "messages": ASK, "tools": [{"type": "function", "function": odd}],
        "tool_choice": "required"}).to_generation(None, "t")
    with pytest.raises(InvalidRequest) as err:
        _local(ModelConfig(name="m", bundled="smollm2-135m-instruct"), tools)
    assert err.value.param == "tools"
