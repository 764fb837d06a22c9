"""POST /v1/responses with the official `openai` client, through a remote backend (the
fake upstream, which answers tools and json_schema as OpenAI does) and the fake local
backend: the Response object, its items and usage, the typed request the upstream was
asked, errors with param, stored state (retrieve, delete, input_items, a chain by
previous_response_id, store: false), tenants."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from responses_support import Gateway, responses_gateway  # noqa: F401  (the fixture)

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
ASK = "What is the weather in Paris?"


def _sent(up: str) -> dict[str, Any]:
    return httpx.get(f"{up}/last").json()  # type: ignore[no-any-return]


def test_text(gateway: Gateway) -> None:
    client, _, _, up = gateway
    r = client.responses.create(model="remote", input=ASK, instructions="Be brief.",
                                max_output_tokens=3, temperature=0.5, top_p=0.9,
                                metadata={"k": "v"}, user="u1")
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "remote"
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"]
    msg = r.output[0]
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.content[0].type == "output_text" and msg.content[0].text == "tok tok tok"
    assert r.output_text == "tok tok tok"
    assert r.usage is not None and r.usage.output_tokens == 3
    assert r.usage.input_tokens_details.cached_tokens == 1
    assert r.usage.total_tokens == r.usage.input_tokens + 3
    assert r.metadata == {"k": "v"} and r.instructions == "Be brief." and r.error is None
    sent = _sent(up)  # the typed request, as chat completions asks it
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": ASK}]
    assert sent["max_completion_tokens"] == 3 and sent["temperature"] == 0.5
    assert sent["top_p"] == 0.9 and sent["user"] == "u1"


def test_auto_and_the_local_backend(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    r = client.responses.create(model="auto", input="hi", max_output_tokens=64)
    assert r.model == "remote" and r.status in ("completed", "incomplete")
    local = client.responses.create(model="local", input="hi", max_output_tokens=5)
    assert local.model == "local" and local.output_text and local.usage is not None
    assert local.usage.output_tokens >= 1


def test_json_schema(gateway: Gateway) -> None:
    client, _, _, up = gateway
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "n": {"type": "integer"}},
              "required": ["city", "n"], "additionalProperties": False}
    r = client.responses.create(model="remote", input="A city?", max_output_tokens=64,
                                text={"format": {"type": "json_schema", "name": "city",
                                                 "schema": schema, "strict": True}})
    value = json.loads(r.output_text)
    assert set(value) == {"city", "n"} and isinstance(value["n"], int)
    sent = _sent(up)
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"] == schema
    assert r.text is not None and r.text.format.type == "json_schema"


def test_images_reach_the_upstream(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    r = client.responses.create(model="remote", max_output_tokens=1, input=[{
        "role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,iVBO"},
            {"type": "input_text", "text": "What is it?"}]}])
    assert r.output_text == "images:1"


def test_a_function_call_round_trip_by_previous_response_id(gateway: Gateway) -> None:
    client, _, _, up = gateway
    first = client.responses.create(model="remote", input=ASK, tools=[WEATHER],  # type: ignore[list-item]
                                    tool_choice="auto", max_output_tokens=64)
    assert first.status == "completed"
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "tok"} and call.call_id
    second = client.responses.create(
        model="remote", previous_response_id=first.id, tools=[WEATHER],  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "result: sunny." and second.previous_response_id == first.id
    sent = _sent(up)["messages"]  # the whole chain, as chat messages
    assert sent[0] == {"role": "user", "content": ASK}
    assert sent[1]["role"] == "assistant" and sent[1]["tool_calls"][0]["id"] == call.call_id
    assert sent[1]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                   "arguments": call.arguments}
    assert sent[2] == {"role": "tool", "content": "sunny", "tool_call_id": call.call_id}
    # a third turn carries the second's answer too
    third = client.responses.create(model="remote", previous_response_id=second.id,
                                    input="And tomorrow?", max_output_tokens=2)
    assert third.output_text == "tok tok"
    sent = _sent(up)["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert sent[3]["content"] == "result: sunny." and sent[4]["content"] == "And tomorrow?"


def test_function_call_items_given_by_the_client(gateway: Gateway) -> None:
    client, _, _, up = gateway
    r = client.responses.create(model="remote", tools=[WEATHER], input=[  # type: ignore[list-item]
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "rain"}])
    assert r.output_text == "result: rain."
    sent = _sent(up)["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_retrieve_delete_and_input_items(gateway: Gateway) -> None:
    client, other, _, _ = gateway
    r = client.responses.create(model="remote", max_output_tokens=2, input=[
        {"role": "user", "content": f"q{i}"} for i in range(5)])
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.status == r.status
    items = list(client.responses.input_items.list(r.id, limit=2, order="asc"))  # pages
    assert [i.content[0].text for i in items] == [f"q{i}" for i in range(5)]  # type: ignore[union-attr]
    assert len({i.id for i in items}) == 5
    page = client.responses.input_items.list(r.id, limit=2)  # newest first by default
    assert [i.content[0].text for i in page.data] == ["q4", "q3"]  # type: ignore[union-attr]
    assert page.has_more
    # another tenant sees none of it
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(r.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as err:
        other.responses.create(model="remote", input="x", previous_response_id=r.id)
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)


def test_store_false_keeps_nothing(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    r = client.responses.create(model="remote", input="hi", store=False, max_output_tokens=2)
    assert r.output_text == "tok tok" and r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="remote", input="x", previous_response_id=r.id)


@pytest.mark.parametrize(("body", "param"), [
    ({"frobnicate": 1}, "frobnicate"),
    ({"input": [{"type": "file_search_call"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "user", "content": "x", "extra_thing": 1}]}, "input[0].extra_thing"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice.name"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"background": True, "store": False}, "background"),
    ({"notify": {"webhook": "https://example.com/hook"}}, "notify"),
    ({"background": True, "notify": {"sms": "+1"}}, "notify.sms"),
    ({"input": []}, "input"),
    ({"input": [{"type": "reasoning", "summary": "x"}]}, "input[0].summary"),
    ({"tools": [{"type": "namespace", "name": "crm", "description": "d"}]}, "tools[0]"),
    ({"tools": [{"type": "namespace", "name": "crm", "description": "d", "tools": [
        {"type": "custom", "name": "patch"}]}]}, "tools[0].tools[0].type"),
    ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "a"}],
                 "content": [{"type": "text", "text": "b"}]}]}, "input[0].content[0]"),
    ({"include": ["message.output_text.logprobs", "nonsense"]}, "include[1]"),
    ({"top_logprobs": 21}, "top_logprobs"),
    # the embedded engine constrains json_schema by grammar: a keyword it cannot enforce
    ({"model": "local", "text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "patternProperties": {"^a": {"type": "string"}}}}}}, "text.format"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
])
def test_bad_requests_name_their_param(gateway: Gateway, body: dict[str, Any], param: str) -> None:
    _, _, url, _ = gateway
    r = httpx.post(f"{url}/v1/responses", json={"model": "remote", "input": "x", **body})
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]


def test_capabilities_are_checked(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    with pytest.raises(openai.BadRequestError) as err:  # the embedded engine has no tools
        client.responses.create(model="local", input=ASK, tools=[WEATHER])  # type: ignore[list-item]
    assert err.value.body["param"] == "tools"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="x")


def test_a_chain_past_the_context_is_a_400_with_truncation_disabled(gateway: Gateway) -> None:
    client, _, _, _ = gateway  # the local fake's context: 4096 words
    first = client.responses.create(model="local", input="word " * 3000, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="local", input="word " * 1500, max_output_tokens=2,
                                previous_response_id=first.id, truncation="disabled")
    assert err.value.code == "context_length_exceeded"
    fitted = client.responses.create(model="local", input="word " * 1500, max_output_tokens=2,
                                     previous_response_id=first.id, truncation="auto")
    assert fitted.status == "incomplete" and fitted.truncation == "auto"
    assert fitted.usage is not None  # the first input went; its 2-word answer stayed
    assert fitted.usage.input_tokens == 2 + 1500


def test_logprobs_by_include_whole_and_streamed(gateway: Gateway) -> None:
    """`include: ["message.output_text.logprobs"]` with `top_logprobs`; an empty `include`
    and `tools` (what OpenAI's Agents SDK sends on every call) change nothing."""
    client, _, _, up = gateway
    plain = client.responses.create(model="remote", input=ASK, max_output_tokens=3,
                                    include=[], tools=[])
    assert plain.output_text == "tok tok tok" and not plain.output[0].content[0].logprobs  # type: ignore[union-attr]
    assert "logprobs" not in _sent(up)
    kw: Any = {"model": "remote", "input": ASK, "max_output_tokens": 3, "top_logprobs": 2,
               "include": ["message.output_text.logprobs"]}
    r = client.responses.create(**kw)
    sent = _sent(up)
    assert sent["logprobs"] is True and sent["top_logprobs"] == 2
    part = r.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text" and part.logprobs
    assert "".join(lp.token for lp in part.logprobs) == part.text == "tok tok tok"
    assert all(len(lp.top_logprobs) == 2 and lp.bytes == list(lp.token.encode())
               for lp in part.logprobs)
    assert r.top_logprobs == 2
    events = list(client.responses.create(**kw, stream=True))
    deltas = [lp.token for e in events if e.type == "response.output_text.delta"
              for lp in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert deltas == [lp.token for lp in done.logprobs] == [lp.token for lp in part.logprobs]


def test_input_tokens_count_what_the_response_is_charged(gateway: Gateway) -> None:
    """POST /v1/responses/input_tokens (the client's responses.input_tokens.count): a remote
    model's engine counts the chat redline would send it (its /tokenize), the conversation
    of previous_response_id included, and the count is what the response's usage then
    says; a tenant cannot count another's conversation."""
    client, other, _, up = gateway
    first = client.responses.create(model="remote", input="My name is Ada.", max_output_tokens=3)
    ask: dict[str, Any] = {"model": "remote", "input": "What is my name?",
                           "instructions": "Be brief.", "previous_response_id": first.id}
    counted = client.responses.input_tokens.count(**ask)
    assert counted.object == "response.input_tokens"
    assert [m["content"] for m in _sent(up)["messages"]] == [
        "Be brief.", "My name is Ada.", first.output_text, "What is my name?"]
    used = client.responses.create(**ask, max_output_tokens=3)
    assert used.usage is not None and counted.input_tokens == used.usage.input_tokens
    assert counted.input_tokens > client.responses.input_tokens.count(
        model="remote", input="What is my name?").input_tokens
    with pytest.raises(openai.NotFoundError) as missing:
        other.responses.input_tokens.count(**ask)
    assert missing.value.body["param"] == "previous_response_id"  # type: ignore[index]
    for bad, param in (({"model": "auto"}, "model"), ({"model": "local"}, "model"),
                       ({"conversation": "conv_1"}, "conversation")):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.input_tokens.count(**{**ask, **bad})
        assert err.value.body["param"] == param, err.value.body  # type: ignore[index]


def test_reasoning_effort_reaches_a_remote_engine(gateway: Gateway) -> None:
    """`reasoning.effort` goes to a remote engine as chat's `reasoning_effort` and is
    echoed; the embedded engine does not reason (a 400 on the field), and a summary
    other than 'auto' is refused: the engines give reasoning text, not summaries."""
    client, _, url, up = gateway
    r = client.responses.create(model="remote", input="hi", max_output_tokens=2,
                                reasoning={"effort": "low", "summary": "auto"})
    assert _sent(up)["reasoning_effort"] == "low"
    assert r.reasoning is not None and r.reasoning.effort == "low"
    assert r.reasoning.summary == "auto"
    client.responses.create(model="remote", input="hi", max_output_tokens=2)
    assert "reasoning_effort" not in _sent(up)
    with pytest.raises(openai.BadRequestError) as local:
        client.responses.create(model="local", input="hi", reasoning={"effort": "low"})
    assert local.value.body["param"] == "reasoning.effort"  # type: ignore[index]
    for body, param in [({"summary": "concise"}, "reasoning.summary"),
                        ({"effort": "extreme"}, "reasoning.effort"),
                        ({"budget": 5}, "reasoning.budget")]:
        raw = httpx.post(f"{url}/v1/responses", headers={"Authorization": "Bearer key-a"},
                         json={"model": "remote", "input": "x", "reasoning": body})
        assert raw.status_code == 400 and raw.json()["error"]["param"] == param, raw.text


def test_verbosity_and_cache_retention_reach_a_remote_engine(gateway: Gateway) -> None:
    """GPT-5's `text.verbosity` goes to a remote engine as chat's `verbosity`, and
    `prompt_cache_retention` as it is; on the embedded engine only the default verbosity
    is taken, and either retention (a hint: prefixes stay as long as memory holds them)."""
    client, _, _, up = gateway
    client.responses.create(model="remote", input="hi", max_output_tokens=2,
                            text={"verbosity": "low"}, prompt_cache_retention="24h")
    sent = _sent(up)
    assert sent["verbosity"] == "low" and sent["prompt_cache_retention"] == "24h"
    client.responses.create(model="remote", input="hi", max_output_tokens=2)
    assert "verbosity" not in _sent(up) and "prompt_cache_retention" not in _sent(up)
    r = client.responses.create(model="local", input="hi", max_output_tokens=2,
                                text={"verbosity": "medium"}, prompt_cache_retention="24h")
    assert r.error is None and r.output_text
    assert r.text is not None and r.text.verbosity == "medium"  # echoed as asked
    assert r.prompt_cache_retention == "24h"
    with pytest.raises(openai.BadRequestError) as local:
        client.responses.create(model="local", input="hi", text={"verbosity": "high"})
    assert local.value.body["param"] == "text.verbosity"  # type: ignore[index]


def test_service_tier_and_stream_options(gateway: Gateway) -> None:
    """`service_tier` as chat takes it (a remote engine gets it as sent; the embedded one
    serves `auto` and `default`), echoed; `stream_options.include_obfuscation` taken at
    false (redline pads no deltas), and true is a 400 rather than a stream without it."""
    client, _, _, up = gateway
    r = client.responses.create(model="remote", input="hi", max_output_tokens=2,
                                service_tier="flex")
    assert _sent(up)["service_tier"] == "flex" and r.service_tier == "flex"
    r = client.responses.create(model="local", input="hi", max_output_tokens=2,
                                service_tier="auto", max_tool_calls=3)
    assert r.service_tier == "auto" and r.max_tool_calls == 3  # no built-in tool runs here
    with pytest.raises(openai.BadRequestError) as local:
        client.responses.create(model="local", input="hi", service_tier="priority")
    assert local.value.body["param"] == "service_tier"  # type: ignore[index]
    events = list(client.responses.create(model="local", input="hi", max_output_tokens=2,
                                          stream=True,
                                          stream_options={"include_obfuscation": False}))
    assert events[-1].type == "response.incomplete"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="local", input="hi", stream=True,
                                stream_options={"include_obfuscation": True})
    assert err.value.body["param"] == "stream_options.include_obfuscation"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="local", messages=[{"role": "user", "content": "x"}],
                                       stream=True, stream_options={"include_obfuscation": True})
    assert err.value.body["param"] == "stream_options.include_obfuscation"  # type: ignore[index]


