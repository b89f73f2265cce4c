"""The expand tools used by real agents: a LangGraph agent (``create_agent`` with the
compaction middleware) whose model, the local scripted server, reads a handle from the
compaction message it was sent and calls ``expand``; the SDK helper and LlamaIndex tools."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from agentcompact import Budget, StrategySettings
from agentcompact._archive import ArchivedItem, MemoryArchive, handle_of
from agentcompact.integrations.expand_tools import ExpandTools

ORIGINAL = "def total(order):\n" + "".join(f"    line_{i} = {i}\n" for i in range(400))


def test_sdk_helper_schemas_and_calls() -> None:
    archive = MemoryArchive()
    handle = handle_of(ORIGINAL)
    archive.put_many([ArchivedItem(handle, ORIGINAL, f"[turn 2 · expand {handle}]")])
    tools = ExpandTools(archive, page_chars=1_000)
    assert [t["function"]["name"] for t in tools.openai_chat()] == ["expand", "search_dropped"]
    assert [t["name"] for t in tools.anthropic()] == ["expand", "search_dropped"]
    assert all(t["type"] == "function" and "parameters" in t for t in tools.openai_responses())
    pages, offset = [], 0
    while True:
        text = tools.call("expand", json.dumps({"handle": handle, "offset": offset}))
        header, _, body = text.partition("\n")
        pages.append(body)
        m = re.search(r"offset=(\d+)\)", header)
        if m is None:
            break
        offset = int(m.group(1))
    assert "".join(pages) == ORIGINAL
    assert handle in tools.call("search_dropped", {"query": "LINE_399 = 399"})
    assert tools.call("expand", "{not json") == \
        "[agentcompact expand: the arguments are not a JSON object]"
    assert tools.call("expand", {"handle": 3}).startswith("[agentcompact expand: needs")
    assert tools.call("other", {}).startswith("[agentcompact: no tool named 'other'")


def test_llamaindex_function_tools() -> None:
    pytest.importorskip("llama_index.core")
    from agentcompact.integrations.expand_tools import llamaindex_tools

    archive = MemoryArchive()
    archive.put_many([ArchivedItem(handle_of(ORIGINAL), ORIGINAL)])
    expand, search = llamaindex_tools(archive, page_chars=100_000)
    assert expand.metadata.name == "expand" and search.metadata.name == "search_dropped"
    out = expand.call(handle=handle_of(ORIGINAL))
    assert out.content.partition("\n")[2] == ORIGINAL


# ------------------------------------------------------------------ a real LangGraph agent
langchain_core = pytest.importorskip("langchain_core")
from langchain_core.messages import HumanMessage, ToolMessage  # noqa: E402  # after the skip
from langchain_core.tools import tool  # noqa: E402

from agentcompact.testing import (  # noqa: E402
    Reply,
    RunningServer,
    Script,
    ToolCall,
    UpstreamSim,
    filler_text,
    serve,
)

_HANDLE = re.compile(r"ac-[0-9a-f]{12}")


@tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"contents of {path}\n" + "\n".join(filler_text(40) for _ in range(12))


def expand_first_handle(body: dict[str, Any]) -> Reply:
    """The model's turn after a compaction: call expand on a handle it was shown."""
    for message in body["messages"]:
        content = message.get("content")
        found = _HANDLE.search(content) if isinstance(content, str) else None
        if found and content.startswith("[agentcompact: earlier turns compacted]"):
            return Reply.calling(ToolCall("expand", {"handle": found.group(0)}))
    return Reply("no compaction message with a handle was sent")


@pytest.fixture
def server() -> Iterator[RunningServer]:
    reads = [Reply.tool("read_file", {"path": f"src/m{i}.py"}) for i in range(8)]
    sim = UpstreamSim(Script(*reads, expand_first_handle, Reply("done")))
    with serve(sim) as running:
        yield running


@pytest.mark.network
def test_langgraph_agent_expands_a_dropped_result(server: RunningServer) -> None:
    pytest.importorskip("langgraph")
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver

    from agentcompact import new_plugin_manager
    from agentcompact.integrations.expand_tools import langchain_tools
    from agentcompact.integrations.langgraph import CompactionMiddleware

    archive = MemoryArchive()
    middleware = CompactionMiddleware(budget=Budget(trigger_tokens=2_500, target_tokens=1_200),
                                      plugins=new_plugin_manager(),
                                      strategy=StrategySettings("cliff",
                                                                options={"archive": archive}))
    model = ChatOpenAI(model="gpt-sim", base_url=server.base_url + "/v1", api_key="x",
                       max_retries=0)
    agent = create_agent(model, [read_file, *langchain_tools(archive)],
                         middleware=[middleware], checkpointer=InMemorySaver())
    state = agent.invoke({"messages": [HumanMessage("Read the modules.")]},
                         {"configurable": {"thread_id": "expand"}})
    tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    expanded = [m for m in tool_messages if m.name == "expand"]
    assert len(expanded) == 1, [m.content[:80] for m in tool_messages]
    header, _, body = str(expanded[0].content).partition("\n")
    assert header.startswith("[agentcompact expand ac-")
    reads = [str(m.content) for m in tool_messages if m.name == "read_file"]
    assert body in reads  # the original tool output, verbatim
    assert state["messages"][-1].content == "done"
