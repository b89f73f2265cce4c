"""The OpenAI Agents SDK's real ``Runner`` with :class:`CompactionFilter` as its
``call_model_input_filter``, against the simulator's Responses and chat-completions
endpoints: a 30-step tool loop (run and streamed), and a handoff to a second agent with
its own instructions and tools. Every request is within the trigger and valid."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import (  # noqa: E402
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI  # noqa: E402

from agentcompact import Budget, ConfigError, Engine  # noqa: E402
from agentcompact.integrations.openai_agents import CompactionFilter  # noqa: E402
from agentcompact.testing import Reply, RunningServer, Script, ToolCall, UpstreamSim, serve  # noqa: E402

from .conftest import sent_tokens  # noqa: E402
from .hosts_loop import DONE, check_requests, prefix_changes, step_output, tool_loop  # noqa: E402

pytestmark = pytest.mark.network

TRIGGER = 3000
STEPS = 30
INSTRUCTIONS = "You are a careful engineer. " * 150
set_tracing_disabled(True)


@function_tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return step_output(path, 700)


def _responder(body: dict[str, Any]) -> Reply | str:
    names = str(body.get("tools"))
    if "transfer_to_worker" in names:
        return Reply.calling(ToolCall("transfer_to_worker", {}))
    return tool_loop(STEPS)(body)


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serve(UpstreamSim(Script(then=_responder))) as running:
        yield running


@pytest.fixture
async def client(server: RunningServer) -> Any:
    async with AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="sk-test",
                           max_retries=0) as opened:
        yield opened


def _model(client: AsyncOpenAI, kind: str) -> Any:
    if kind == "responses":
        return OpenAIResponsesModel(model="sim-model", openai_client=client)
    return OpenAIChatCompletionsModel(model="sim-model", openai_client=client)


_PATH = {"responses": ("/v1/responses", "openai_responses", "input"),
         "chat": ("/v1/chat/completions", "openai_chat", "messages")}


def _check(server: RunningServer, kind: str, calls: int) -> list[dict[str, Any]]:
    path, dialect, key = _PATH[kind]
    bodies = [r.body for r in server.requests if r.path == path]
    assert len(bodies) == calls
    assert max(sent_tokens(b, dialect) for b in bodies) <= TRIGGER
    check_requests(bodies, dialect)
    compactions = sum(1 for b in bodies if "[agentcompact" in str(b[key]))
    assert compactions > 0
    return bodies


@pytest.mark.parametrize("kind", ["responses", "chat"])
async def test_tool_loop_stays_within_trigger(server: RunningServer, client: AsyncOpenAI,
                                              kind: str, pm: Any, collector: Any) -> None:
    compaction = CompactionFilter(budget=Budget(trigger_tokens=TRIGGER), plugins=pm)
    agent = Agent(name="engineer", instructions=INSTRUCTIONS, tools=[read_file],
                  model=_model(client, kind))
    result = await Runner.run(
        agent, "Read every step file.", max_turns=STEPS + 5, hooks=compaction.hooks,
        run_config=RunConfig(call_model_input_filter=compaction))
    assert result.final_output == DONE
    bodies = _check(server, kind, STEPS + 1)
    if kind == "responses":  # the compacted prefix is byte-stable between compactions
        assert prefix_changes(bodies, "input") <= sum(
            1 for b in bodies if "[agentcompact" in str(b["input"]))
    assert len(collector.calls) == STEPS + 1
    assert any(c.compacted for c in collector.calls)


async def test_streamed_run(server: RunningServer, client: AsyncOpenAI) -> None:
    compaction = CompactionFilter(budget=Budget(trigger_tokens=TRIGGER))
    agent = Agent(name="engineer", instructions=INSTRUCTIONS, tools=[read_file],
                  model=_model(client, "responses"))
    streamed = Runner.run_streamed(agent, "Read every step file.", max_turns=STEPS + 5,
                                   run_config=RunConfig(call_model_input_filter=compaction))
    async for _ in streamed.stream_events():
        pass
    assert streamed.final_output == DONE
    _check(server, "responses", STEPS + 1)


async def test_handoff_counts_the_new_agents_instructions_and_tools(
        server: RunningServer, client: AsyncOpenAI) -> None:
    compaction = CompactionFilter(budget=Budget(trigger_tokens=TRIGGER))
    model = _model(client, "responses")
    worker = Agent(name="worker", instructions=INSTRUCTIONS, tools=[read_file], model=model)
    triage = Agent(name="triage", instructions="Hand the task to the worker.",
                   handoffs=[worker], model=model)
    result = await Runner.run(triage, "Read every step file.", max_turns=STEPS + 5,
                              run_config=RunConfig(call_model_input_filter=compaction))
    assert result.final_output == DONE
    assert result.last_agent.name == "worker"
    _check(server, "responses", STEPS + 2)


def test_options_are_checked_when_built() -> None:
    with pytest.raises(ConfigError, match="trigger_tokens"):
        CompactionFilter()
    with pytest.raises(ConfigError, match="openai_responses"):
        CompactionFilter(Engine(dialect="openai_chat", budget=Budget(trigger_tokens=1000)))
