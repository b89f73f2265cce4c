"""The LlamaIndex integration driven for real: a FunctionAgent with tools, talking through
OpenAILike to the upstream simulator, remembering through CompactingMemory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, TextBlock, ToolCallBlock
from llama_index.llms.openai_like import OpenAILike

from agentcompact import Budget, Engine, validate
from agentcompact.dialects.openai_chat import OpenAIChatDialect
from agentcompact.integrations.llamaindex import (
    CompactingMemory,
    LlamaIndexDialect,
    ModelCallLogger,
    to_openai_chat,
)
from agentcompact.integrations.upstream_sim import (
    Reply,
    RunningServer,
    Script,
    ToolCall,
    UpstreamSim,
    filler_text,
    serve,
)
from agentcompact.markers import COMPACTION_HEADER, is_marked
from tests.integrations.conftest import Collector

pytestmark = [
    pytest.mark.network,
    # llama-index-workflows inspects agents with inspect.getmembers, touching pydantic's
    # deprecated ``__fields__`` and friends (third-party; harmless): only those raised from
    # within ``inspect`` are ignored
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning:inspect"),
]

TRIGGER = 2000
TASKS = 4
CHAT = OpenAIChatDialect()
LI = LlamaIndexDialect()


def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"contents of {path}\n" + filler_text(400)


def search(query: str) -> str:
    """Search the repository."""
    return f"results for {query}\n" + filler_text(250)


def task_steps(task: int) -> list[Reply]:
    return [
        Reply.tool("read_file", {"path": f"src/a{task}.py"}),
        Reply.calling(ToolCall("read_file", {"path": f"src/b{task}.py"}),
                      ToolCall("search", {"query": f"needle {task}"})),
        Reply(f"task {task} done"),
    ]


@pytest.fixture
def server() -> Iterator[RunningServer]:
    steps = [s for t in range(1, TASKS + 1) for s in task_steps(t)]
    with serve(UpstreamSim(Script(*steps))) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:  # closed here: OpenAILike never closes its own
        yield client


def make_agent(server: RunningServer, http: httpx.AsyncClient,
               streaming: bool = True) -> FunctionAgent:
    llm = OpenAILike(model="gpt-sim", api_base=server.base_url + "/v1", api_key="x",
                     is_function_calling_model=True, is_chat_model=True, max_retries=0,
                     context_window=128_000, async_http_client=http)
    return FunctionAgent(tools=[read_file, search], llm=llm, streaming=streaming,
                         system_prompt="You are a coder.", allow_parallel_tool_calls=True)


def sent_messages(server: RunningServer) -> list[list[dict[str, Any]]]:
    return [r.body["messages"] for r in server.requests if r.path == "/v1/chat/completions"]


def has_compaction(messages: list[dict[str, Any]]) -> bool:
    return any(COMPACTION_HEADER in str(m.get("content")) for m in messages)


# ------------------------------------------------------------------------- the dialect


def test_dialect_reads_chat_messages() -> None:
    call = ChatMessage(role="assistant", blocks=[
        TextBlock(text="looking"), ToolCallBlock(tool_call_id="c1", tool_name="read_file",
                                                 tool_kwargs={"path": "x"})])
    legacy = ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
    result = ChatMessage(role="tool", content="body", additional_kwargs={"tool_call_id": "c1"})
    assert LI.tool_call_ids(call) == ("c1",) and LI.tool_call_ids(legacy) == ("c2",)
    assert LI.tool_result_ids(result) == ("c1",) and LI.role(result) == "tool"
    assert [p.kind for p in LI.parts(call)] == ["text", "tool_call"]
    assert LI.digest(call) == LI.digest(call.model_copy(deep=True))
    long = ChatMessage(role="tool", content="y" * 5000, additional_kwargs={"tool_call_id": "c1"})
    short = LI.truncate(long, 300)
    assert short is not long and long.content == "y" * 5000 and len(short.content) < 400
    assert short.additional_kwargs["tool_call_id"] == "c1"
    assert to_openai_chat(call)["tool_calls"][0]["function"] == {
        "name": "read_file", "arguments": '{"path":"x"}'}


def test_memory_keeps_everything_and_compacts_the_view() -> None:
    memory = CompactingMemory(trigger_tokens=TRIGGER)
    memory.put(ChatMessage(role="user", content="task"))
    for i in range(10):
        memory.put_messages([
            ChatMessage(role="assistant", blocks=[ToolCallBlock(
                tool_call_id=f"c{i}", tool_name="read_file", tool_kwargs={"path": str(i)})]),
            ChatMessage(role="tool", content=filler_text(400),
                        additional_kwargs={"tool_call_id": f"c{i}"}),
        ])
    view = memory.get()
    assert len(memory.get_all()) == 21 and len(view) < 21
    assert view[0] is memory.history[0] and view[-1] is memory.history[-1]
    assert is_marked(view[1].content or "")
    validate(view, LI)
    assert [m is n for m, n in zip(memory.get(), view, strict=True)] == [True] * len(view)
    memory.reset()
    assert memory.get_all() == [] and memory.get() == []


# ------------------------------------------------------------------------- FunctionAgent


@pytest.mark.parametrize("streaming", [True, False])
async def test_function_agent_with_compacting_memory(
    server: RunningServer, http: httpx.AsyncClient, pm: Any, collector: Collector,
    streaming: bool,
) -> None:
    agent = make_agent(server, http, streaming)
    memory = CompactingMemory(trigger_tokens=TRIGGER, plugins=pm, episode_id="ep-li",
                              group_id="g-li")
    with memory.logger:
        for task in range(1, TASKS + 1):
            output = await agent.run(f"Task {task}: fix the bug.", memory=memory)
            assert str(output).endswith(f"task {task} done")
    # the memory holds the full history: every task, every tool result, verbatim
    history = memory.get_all()
    assert len(history) == TASKS * 7
    tools = [m for m in history if m.role.value == "tool"]
    assert len(tools) == TASKS * 3 and all(len(m.content or "") > 900 for m in tools)
    assert not any(is_marked(m.content or "") for m in history)
    validate(history, LI)
    # what the model received: valid, compacted, the system prompt first
    requests = sent_messages(server)
    assert len(requests) == TASKS * 3
    for messages in requests:
        validate(messages, CHAT)
        assert messages[0] == {"role": "system", "content": "You are a coder."}
    assert any(has_compaction(m) for m in requests[-3:])
    assert memory.last_result is not None and memory.last_result.modified
    # each model call was logged with the memory's ids
    assert len(collector.calls) == len(requests)
    for call, sent in zip(collector.calls, requests, strict=True):
        assert (call.episode_id, call.group_id) == ("ep-li", "g-li")
        assert len(call.messages) == len(sent)
        assert call.compacted == has_compaction(sent)
    assert collector.calls[-1].response[0]["content"] == f"task {TASKS} done"
    assert collector.calls[0].response[0]["tool_calls"][0]["function"]["name"] == "read_file"
    # the handler is gone after the block
    await agent.run("one more", memory=memory)
    assert len(collector.calls) == len(requests)


def test_engine_instance_and_errors() -> None:
    engine = Engine(dialect=LI, budget=Budget(trigger_tokens=TRIGGER))
    assert CompactingMemory(engine).engine is engine
    with pytest.raises(Exception, match="LlamaIndexDialect"):
        CompactingMemory(Engine(dialect="openai_chat", trigger_tokens=100))
    with pytest.raises(Exception, match="trigger_tokens"):
        CompactingMemory()
    logger = ModelCallLogger(episode_id="e")
    with logger:
        with logger:
            pass
    assert logger.episode_id == "e"
