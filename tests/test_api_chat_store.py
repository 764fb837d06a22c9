"""Stored chat completions (`store: true`) with the official `openai` client: kept once
answered, whole or streamed, with the request's messages and metadata; listed (filtered by
model and metadata, paged), retrieved, updated, deleted; another tenant sees none of it;
what cannot be stored is a 400 naming its param."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from responses_support import Gateway, responses_gateway  # noqa: F401  (the fixture)


def _metadata(obj: Any) -> Any:
    """A stored completion's metadata (declared by newer clients, an extra field before)."""
    return getattr(obj, "metadata", None) or (obj.model_extra or {}).get("metadata")


ASK = [{"role": "system", "content": "Be brief."},
       {"role": "user", "content": [{"type": "text", "text": "What is the weather?"}]}]


def test_a_stored_completion_is_read_back_listed_updated_and_deleted(gateway: Gateway) -> None:
    client, _, _, up = gateway
    r = client.chat.completions.create(model="remote", messages=ASK, max_tokens=4, store=True,  # type: ignore[arg-type]
                                       metadata={"topic": "weather", "run": "1"})
    sent = httpx.get(f"{up}/last").json()
    assert "store" not in sent and "metadata" not in sent  # redline keeps it, not the engine
    got = client.chat.completions.retrieve(r.id)
    assert got.id == r.id and got.choices[0].message.content == r.choices[0].message.content
    assert got.usage == r.usage and got.model == r.model
    assert _metadata(got) == {"topic": "weather", "run": "1"}
    messages = client.chat.completions.messages.list(r.id)
    assert [m.role for m in messages.data] == ["system", "user"]  # type: ignore[attr-defined]
    assert messages.data[1].content == "What is the weather?"
    assert messages.data[1].content_parts is not None
    assert messages.data[0].id == f"{r.id}-0"
    other = client.chat.completions.create(model="remote", messages=ASK, max_tokens=2,  # type: ignore[arg-type]
                                           store=True, metadata={"topic": "other"})
    plain = client.chat.completions.create(model="remote", messages=ASK, max_tokens=2)  # type: ignore[arg-type]
    listed = [c.id for c in client.chat.completions.list()]
    assert r.id in listed and other.id in listed and plain.id not in listed
    assert listed.index(r.id) < listed.index(other.id)  # oldest first by default
    assert [c.id for c in client.chat.completions.list(metadata={"topic": "weather"})] == [r.id]
    assert [c.id for c in client.chat.completions.list(model="nothing")] == []
    page = client.chat.completions.list(limit=1)
    assert len(page.data) == 1 and page.has_more
    updated = client.chat.completions.update(r.id, metadata={"topic": "done"})
    assert _metadata(updated) == {"topic": "done"}
    assert [c.id for c in client.chat.completions.list(metadata={"topic": "done"})] == [r.id]
    deleted = client.chat.completions.delete(r.id)
    assert deleted.deleted and deleted.id == r.id
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(r.id)
    assert r.id not in [c.id for c in client.chat.completions.list()]


def test_a_streamed_completion_is_stored_whole(gateway: Gateway) -> None:
    client, _, _, _ = gateway
    text, cid = "", None
    for chunk in client.chat.completions.create(model="remote", messages=ASK, max_tokens=6,  # type: ignore[arg-type]
                                                store=True, stream=True):
        cid = chunk.id
        text += "".join(c.delta.content or "" for c in chunk.choices)
    assert cid is not None and text
    got = client.chat.completions.retrieve(cid)
    assert got.choices[0].message.content == text
    assert got.choices[0].finish_reason in ("stop", "length")


def test_another_tenant_sees_none_of_it(gateway: Gateway) -> None:
    client, other, _, _ = gateway
    r = client.chat.completions.create(model="remote", messages=ASK, max_tokens=2, store=True)  # type: ignore[arg-type]
    for call in (lambda: other.chat.completions.retrieve(r.id),
                 lambda: other.chat.completions.update(r.id, metadata={"a": "b"}),
                 lambda: other.chat.completions.messages.list(r.id),
                 lambda: other.chat.completions.delete(r.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert r.id not in [c.id for c in other.chat.completions.list()]
    assert client.chat.completions.retrieve(r.id).id == r.id  # untouched


@pytest.mark.parametrize(("extra", "param"), [
    ({"metadata": {"a": "b"}}, "metadata"),  # as OpenAI: only with store
    ({"store": True, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"store": True, "background": True}, "store"),  # a job is not stored
])
def test_what_cannot_be_stored_is_a_400(gateway: Gateway, extra: dict[str, Any],
                                        param: str) -> None:
    client, _, _, _ = gateway
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="remote", messages=ASK, max_tokens=2,  # type: ignore[arg-type]
                                       extra_body=extra)
    assert err.value.body["param"] == param  # type: ignore[index]


def test_a_message_field_past_64_bits_is_stored_exactly(gateway: Gateway) -> None:
    """The fuzz test found it: a message's own field holding an integer past 64 bits was
    a 500 (and left its request counted in flight); it is kept as sent."""
    client, _, _, _ = gateway
    big = 2 ** 70
    r = client.chat.completions.create(
        model="remote", max_tokens=2, store=True,
        messages=[{"role": "user", "content": "hi", "x_seq": big}])  # type: ignore[misc]
    got = client.chat.completions.messages.list(r.id).data[0]
    assert (got.model_extra or {}).get("x_seq") == big
