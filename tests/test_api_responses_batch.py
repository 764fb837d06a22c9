"""/v1/responses as a Batch API endpoint, as OpenAI's Batch API has it, with the official
`openai` client: each line is answered with the Response POST /v1/responses gives the
same body (stored under the batch's tenant, retrievable by id, a chain by
previous_response_id), and a line that cannot run is an error line, not a lost one."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response
from responses_support import Gateway, responses_gateway  # noqa: F401  (the fixture)

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def _batch(client: openai.OpenAI, bodies: dict[str, dict[str, Any]]) -> openai.types.Batch:
    """A batch of /v1/responses lines (custom_id -> body), run to its end."""
    lines = [{"custom_id": cid, "method": "POST", "url": "/v1/responses", "body": b}
             for cid, b in bodies.items()]
    f = client.files.create(file=("in.jsonl", "\n".join(json.dumps(x) for x in lines).encode()),
                            purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/responses",
                                  completion_window="24h")
    deadline = time.monotonic() + 60
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.05)
    return batch


def _lines(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    assert file_id is not None
    rows = [json.loads(raw) for raw in client.files.content(file_id).text.splitlines()]
    return {row["custom_id"]: row["response"] for row in rows}


def test_lines_answer_and_store_what_the_endpoint_does(gateway: Gateway) -> None:
    client, other, _, _ = gateway
    batch = _batch(client, {
        "plain": {"model": "remote", "input": "hi", "instructions": "Be brief.",
                  "max_output_tokens": 3, "metadata": {"k": "v"}},
        "tools": {"model": "remote", "input": "What is the weather in Paris?",
                  "tools": [WEATHER], "tool_choice": "required"},
        "unstored": {"model": "remote", "input": "hi", "max_output_tokens": 3, "store": False},
    })
    assert batch.status == "completed" and batch.error_file_id is None, batch
    assert batch.request_counts is not None and batch.request_counts.completed == 3
    out = _lines(client, batch.output_file_id)
    # built as the client builds what POST /v1/responses answers (its newest
    # usage fields, such as cache_write_tokens, are not checked here)
    answers = {cid: Response.construct(**r["body"]) for cid, r in out.items()}
    assert all(r["status_code"] == 200 and r["request_id"] == r["body"]["id"]
               for r in out.values())
    raw = client.responses.with_raw_response.create(
        model="remote", input="hi", instructions="Be brief.", max_output_tokens=3,
        metadata={"k": "v"})
    live = raw.parse()
    plain = answers["plain"]
    assert plain.id.startswith("resp_") and plain.id != live.id
    assert set(out["plain"]["body"]) == set(raw.http_response.json())  # the same fields
    assert (plain.output_text, plain.status, plain.metadata) == (live.output_text, live.status,
                                                                 live.metadata)
    assert plain.usage is not None and live.usage is not None
    assert plain.usage.output_tokens == live.usage.output_tokens == 3
    calls = [item for item in answers["tools"].output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    # stored under the batch's tenant: its owner reads it, another tenant gets a 404
    assert client.responses.retrieve(plain.id).output_text == plain.output_text
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(plain.id)
    with pytest.raises(openai.NotFoundError):  # store: false keeps nothing
        client.responses.retrieve(answers["unstored"].id)


def test_a_line_continues_a_conversation(gateway: Gateway) -> None:
    client, _, _, up = gateway
    first = client.responses.create(model="remote", input="My name is Ada.", max_output_tokens=3)
    batch = _batch(client, {"next": {"model": "remote", "input": "What is my name?",
                                     "previous_response_id": first.id, "max_output_tokens": 3}})
    answer = Response.construct(**_lines(client, batch.output_file_id)["next"]["body"])
    assert answer.previous_response_id == first.id
    sent = httpx.get(f"{up}/last").json()  # what the upstream was asked: the whole chain
    assert [m["content"] for m in sent["messages"]] == [
        "My name is Ada.", first.output_text, "What is my name?"]
    # and the batch's answer continues in turn, live
    third = client.responses.create(model="remote", input="And again?",
                                    previous_response_id=answer.id, max_output_tokens=3)
    assert third.status in ("completed", "incomplete")


def test_lines_that_cannot_run_are_error_lines(gateway: Gateway) -> None:
    client, other, _, _ = gateway
    theirs = other.responses.create(model="remote", input="secret", max_output_tokens=3)
    batch = _batch(client, {
        "ok": {"model": "remote", "input": "hi", "max_output_tokens": 3},
        "not_mine": {"model": "remote", "input": "hi", "previous_response_id": theirs.id},
        "no_model": {"model": "nope", "input": "hi"},
    })
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 2)
    errors = _lines(client, batch.error_file_id)
    assert errors["not_mine"]["status_code"] == 404
    assert errors["not_mine"]["body"]["error"]["param"] == "previous_response_id"
    assert errors["no_model"]["status_code"] == 404
    assert errors["no_model"]["body"]["error"]["code"] == "model_not_found"
    assert set(_lines(client, batch.output_file_id)) == {"ok"}


def test_a_background_or_malformed_line_is_refused_when_the_batch_is_made(
        gateway: Gateway) -> None:
    client, _, _, _ = gateway
    for body, param in (({"model": "remote", "input": "hi", "background": True}, "background"),
                        ({"model": "remote", "input": "hi", "frobnicate": 1}, "frobnicate"),
                        ({"model": "remote"}, "input"),
                        ({"model": "remote", "input": [{"type": "web_search_call"}]},
                         "input[0].type"),
                        ({"model": "remote", "input": "hi", "tools": [{"type": "x"}]},
                         "tools[0].type")):
        batch = _batch(client, {"x": body})
        assert batch.status == "failed", batch
        assert batch.errors is not None and batch.errors.data
        assert batch.errors.data[0].param == param, batch.errors
