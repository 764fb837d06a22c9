"""OpenAI's Agents SDK (`openai-agents`), unmodified, against redline's Responses API: an
agent with a function tool runs its loop (a call, the tool's output, the answer) through
redline in front of the fake upstream. The SDK sends `include` and `tools` on every call,
which redline once refused."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from agents import (
    Agent,
    OpenAIConversationsSession,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from responses_support import Gateway, responses_gateway  # noqa: F401  (the fixture)


@pytest.fixture(autouse=True)
def _no_tracing() -> None:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers


async def test_an_agent_calls_its_tool_and_answers(gateway: Gateway) -> None:
    _, _, url, _ = gateway
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return "sunny, 21C"

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="key-a", max_retries=0)
    agent: Agent[Any] = Agent(name="weather", instructions="You call tools.",
                              tools=[get_weather],
                              model=OpenAIResponsesModel("remote", client))
    result = await Runner.run(agent, "What is the weather in Paris?")
    await client.close()
    assert len(asked) == 1  # the fake upstream fills string arguments with "tok"
    assert result.final_output == "result: sunny, 21C."
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]



def _weather_agent(client: openai.AsyncOpenAI) -> Agent[Any]:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny, 21C"

    # the fake upstream calls a listed tool, then answers from its output ("result: ...")
    return Agent(name="weather", instructions="You call tools.", tools=[get_weather],
                 model=OpenAIResponsesModel("remote", client))


def _turn(sent: list[dict[str, Any]]) -> list[str]:
    return [m["role"] + (":call" if m.get("tool_calls") else "") for m in sent]


async def test_an_agent_keeps_its_memory_in_a_conversation(gateway: Gateway) -> None:
    """The SDK's OpenAIConversationsSession: the agent's history lives in a redline
    conversation (/v1/conversations), read before each run and added to after it."""
    _, _, url, up = gateway
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="key-a", max_retries=0)
    agent = _weather_agent(client)
    session = OpenAIConversationsSession(openai_client=client)
    first = await Runner.run(agent, "Weather in Paris?", session=session)
    items = await session.get_items()
    assert [i.get("type", "message") for i in items] == [
        "message", "function_call", "function_call_output", "message"]
    await Runner.run(agent, "And in Rome?", session=session)
    sent = httpx.get(f"{up}/last").json()["messages"]  # the second run's last call
    assert _turn(sent) == ["system", "user", "assistant:call", "tool", "assistant", "user",
                           "assistant:call", "tool"]
    assert sent[1]["content"] == "Weather in Paris?" and sent[5]["content"] == "And in Rome?"
    assert sent[4]["content"] == first.final_output
    assert len(await session.get_items()) == 8
    conversation = await session._get_session_id()
    popped = await session.pop_item()
    assert popped is not None and popped["role"] == "assistant"
    assert len(await session.get_items()) == 7
    await session.clear_session()
    with pytest.raises(openai.NotFoundError):
        await client.conversations.retrieve(conversation)
    await client.close()


async def test_an_agent_runs_in_a_server_side_conversation(gateway: Gateway) -> None:
    """`Runner.run(..., conversation_id=...)`: the SDK sends only the new input and
    `conversation`; redline supplies the history and keeps each turn."""
    _, _, url, up = gateway
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="key-a", max_retries=0)
    agent = _weather_agent(client)
    conversation = await client.conversations.create()
    first = await Runner.run(agent, "Weather in Paris?", conversation_id=conversation.id)
    await Runner.run(agent, "And in Rome?", conversation_id=conversation.id)
    sent = httpx.get(f"{up}/last").json()["messages"]
    assert _turn(sent) == ["system", "user", "assistant:call", "tool", "assistant", "user",
                           "assistant:call", "tool"]
    assert sent[4]["content"] == first.final_output
    items = [i async for i in client.conversations.items.list(conversation.id, order="asc")]
    assert [i.type for i in items] == ["message", "function_call", "function_call_output",
                                       "message"] * 2
    await client.close()