def test_a_stateless_client_sends_a_reasoning_models_output_back(gateway: Gateway) -> None:
    """store: false with include reasoning.encrypted_content, as stateless agent clients
    send it: the reasoning item of a remote reasoning model's answer comes back as input
    next turn and is taken (kept, never replayed to the engine: it gets the messages)."""
    client, _, _, up = gateway
    ask = {"model": "remote", "store": False, "max_output_tokens": 6,
           "reasoning": {"effort": "low"}, "include": ["reasoning.encrypted_content"]}
    first = client.responses.create(input="first", **ask)  # type: ignore[call-overload]
    kinds = [o.type for o in first.output]
    assert kinds[0] == "reasoning" and "message" in kinds
    history = [{"role": "user", "content": "first"},
               *[o.model_dump(exclude_none=True) for o in first.output],
               {"role": "user", "content": "second"}]
    client.responses.create(input=history, **ask)  # type: ignore[call-overload]
    sent = _sent(up)["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == first.output_text


def test_codex_client_metadata_is_taken(gateway: Gateway) -> None:
    """Codex CLI sends `client_metadata` (its turn's ids, as strings) on every call."""
    client, _, url, up = gateway
    r = client.responses.create(model="remote", input="hi", max_output_tokens=2,
                                extra_body={"client_metadata": {"x-codex-turn-metadata": "{}",
                                                                "thread_id": "t1"}})
    assert r.status == "incomplete" and "client_metadata" not in _sent(up)
    bad = httpx.post(f"{url}/v1/responses", json={"model": "remote", "input": "x",
                                                  "client_metadata": {"n": 5}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "client_metadata.n"


CRM = {"type": "namespace", "name": "crm", "description": "The customer records.",
       "tools": [{"type": "function", "name": "lookup", "description": "Find a customer.",
                  "parameters": {"type": "object", "properties": {"who": {"type": "string"}},
                                 "required": ["who"]}}]}


def test_namespace_tools(gateway: Gateway) -> None:
    """Function tools grouped in a `namespace` (Codex CLI sends its sub-agent tools so):
    the engine gets each as one function (`crm__lookup`, the namespace's description
    before its own), and the call comes back split into `namespace` and `name`, whole and
    streamed; given back as input, it is the engine's function again."""
    client, _, _, up = gateway
    r = client.responses.create(model="remote", input="Find Ada.", tools=[CRM],
                                tool_choice={"type": "function", "name": "lookup",
                                             "namespace": "crm"})
    sent = _sent(up)
    assert [t["function"]["name"] for t in sent["tools"]] == ["crm__lookup"]
    assert sent["tools"][0]["function"]["description"] == "The customer records. Find a customer."
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "crm__lookup"}}
    call = r.output[-1].model_dump(exclude_none=True)
    assert call["type"] == "function_call" and call["name"] == "lookup"
    assert call["namespace"] == "crm"
    events = list(client.responses.create(model="remote", input="Find Ada.", tools=[CRM],
                                          tool_choice="required", stream=True))
    added = next(e for e in events if e.type == "response.output_item.added")
    assert (added.item.name, added.item.namespace) == ("lookup", "crm")  # type: ignore[union-attr]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.name == "lookup"
    client.responses.create(model="remote", tools=[CRM], input=[
        {"role": "user", "content": "Find Ada."}, call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "found"}])
    assert _sent(up)["messages"][1]["tool_calls"][0]["function"]["name"] == "crm__lookup"
