"""OpenAI's Agents SDK (`openai-agents`), unmodified, against redline's Responses API: an
agent with a function tool runs its loop (a call, the tool's output, the answer) through
redline in front of the fake upstream. The SDK sends `include` and `tools` on every call,
which redline once refused."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
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
