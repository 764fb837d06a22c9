"""POST /v1/responses with stream: true, with the official `openai` client's stream
iteration and its `responses.stream(...)` helper: OpenAI's semantic events numbered by
sequence_number, redline's progress on them, the stored answer; and the resume of a
response's stream (GET /v1/responses/{id}?stream=true&starting_after=N), byte for byte."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel
from responses_support import Gateway, responses_gateway  # noqa: F401  (the fixture)

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def test_text_events_in_order(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    events = list(client.responses.create(model="remote", input="hi", max_output_tokens=4,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 4,
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created = events[0]
    assert created.type == "response.created" and created.response.status == "in_progress"
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(d.delta for d in deltas) == "tok tok tok tok"
    item_id = events[2].item.id  # type: ignore[union-attr]
    assert all(d.item_id == item_id and d.output_index == 0 for d in deltas)
    progress = [d.redline["progress"] for d in deltas]  # redline's, as on chat
    assert [p["tokens"] for p in progress] == [1, 2, 3, 4]
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.output_text == "tok tok tok tok"
    assert last.response.usage is not None and last.response.usage.output_tokens == 4
    assert last.redline["progress"]["eta_ms"] == 0
    # stored before the last event went out: retrievable, and a chain can go on from it
    got = client.responses.retrieve(last.response.id)
    assert got.output_text == "tok tok tok tok" and got.status == "incomplete"
    follow = client.responses.create(model="remote", input="more", max_output_tokens=1,
                                     previous_response_id=got.id)
    assert follow.output_text == "tok"


def test_the_stream_helper_with_a_function_call(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    with client.responses.stream(model="remote", input="Weather in Paris?", tools=[WEATHER],  # type: ignore[list-item]
                                 max_output_tokens=64) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-1] == "response.completed"
    call = final.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "tok"}
    done = client.responses.create(model="remote", previous_response_id=final.id,
                                   tools=[WEATHER],  # type: ignore[list-item]
                                   input=[{"type": "function_call_output",
                                           "call_id": call.call_id, "output": "snow"}])
    assert done.output_text == "result: snow."


def test_the_stream_helper_text(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    with client.responses.stream(model="remote", input="hi", max_output_tokens=3) as stream:
        events = list(stream)
    texts = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert texts == ["tok", " tok", " tok"]
    last = events[-1]  # cut at max_output_tokens (the helper's final response is a completed one)
    assert last.type == "response.incomplete" and last.response.output_text == "tok tok tok"


class City(BaseModel):
    city: str
    n: int


def test_the_stream_helper_parses_a_json_schema(gateway: Gateway) -> None:
    client, _, _, up = gateway
    with client.responses.stream(model="remote", input="A city?", text_format=City,
                                 max_output_tokens=64) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, City)
    sent = httpx.get(f"{up}/last").json()["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "City"


def _raw_stream(url: str, body: dict[str, Any], key: str = "key-a") -> bytes:
    with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200
        return r.read()


def _events(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


def test_resume_replays_exactly_what_followed(gateway: Gateway) -> None:
    _, _, url, _ = gateway
    raw = _raw_stream(url, {"model": "remote", "input": "hi", "max_output_tokens": 12,
                            "stream": True})
    events = _events(raw)
    rid = json.loads(events[0].split(b"data: ", 1)[1])["response"]["id"]
    rng = random.Random(7)
    points = [-1, 0, len(events) - 2, *(rng.randrange(0, len(events) - 1) for _ in range(10))]
    for n in points:  # the events after sequence_number n, then the end marker
        r = httpx.get(f"{url}/v1/responses/{rid}",
                      params={"stream": "true", "starting_after": n},
                      headers={"Authorization": "Bearer key-a"}, timeout=30)
        assert r.status_code == 200
        assert r.content == b"".join(events[n + 1:]), n
    other = httpx.get(f"{url}/v1/responses/{rid}", params={"stream": "true"},
                      headers={"Authorization": "Bearer key-b"})
    assert other.status_code == 404
    with pytest.raises(openai.BadRequestError):  # not a background one
        gateway[0].responses.cancel(rid)
    gateway[0].responses.delete(rid)  # deleted: its stream cannot be replayed either
    gone = httpx.get(f"{url}/v1/responses/{rid}", params={"stream": "true"},
                     headers={"Authorization": "Bearer key-a"})
    assert gone.status_code == 404
    bad = httpx.get(f"{url}/v1/responses/{rid}", params={"stream": "true", "starting_after": "x"},
                    headers={"Authorization": "Bearer key-a"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"


def test_the_client_resumes_with_starting_after(gateway: Gateway) -> None:
    client, other, _, _ = gateway
    events = list(client.responses.create(model="remote", input="hi", max_output_tokens=5,
                                          stream=True))
    rid = events[0].response.id  # type: ignore[union-attr]
    again = list(client.responses.retrieve(rid, stream=True, starting_after=3))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events[4:]]
    with pytest.raises(openai.NotFoundError):
        list(other.responses.retrieve(rid, stream=True))


def test_store_false_streams_keep_nothing(gateway: Gateway) -> None:
    client, _, url, _ = gateway
    events = list(client.responses.create(model="remote", input="hi", max_output_tokens=2,
                                          stream=True, store=False))
    assert events[-1].type == "response.incomplete"
    rid = events[-1].response.id  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(rid)
    r = httpx.get(f"{url}/v1/responses/{rid}", params={"stream": "true"},
                  headers={"Authorization": "Bearer key-a"})
    assert r.status_code == 404
