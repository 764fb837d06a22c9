"""The whole chat surface through a remote OpenAI-compatible backend, seen by the official
`openai` client: for each feature (tools, logprobs, n, image parts, response formats,
usage details), what the client gets through redline equals what it gets from the
upstream directly (same objects, streamed and not), in batch lines and background jobs
too; an agent loop; pass-through of the fields redline does not model; resume in the
middle of a tool call; bad input."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import gateway_support
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from redline.backends.fake_upstream import Dist, UpstreamSpec

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=",
                                            "detail": "low"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

FEATURES: dict[str, dict[str, Any]] = {
    "plain": {"messages": ASK},
    "tools": {"messages": ASK, "tools": [WEATHER]},
    "parallel_tools": {"messages": ASK, "tools": [WEATHER, TIME]},
    "named_tool": {"messages": ASK, "tools": [WEATHER, TIME],
                   "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
    "logprobs": {"messages": ASK, "logprobs": True, "top_logprobs": 3},
    "n": {"messages": ASK, "n": 3, "logprobs": True, "top_logprobs": 1},
    "n_tools": {"messages": ASK, "n": 2, "tools": [WEATHER]},
    "image": {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                                        IMAGE]}]},
    "reasoning": {"messages": ASK, "reasoning_effort": "low"},
    "json_schema": {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "strict": True, "schema": {"type": "object", "properties": {
            "temp": {"type": "number"}, "sky": {"enum": ["clear", "rain"]}}}}}},
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[tuple[openai.OpenAI, openai.OpenAI, str, str]]:
    """The fake upstream and redline in front of it (one pair for the module)."""
    with gateway_support.gateway(tmp_path_factory.mktemp("fidelity"),
                                 UpstreamSpec(ttft=Dist(0.0), tpot=Dist(0.0), cached_tokens=2),
                                 server={"max_n": 4}) as (gw, up):
        direct = openai.OpenAI(base_url=f"{up}/v1", api_key="x", max_retries=0)
        through = openai.OpenAI(base_url=f"{gw}/v1", api_key="x", max_retries=0)
        yield direct, through, up, gw
        direct.close()
        through.close()


def _whole(resp: Any) -> dict[str, Any]:
    out = resp.model_dump()
    for key in ("id", "created", "model", "system_fingerprint"):
        out.pop(key, None)
    return out


def _events(stream: Any) -> tuple[list[Any], Any]:
    """What a stream says, chunk by chunk and choice by choice (the role alone aside)."""
    seen, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for c in chunk.choices:
            d = c.delta
            calls = None if d.tool_calls is None else [t.model_dump() for t in d.tool_calls]
            lps = None if c.logprobs is None else c.logprobs.model_dump()
            thought = (d.model_extra or {}).get("reasoning_content")
            if d.content or calls or c.finish_reason or lps or thought:
                seen.append((c.index, d.content, thought, calls, lps, c.finish_reason))
    return seen, usage


@pytest.mark.parametrize("feature", list(FEATURES))
def test_the_client_gets_what_the_upstream_gives(servers: Any, feature: str) -> None:
    direct, through, _, _ = servers
    body = {"max_tokens": 4, **FEATURES[feature]}
    want = direct.chat.completions.create(model="served", **body)
    got = through.chat.completions.create(model="remote", **body)
    assert _strip(_whole(got)) == _strip(_whole(want))
    assert got.usage is not None and got.usage.prompt_tokens_details is not None
    assert got.usage.prompt_tokens_details.cached_tokens == 2
    opts = {"stream": True, "stream_options": {"include_usage": True}}
    want_events = _events(direct.chat.completions.create(model="served", **body, **opts))
    got_events = _events(through.chat.completions.create(model="remote", **body, **opts))
    # tool-call ids are the upstream's own per request: compare them by shape only
    assert _strip(got_events) == _strip(want_events)
    assert got_events[0], "the stream said something"
    if feature == "reasoning":
        assert got.choices[0].message.model_extra["reasoning_content"] == "Let me think."
        assert [e[2] for e in got_events[0][:2]] == ["Let me", " think."]


def _strip(value: Any) -> Any:
    """`value` with every tool-call id replaced by a marker."""
    if isinstance(value, dict):
        return {k: ("<id>" if k == "id" and v else _strip(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strip(v) for v in value]
    return value


def test_tool_calls_keep_their_ids_and_fragments(servers: Any) -> None:
    _, through, _, _ = servers
    chunks = list(through.chat.completions.create(
        model="remote", messages=ASK, tools=[WEATHER, TIME], stream=True, max_tokens=4))
    calls = [t for c in chunks for ch in c.choices for t in ch.delta.tool_calls or ()]
    heads = [t for t in calls if t.id is not None]
    assert [(t.index, t.function.name, t.function.arguments) for t in heads] == [
        (0, "get_weather", ""), (1, "get_time", "")]
    args = "".join(t.function.arguments or "" for t in calls if t.index == 0)
    assert json.loads(args) == {"city": "tok", "unit": "c"}
    assert all(len(t.function.arguments or "") <= 5 for t in calls)  # the upstream's split
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_an_agent_loop(servers: Any) -> None:
    """Assistant tool call -> tool result -> final answer, through redline."""
    _, through, _, _ = servers
    messages: list[Any] = [{"role": "system", "content": "You call tools."}, *ASK]
    first = through.chat.completions.create(model="remote", messages=messages, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"})
    final = through.chat.completions.create(model="remote", messages=messages, tools=[WEATHER])
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == "result: sunny, 21C."
    assert final.choices[0].message.tool_calls is None


def test_fields_pass_through_and_extensions_do_not(servers: Any) -> None:
    _, through, up, _ = servers
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": 1},
                                             IMAGE], "x_note": "kept"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    through.chat.completions.create(
        model="remote", messages=messages, tools=[WEATHER], tool_choice="auto",
        parallel_tool_calls=False, seed=7, presence_penalty=0.5, frequency_penalty=-0.5,
        logit_bias={"50256": -100}, max_completion_tokens=3,
        verbosity="high", prompt_cache_retention="24h",
        extra_body={"reasoning_effort": "low", "tier": "A",
                    "cache": False, "allow_background": False, "store": False,
                    "service_tier": "auto",
                    # vLLM's sampling fields, which the embedded engine honours too
                    "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 0,
                    "stop_token_ids": [7], "include_stop_str_in_output": True,
                    "prediction": {"type": "content", "content": "It is sunny."},
                    "structured_outputs": {"regex": "[a-z]+"}})
    sent = httpx.get(f"{up}/last").json()
    assert sent["structured_outputs"] == {"regex": "[a-z]+"}  # the engine's to serve
    assert sent["prediction"] == {"type": "content", "content": "It is sunny."}
    assert sent["service_tier"] == "auto" and "store" not in sent  # redline stores, or not
    assert (sent["min_p"], sent["repetition_penalty"], sent["min_tokens"]) == (0.05, 1.1, 0)
    assert sent["stop_token_ids"] == [7] and sent["include_stop_str_in_output"] is True
    assert sent["messages"] == messages
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == "auto"
    assert sent["parallel_tool_calls"] is False and sent["seed"] == 7
    assert (sent["presence_penalty"], sent["frequency_penalty"]) == (0.5, -0.5)
    assert sent["logit_bias"] == {"50256": -100} and sent["max_completion_tokens"] == 3
    assert sent["reasoning_effort"] == "low"
    assert sent["verbosity"] == "high" and sent["prompt_cache_retention"] == "24h"
    assert sent["model"] == "served"
    for ours in ("tier", "cache", "allow_background", "background", "notify"):
        assert ours not in sent


def test_text_completions_logprobs_and_n(servers: Any) -> None:
    direct, through, _, _ = servers
    body = {"prompt": "Say", "max_tokens": 3, "logprobs": 2, "n": 2, "echo": False}
    assert _whole(through.completions.create(model="remote", **body)) == \
        _whole(direct.completions.create(model="served", **body))
    through.completions.create(model="remote", prompt="Say", max_tokens=2, echo=True)
    assert httpx.get(f"{servers[2]}/last").json()["echo"] is True  # as sent: the engine echoes
    through.completions.create(model="remote", prompt="def f():", suffix="\n", max_tokens=2)
    assert httpx.get(f"{servers[2]}/last").json()["suffix"] == "\n"  # the engine fills it
    for ids in ([5, 6, 7], [[5, 6], [7]]):  # token ids, as sent: the engine's vocabulary
        through.completions.create(model="remote", prompt=ids, max_tokens=2)
        assert httpx.get(f"{servers[2]}/last").json()["prompt"] == ids


def test_a_list_of_prompts_goes_upstream_and_every_choice_comes_back(servers: Any) -> None:
    direct, through, up, _ = servers
    body = {"prompt": ["Say", "Say it again"], "max_tokens": 3, "n": 2}
    got = _whole(through.completions.create(model="remote", **body))
    assert httpx.get(f"{up}/last").json()["prompt"] == body["prompt"]
    assert got == _whole(direct.completions.create(model="served", **body))
    assert [c["index"] for c in got["choices"]] == [0, 1, 2, 3]
    texts: dict[int, str] = {}
    usage = None
    for chunk in through.completions.create(model="remote", stream=True,
                                            stream_options={"include_usage": True}, **body):
        usage = chunk.usage.model_dump() if chunk.usage else usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c["index"]: c["text"] for c in got["choices"]} and usage == got["usage"]


def test_resume_in_the_middle_of_a_tool_call_gives_the_same_bytes(servers: Any) -> None:
    _, _, _, gw = servers
    body = {"model": "remote", "messages": ASK, "tools": [WEATHER, TIME], "n": 2,
            "stream": True, "max_tokens": 4}
    with httpx.stream("POST", f"{gw}/v1/chat/completions", json=body, timeout=30) as r:
        stream_id = r.headers["x-redline-stream-id"]
        whole = b"".join(r.iter_bytes())
    events = [e + b"\n\n" for e in whole.split(b"\n\n") if e]
    mid = next(i for i, e in enumerate(events) if b'"function":{"arguments":' in e)
    assert 0 < mid < len(events) - 2
    r = httpx.get(f"{gw}/v1/streams/{stream_id}", params={"after": mid}, timeout=30)
    assert r.status_code == 200
    assert r.content == b"".join(events[mid:])
    assert b"".join(events[:mid]) + r.content == whole


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]},
     "tools[0].function.parameters"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"minimum": "no"}}}}}},
     "response_format.json_schema.schema"),
    ({"n": 5}, "n"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]},
     "tool_choice"),
])
def test_bad_input_is_a_400_with_param(servers: Any, extra: dict[str, Any], param: str) -> None:
    _, through, _, _ = servers
    with pytest.raises(openai.BadRequestError) as err:
        through.chat.completions.create(model="remote", messages=ASK, extra_body=extra)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param  # type: ignore[index]


def _submit_batch(client: openai.OpenAI, url: str, bodies: dict[str, dict[str, Any]]) -> str:
    """A batch of `bodies` (custom_id -> body) for `url`, created; its id."""
    lines = [{"custom_id": cid, "method": "POST", "url": url, "body": b}
             for cid, b in bodies.items()]
    f = client.files.create(file=("in.jsonl", "\n".join(json.dumps(x) for x in lines).encode()),
                            purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint=url,  # type: ignore[arg-type]
                                 completion_window="24h").id


def _batch_output(client: openai.OpenAI, batch_id: str) -> dict[str, Any]:
    """custom_id -> the response of each line, once the batch completed with no errors."""
    deadline = time.monotonic() + 60
    while (batch := client.batches.retrieve(batch_id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.05)
    assert batch.status == "completed" and batch.error_file_id is None, batch
    assert batch.output_file_id is not None
    lines = [json.loads(raw) for raw in client.files.content(batch.output_file_id).text.splitlines()]
    return {line["custom_id"]: line["response"] for line in lines}


def test_batch_lines_and_background_jobs_answer_what_the_endpoint_answers(servers: Any) -> None:
    """Every feature above in a batch line and as a background job: the answer is the body
    the endpoint gives the same request (the job keeps the body the client sent, unknown
    fields included, and reads it again when it runs)."""
    _, through, _, gw = servers
    bodies = {f: {"model": "remote", "max_tokens": 4, **FEATURES[f]} for f in FEATURES}
    bodies["passed_on"] = {**bodies["plain"], "frobnicate": {"x": 1}}  # for the upstream
    batch_id = _submit_batch(through, "/v1/chat/completions", bodies)
    jobs = {}
    with httpx.Client(base_url=gw, timeout=30) as http:
        for name in ("tools", "n", "json_schema"):
            r = http.post("/v1/chat/completions", json={**bodies[name], "background": True})
            assert r.status_code == 202, r.text
            jobs[name] = r.json()["id"]
        out = {}
        for cid, response in _batch_output(through, batch_id).items():
            assert response["status_code"] == 200, response
            out[cid] = ChatCompletion.model_validate(response["body"])
        deadline = time.monotonic() + 60

        def endpoint(body: dict[str, Any]) -> ChatCompletion:
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return ChatCompletion.model_validate(r.json())

        for name, body in bodies.items():
            assert _strip(_whole(out[name])) == _strip(_whole(endpoint(body))), name
        for name, job_id in jobs.items():
            while (job := http.get(f"/v1/jobs/{job_id}").json())["status"] in ("queued", "running"):
                assert time.monotonic() < deadline, job
                time.sleep(0.05)
            assert job["status"] == "succeeded", job
            got = ChatCompletion.model_validate(job["result"])
            assert _strip(_whole(got)) == _strip(_whole(endpoint(bodies[name]))), name
    assert out["n"].choices[2].logprobs is not None
    assert out["tools"].choices[0].message.tool_calls


def test_tokenize_goes_to_a_remote_model_s_engine(servers: Any) -> None:
    """A remote model's /tokenize is its engine's (vLLM's, SGLang's); an engine without one
    (this fake upstream, like OpenAI) is a 400 that says so, not a guess."""
    _, _, _, gw = servers
    r = httpx.post(f"{gw}/tokenize", json={"model": "remote", "prompt": "hello"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "/tokenize" in r.json()["error"]["message"]


def test_an_embeddings_batch_answers_what_the_endpoint_answers(servers: Any) -> None:
    """/v1/embeddings as a Batch API endpoint, for a remote model: each line's body is what
    POST /v1/embeddings gives (the upstream's vectors, the model named as redline names it)."""
    _, through, _, gw = servers
    bodies: dict[str, dict[str, Any]] = {
        "one": {"model": "remote", "input": "a red car"},
        "two": {"model": "remote", "input": ["two", "inputs"]}}
    out = _batch_output(through, _submit_batch(through, "/v1/embeddings", bodies))
    for cid, body in bodies.items():
        want = httpx.post(f"{gw}/v1/embeddings", json=body).json()
        assert out[cid]["status_code"] == 200 and out[cid]["body"] == want
        inputs = body["input"]
        assert want["model"] == "remote"
        assert len(want["data"]) == (len(inputs) if isinstance(inputs, list) else 1)
