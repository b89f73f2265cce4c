"""PydanticAI's real ``Agent`` with the :class:`Compaction` capability, against the
simulator's chat-completions endpoint: a 30-step tool loop where every request is within
the trigger (instructions and tool schemas counted), every tool call keeps its return, and
the messages sent only grow between compactions (the prefix is byte-identical)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from openai import AsyncOpenAI  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.capabilities import ProcessHistory  # noqa: E402
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

from agentcompact import Budget, ConfigError, Engine, validate  # noqa: E402
from agentcompact.integrations.pydantic_ai import Compaction, PydanticAIDialect  # noqa: E402
from agentcompact.testing import RunningServer, Script, UpstreamSim, serve  # noqa: E402

from .conftest import sent_tokens  # noqa: E402
from .hosts_loop import DONE, check_requests, prefix_changes, step_output, tool_loop  # noqa: E402

pytestmark = pytest.mark.network

TRIGGER = 3000
STEPS = 30
INSTRUCTIONS = "You are a careful engineer. " * 150


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serve(UpstreamSim(Script(then=tool_loop(STEPS)))) as running:
        yield running


@pytest.fixture
async def client(server: RunningServer) -> Any:
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="sk-test",
                           max_retries=0) as opened:
        yield opened


def _agent(client: AsyncOpenAI, **kwargs: Any) -> Agent[None, str]:
    model = OpenAIChatModel("sim-model", provider=OpenAIProvider(openai_client=client))
    agent: Agent[None, str] = Agent(model, instructions=INSTRUCTIONS, **kwargs)

    @agent.tool_plain
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        return step_output(path, 700)

    return agent


def _bodies(server: RunningServer) -> list[dict[str, Any]]:
    return [r.body for r in server.requests if r.path == "/v1/chat/completions"]


async def test_tool_loop_stays_within_trigger_and_cache_stable(server: RunningServer,
                                                               client: AsyncOpenAI) -> None:
    compaction = Compaction(budget=Budget(trigger_tokens=TRIGGER))
    result = await _agent(client, capabilities=[compaction]).run("Read every step file.")
    assert result.output == DONE
    bodies = _bodies(server)
    assert len(bodies) == STEPS + 1
    assert max(sent_tokens(b) for b in bodies) <= TRIGGER
    check_requests(bodies, "openai_chat")
    compactions = sum(1 for b in bodies if "[agentcompact" in str(b["messages"]))
    assert compactions > 0
    assert prefix_changes(bodies) <= compactions
    # the run's own history keeps everything
    history = result.all_messages()
    assert all(not PydanticAIDialect().is_synthetic(m) for m in history)
    assert sum(isinstance(m, ModelResponse) for m in history) == STEPS + 1
    validate(history, PydanticAIDialect())


async def test_streamed_run(server: RunningServer, client: AsyncOpenAI) -> None:
    agent = _agent(client, capabilities=[Compaction(budget=Budget(trigger_tokens=TRIGGER))])
    async with agent.run_stream("Read every step file.") as streamed:
        output = await streamed.get_output()
    assert output == DONE
    assert max(sent_tokens(b) for b in _bodies(server)) <= TRIGGER


async def test_history_processor_form(server: RunningServer, client: AsyncOpenAI) -> None:
    compaction = Compaction(budget=Budget(trigger_tokens=TRIGGER))
    agent = _agent(client, capabilities=[ProcessHistory(compaction)])
    result = await agent.run("Read every step file.")
    assert result.output == DONE
    # messages and instructions are counted; the one small tool schema is not
    assert max(sent_tokens(b) for b in _bodies(server)) <= TRIGGER + 100


def test_dialect_reads_tool_pairs() -> None:
    d = PydanticAIDialect()
    call = ModelResponse(parts=[TextPart("looking"), ToolCallPart("read_file", {"path": "a"},
                                                                  tool_call_id="c1")])
    assert d.role(call) == "assistant" and d.tool_call_ids(call) == ("c1",)
    assert [p.kind for p in d.parts(call)] == ["text", "tool_call"]
    synthetic = d.text_message("[agentcompact: earlier turns compacted]")
    assert isinstance(synthetic, ModelRequest) and d.is_synthetic(synthetic)
    assert d.digest(synthetic) == d.digest(d.text_message(
        "[agentcompact: earlier turns compacted]"))


def test_options_are_checked_when_built() -> None:
    with pytest.raises(ConfigError, match="trigger_tokens"):
        Compaction()
    with pytest.raises(ConfigError, match="PydanticAIDialect"):
        Compaction(Engine(dialect="openai_chat", budget=Budget(trigger_tokens=1000)))
