"""The Conversations API (/v1/conversations) with the official `openai` client, and the
Responses API's `conversation`: a conversation's items as created, listed, paged,
added and deleted; responses that read it as their context and add their input and
output to it (whole, streamed, in the background); OpenAI's Agents SDK keeping an
agent's memory in it; tenants; bad requests named by their param."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
from responses_support import Gateway, responses_gateway  # noqa: F401  (the fixture)


def _sent(up: str) -> dict[str, Any]:
    return httpx.get(f"{up}/last").json()  # type: ignore[no-any-return]


def _texts(items: list[Any]) -> list[tuple[str, str]]:
    """(role, text) of each message item."""
    return [(i.role, "".join(getattr(p, "text", "") for p in i.content))
            for i in items if i.type == "message"]


def test_create_retrieve_update_delete(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    conv = client.conversations.create(
        metadata={"topic": "demo"},
        items=[{"type": "message", "role": "user", "content": "Hello!"}])
    assert conv.id.startswith("conv_") and conv.object == "conversation"
    assert conv.metadata == {"topic": "demo"} and conv.created_at <= time.time() + 1
    got = client.conversations.retrieve(conv.id)
    assert got.id == conv.id and got.metadata == {"topic": "demo"}
    assert got.created_at == conv.created_at
    updated = client.conversations.update(conv.id, metadata={"topic": "other", "k": "v"})
    assert updated.metadata == {"topic": "other", "k": "v"}
    assert client.conversations.retrieve(conv.id).metadata == {"topic": "other", "k": "v"}
    items = list(client.conversations.items.list(conv.id))
    assert _texts(items) == [("user", "Hello!")]
    deleted = client.conversations.delete(conv.id)
    assert deleted.id == conv.id and deleted.deleted and deleted.object == "conversation.deleted"
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.delete(conv.id)


def test_items_added_listed_paged_retrieved_and_deleted(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    conv = client.conversations.create()
    assert list(client.conversations.items.list(conv.id)) == []
    added = client.conversations.items.create(conv.id, items=[
        {"type": "message", "role": "user", "content": f"q{i}"} for i in range(5)])
    assert [t for _, t in _texts(added.data)] == ["q0", "q1", "q2", "q3", "q4"]
    assert added.first_id == added.data[0].id and added.last_id == added.data[-1].id
    assert not added.has_more
    more = client.conversations.items.create(conv.id, items=[
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "message", "role": "assistant", "content": "a"}])
    assert [i.type for i in more.data] == ["function_call", "function_call_output", "message"]
    # newest first by default, as OpenAI lists them; pages by `after`
    page = client.conversations.items.list(conv.id, limit=3)
    assert [i.type for i in page.data] == ["message", "function_call_output", "function_call"]
    assert page.has_more
    every = list(client.conversations.items.list(conv.id, limit=2, order="asc"))
    assert len(every) == 8  # the client followed the pages
    assert [t for _, t in _texts(every)] == ["q0", "q1", "q2", "q3", "q4", "a"]
    one = client.conversations.items.retrieve(added.data[2].id, conversation_id=conv.id)
    assert one.id == added.data[2].id and _texts([one]) == [("user", "q2")]
    after = client.conversations.items.delete(added.data[2].id, conversation_id=conv.id)
    assert after.id == conv.id and after.object == "conversation"
    left = list(client.conversations.items.list(conv.id, order="asc"))
    assert [t for _, t in _texts(left)] == ["q0", "q1", "q3", "q4", "a"]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(added.data[2].id, conversation_id=conv.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.delete(added.data[2].id, conversation_id=conv.id)


def test_responses_continue_and_extend_a_conversation(gateway: Gateway) -> None:
    client, _, _, up = gateway
    conv = client.conversations.create(
        items=[{"type": "message", "role": "developer", "content": "Answer briefly."}])
    r1 = client.responses.create(model="remote", input="first question",
                                 conversation=conv.id, max_output_tokens=2)
    assert r1.conversation is not None and r1.conversation.id == conv.id
    r2 = client.responses.create(model="remote", input="second question",
                                 conversation={"id": conv.id}, max_output_tokens=2)
    sent = _sent(up)["messages"]  # the conversation so far, then the new input
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[1]["content"] == "first question" and sent[2]["content"] == r1.output_text
    assert sent[3]["content"] == "second question"
    items = list(client.conversations.items.list(conv.id, order="asc"))
    assert _texts(items) == [("developer", "Answer briefly."), ("user", "first question"),
                             ("assistant", r1.output_text), ("user", "second question"),
                             ("assistant", r2.output_text)]
    assert items[2].id == r1.output[0].id  # the output items, as the response gave them
    # streamed: its items are in the conversation when its last event arrives
    events = list(client.responses.create(model="remote", input="third", stream=True,
                                          conversation=conv.id, max_output_tokens=2))
    assert events[-1].type == "response.incomplete"  # at its token limit: it ran
    final = events[-1].response
    assert final.conversation is not None and final.conversation.id == conv.id
    last = client.conversations.items.list(conv.id, limit=2)
    assert _texts(last.data) == [("assistant", final.output_text), ("user", "third")]


def test_a_failed_response_adds_nothing(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    conv = client.conversations.create()
    with pytest.raises(openai.BadRequestError):  # refused: never ran
        client.responses.create(model="remote", input="x", conversation=conv.id,
                                tools=[{"type": "web_search"}])
    assert list(client.conversations.items.list(conv.id)) == []


def test_function_calls_through_a_conversation(gateway: Gateway) -> None:
    client, _, _, up = gateway
    weather = {"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    conv = client.conversations.create()
    r1 = client.responses.create(model="remote", input="Weather in Paris?", tools=[weather],
                                 tool_choice="required", conversation=conv.id)
    call = next(o for o in r1.output if o.type == "function_call")
    client.responses.create(model="remote", conversation=conv.id, tools=[weather], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    sent = _sent(up)["messages"]
    assert sent[-2]["role"] == "assistant" and sent[-2]["tool_calls"][0]["id"] == call.call_id
    assert sent[-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
    kinds = [i.type for i in client.conversations.items.list(conv.id, order="asc")]
    assert kinds[:3] == ["message", "function_call", "function_call_output"]


def test_another_tenant_sees_none_of_it(gateway: Gateway) -> None:
    client, other, _, _ = gateway
    conv = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "secret"}])
    item = client.conversations.items.list(conv.id).data[0]
    calls = [
        lambda: other.conversations.retrieve(conv.id),
        lambda: other.conversations.update(conv.id, metadata={"a": "b"}),
        lambda: other.conversations.items.list(conv.id),
        lambda: other.conversations.items.create(
            conv.id, items=[{"type": "message", "role": "user", "content": "x"}]),
        lambda: other.conversations.items.retrieve(item.id, conversation_id=conv.id),
        lambda: other.conversations.items.delete(item.id, conversation_id=conv.id),
        lambda: other.conversations.delete(conv.id),
        lambda: other.responses.create(model="remote", input="x", conversation=conv.id),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            call()
    # untouched by any of it
    assert client.conversations.retrieve(conv.id).metadata == {}
    assert _texts(list(client.conversations.items.list(conv.id))) == [("user", "secret")]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/conversations", {"items": [{"type": "message", "role": "user", "content": "x"}] * 21},
     "items"),
    ("/v1/conversations", {"items": [{"type": "computer_call"}]}, "items[0].type"),
    ("/v1/conversations", {"items": [7]}, "items[0]"),
    ("/v1/conversations", {"metadata": {"k": 5}}, "metadata.k"),
    ("/v1/conversations", {"color": "red"}, "color"),
    ("/v1/conversations/{id}/items", {"items": []}, "items"),
    ("/v1/conversations/{id}/items", {"items": [{"role": "robot", "content": "x"}]},
     "items[0].role"),
    ("/v1/conversations/{id}/items", {"items": [{"id": 5, "role": "user", "content": "x"}]},
     "items[0].id"),
    ("/v1/conversations/{id}", {}, "metadata"),
    ("/v1/responses", {"model": "remote", "input": "x", "conversation": "{id}",
                       "previous_response_id": "resp_1"}, "conversation"),
    ("/v1/responses", {"model": "remote", "input": "x", "conversation": {"name": "x"}},
     "conversation.name"),
    ("/v1/responses", {"model": "remote", "input": "x", "conversation": 5}, "conversation"),
])
def test_bad_requests_name_their_param(gateway: Gateway, path: str, body: dict[str, Any],
                                       param: str) -> None:
    client, _, url, _ = gateway
    conv = client.conversations.create()
    raw = httpx.post(url + path.replace("{id}", conv.id), headers={"Authorization": "Bearer key-a"},
                     content=httpx.Request("POST", "/", json=body).content.replace(
                         b"{id}", conv.id.encode()))
    assert raw.status_code == 400, raw.text
    error = raw.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_unknown_conversations_and_items_are_404s(gateway: Gateway) -> None:
    client, _, url, _ = gateway
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="remote", input="x", conversation="conv_nope")
    assert e.value.body["param"] == "conversation"  # type: ignore[index]
    conv = client.conversations.create(
        items=[{"id": "msg_mine", "type": "message", "role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as bad:  # an id already there
        client.conversations.items.create(
            conv.id, items=[{"id": "msg_mine", "type": "message", "role": "user",
                             "content": "y"}])
    assert bad.value.body["param"] == "items[0].id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):  # paging after an item it does not hold
        client.conversations.items.list(conv.id, after="msg_other")
    r = httpx.get(f"{url}/v1/conversations/{conv.id}/items?include=bogus",
                  headers={"Authorization": "Bearer key-a"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "include[0]"
