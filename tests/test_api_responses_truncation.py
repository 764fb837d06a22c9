"""`truncation: "auto"` on a small-context model (a fake engine of 64 words): the
oldest items of a chain are dropped until it fits, system and developer messages and
the instructions stay, a function call goes with its output; `disabled` keeps the 400."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from gateway_support import Live

from redline.api.app import create_app
from redline.api.responses_truncation import cuts
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig
from redline.types import Chunk, GenerationRequest


class Recording(FakeBackend):
    """The fake engine, keeping the last request it was asked."""

    last: GenerationRequest | None = None

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.last = request
        async for chunk in super().stream(request):
            yield chunk


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, Recording]]:
    engine = Recording("small", context_length=64)
    cfg = RedlineConfig(models=[{"name": "small", "bundled": "x", "n_ctx": 64}],
                        cache={"enabled": False},
                        server={"data_dir": str(tmp_path_factory.mktemp("trunc"))})
    with Live(create_app(cfg, backends={"small": engine})) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="key-a", max_retries=0)
        yield client, engine
        client.close()


def _words(n: int, w: str) -> str:
    return " ".join([w] * n)


def test_auto_drops_the_oldest_turns_and_keeps_the_system(
        small: tuple[openai.OpenAI, Recording]) -> None:
    client, engine = small
    first = client.responses.create(model="small", max_output_tokens=2, input=[
        {"role": "developer", "content": "RULES"},
        {"role": "user", "content": _words(20, "one")}])
    second = client.responses.create(model="small", input=_words(20, "two"),
                                     max_output_tokens=2, previous_response_id=first.id)
    with pytest.raises(openai.BadRequestError) as err:  # 1 + 20 + 2 + 20 + 2 + 20 + 2 > 64
        client.responses.create(model="small", input=_words(20, "three"), max_output_tokens=2,
                                previous_response_id=second.id)
    assert err.value.code == "context_length_exceeded"
    third = client.responses.create(model="small", input=_words(20, "three"),
                                    max_output_tokens=2, previous_response_id=second.id,
                                    truncation="auto", instructions="Be brief.")
    assert third.status == "incomplete" and third.truncation == "auto"
    assert engine.last is not None and engine.last.messages is not None
    sent = [(m.role, m.content.split()[0]) for m in engine.last.messages]
    # the instructions, the developer message, then the newest turns that fit
    assert sent == [("system", "Be"), ("system", "RULES"), ("assistant", "lorem"),
                    ("user", "two"), ("assistant", "lorem"), ("user", "three")]
    # the stored chain is whole: input_items are this turn's, the next turn fits again
    assert [i.type for i in client.responses.input_items.list(third.id).data] == ["message"]
    fourth = client.responses.create(model="small", input="four", max_output_tokens=2,
                                     previous_response_id=third.id, truncation="auto")
    assert fourth.status == "incomplete"


def test_a_newest_turn_past_the_context_alone_is_still_a_400(
        small: tuple[openai.OpenAI, Recording]) -> None:
    client, _ = small
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="small", input=_words(80, "big"), max_output_tokens=2,
                                truncation="auto")
    assert err.value.code == "context_length_exceeded"


def test_a_cut_never_orphans_a_function_call_output() -> None:
    chain = [{"type": "message", "role": "user", "content": []},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "1"},
             {"type": "function_call_output", "call_id": "c2", "output": "2"},
             {"type": "message", "role": "system", "content": []},
             {"type": "message", "role": "user", "content": []}]
    got = [[item.get("call_id") or item["role"] for item in cut] for cut in cuts(chain)]
    assert got == [["c1", "c2", "c1", "c2", "system", "user"],  # the user message went
                   ["system", "user"]]  # the calls go with their outputs, the system stays
