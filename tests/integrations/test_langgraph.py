"""The LangGraph / LangChain integration driven for real: graphs, agents, a chat model
talking to the upstream simulator over a loopback socket."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentcompact import Budget, Engine, validate
from agentcompact._markers import COMPACTION_HEADER, is_marked
from agentcompact.dialects import OpenAIChatDialect
from agentcompact.errors import ConfigError, DialectError
from agentcompact.integrations.langgraph import (
    CompactionMiddleware,
    CompactionNode,
    LangChainDialect,
    ModelCallLogger,
    pre_model_hook,
)
from agentcompact.testing import (
    Reply,
    RunningServer,
    Script,
    ToolCall,
    UpstreamSim,
    filler_text,
    serve,
)
from tests.conftest import QWEN_TOKENIZER, needs_shared_data
from tests.integrations.conftest import Collector, largest_request

pytestmark = pytest.mark.network

TRIGGER = 2000
CHAT = OpenAIChatDialect()
LC = LangChainDialect()


@tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"contents of {path}\n" + filler_text(500)


@tool
def search(query: str) -> str:
    """Search the repository."""
    return f"results for {query}\n" + filler_text(300)


TOOLS = [read_file, search]


def task_steps(task: int) -> list[Reply]:
    """One task: four tool turns (one of them parallel), then a final answer."""
    return [
        Reply.tool("read_file", {"path": f"src/a{task}.py"}),
        Reply.calling(ToolCall("read_file", {"path": f"src/b{task}.py"}),
                      ToolCall("search", {"query": f"needle {task}"})),
        Reply.tool("search", {"query": f"haystack {task}"}, text="Searching again."),
        Reply.tool("read_file", {"path": f"src/c{task}.py"}),
        Reply(f"task {task} done"),
    ]


@pytest.fixture
def sim() -> UpstreamSim:
    return UpstreamSim(Script(*task_steps(1), *task_steps(2), *task_steps(3)))


@pytest.fixture
def server(sim: UpstreamSim) -> Iterator[RunningServer]:
    with serve(sim) as running:
        yield running


def chat_model(server: RunningServer, **extra: Any) -> ChatOpenAI:
    return ChatOpenAI(model="gpt-sim", base_url=server.base_url + "/v1", api_key="x",
                      max_retries=0, **extra)


def sent_messages(server: RunningServer) -> list[list[dict[str, Any]]]:
    return [r.body["messages"] for r in server.requests if r.path == "/v1/chat/completions"]


def has_compaction(messages: list[dict[str, Any]]) -> bool:
    return any(m["role"] == "user" and isinstance(m.get("content"), str)
               and is_marked(m["content"]) for m in messages)


def assert_model_inputs_sound(server: RunningServer, *, min_compacted: int = 1) -> None:
    """What the model received: valid, tool pairs whole, compacted, prefix-stable."""
    requests = sent_messages(server)
    assert requests
    for messages in requests:
        validate(messages, CHAT)
    compacted = [m for m in requests if has_compaction(m)]
    assert len(compacted) >= min_compacted
    cliffs = 0
    for previous, current in zip(requests, requests[1:], strict=False):
        if current[: len(previous)] != previous:
            cliffs += 1  # a new compaction (or a new compacted prefix) starts here
            assert has_compaction(current)
    assert 1 <= cliffs < len(requests) // 2


def full_history_ok(messages: list[AnyMessage], tasks: int) -> None:
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    assert len(tool_messages) == 5 * tasks
    assert all(len(m.content) > 1000 for m in tool_messages)
    assert not any(is_marked(m.text) for m in messages if isinstance(m, HumanMessage))
    validate(messages, LC)


# ------------------------------------------------------------------------- the dialect


def test_dialect_reads_langchain_messages() -> None:
    ai = AIMessage(content=[{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                            {"type": "text", "text": "let me look"}],
                   tool_calls=[{"name": "read_file", "args": {"path": "x"}, "id": "c1"}])
    result = ToolMessage(content="file body", tool_call_id="c1", name="read_file")
    assert (LC.role(ai), LC.role(result)) == ("assistant", "tool")
    assert LC.tool_call_ids(ai) == ("c1",) and LC.tool_result_ids(result) == ("c1",)
    assert [p.kind for p in LC.parts(ai)] == ["thinking", "text", "tool_call"]
    assert LC.parts(ai)[0].opaque
    assert LC.parts(result)[0].text == "file body"
    same = AIMessage(content=ai.content, tool_calls=ai.tool_calls, id="another-random-id")
    assert LC.digest(ai) == LC.digest(same)
    assert LC.digest(ai) != LC.digest(AIMessage(content="other", tool_calls=ai.tool_calls))


def test_dialect_truncate_copies_and_text_message_is_synthetic() -> None:
    original = ToolMessage(content="x" * 5000, tool_call_id="c1", id="keep-me")
    short = LC.truncate(original, 300)
    assert short is not original and original.content == "x" * 5000
    assert len(short.content) < 400 and short.tool_call_id == "c1" and short.id == "keep-me"
    assert LC.truncate(short, 10_000) is short
    message = LC.text_message(COMPACTION_HEADER + "\nbody")
    assert isinstance(message, HumanMessage) and LC.is_synthetic(message)
    assert message.id == LC.text_message(COMPACTION_HEADER + "\nbody").id


def test_a_message_with_an_unknown_content_block_is_sent_verbatim() -> None:
    """A content block the dialect does not read (a provider's server-tool result, a
    ``non_standard`` block) makes its message opaque: kept as it is, never rendered into
    compaction text, which dropped the block."""
    unknown = AIMessage(content=[{"type": "text", "text": "searched"},
                                 {"type": "non_standard", "value": {"kind": "citation"}}],
                        id="keep-me")
    known = AIMessage(content=[{"type": "reasoning", "reasoning": "hmm"},
                               {"type": "text", "text": "ok"}, "plain"])
    assert LC.is_opaque(unknown) and LC.is_kept(unknown)
    assert not LC.is_opaque(known) and not LC.is_opaque(AIMessage(content="text"))
    history: list[AnyMessage] = [SystemMessage("sys"), HumanMessage("task")]
    for i in range(12):
        history.append(AIMessage("", tool_calls=[{"name": "read_file", "args": {"path": str(i)},
                                                  "id": f"c{i}"}]))
        history.append(ToolMessage(filler_text(400), tool_call_id=f"c{i}"))
        if i == 2:
            history.append(unknown)
    engine = Engine("cliff", LC, Budget(trigger_tokens=1500))
    result = engine.compact(history)
    assert result.compacted and any(m is unknown for m in result.messages)
    validate(result.messages, LC, allow_pending=True)


def test_node_passes_kept_messages_by_reference() -> None:
    history: list[AnyMessage] = [SystemMessage("sys"), HumanMessage("task")]
    for i in range(12):
        history.append(AIMessage("", tool_calls=[{"name": "read_file", "args": {"path": str(i)},
                                                  "id": f"c{i}"}]))
        history.append(ToolMessage(filler_text(400), tool_call_id=f"c{i}"))
    node = CompactionNode(budget=Budget(trigger_tokens=TRIGGER))
    update = node({"messages": history})
    sent = update["llm_input_messages"]
    assert len(sent) < len(history) and node.last_result is not None
    assert node.last_result.compacted
    assert sent[0] is history[0] and sent[1] is history[1] and sent[-1] is history[-1]
    validate(sent, LC)
    again = node({"messages": history})["llm_input_messages"]
    # the same compacted prefix, the same objects
    assert all(a is b for a, b in zip(again, sent, strict=True))


# ------------------------------------------------------------------------- StateGraph


class State(MessagesState):
    llm_input_messages: list[AnyMessage]


def build_graph(server: RunningServer, node: CompactionNode, **model_extra: Any) -> Any:
    model = chat_model(server, **model_extra).bind_tools(TOOLS)

    def agent(state: State) -> dict[str, Any]:
        messages = state.get("llm_input_messages") or state["messages"]
        return {"messages": [model.invoke(messages)]}

    async def aagent(state: State) -> dict[str, Any]:
        messages = state.get("llm_input_messages") or state["messages"]
        return {"messages": [await model.ainvoke(messages)]}


    builder = StateGraph(State)
    builder.add_node("compact", node)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    builder.add_node("tools", ToolNode(TOOLS))
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "compact")
    return builder.compile(checkpointer=InMemorySaver())


def run_config(node: CompactionNode, thread: str = "t1") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "callbacks": [node.logger],
            "recursion_limit": 100}


def test_state_graph_node_compacts_what_the_model_sees(
    server: RunningServer, pm: Any, collector: Collector
) -> None:
    node = CompactionNode(budget=Budget(trigger_tokens=TRIGGER), plugins=pm, episode_id="ep-graph",
                          group_id="task-1")
    graph = build_graph(server, node)
    config = run_config(node)
    state = graph.invoke({"messages": [SystemMessage("You are a coder."),
                                       HumanMessage("Fix the bug.")]}, config)
    assert state["messages"][-1].content == "task 1 done"
    full_history_ok(state["messages"], 1)
    # checkpoint resume: the same thread continues with its full history
    state = graph.invoke({"messages": [HumanMessage("Now the next bug.")]}, config)
    assert state["messages"][-1].content == "task 2 done"
    full_history_ok(state["messages"], 2)
    assert state["messages"][1].content == "Fix the bug."
    assert_model_inputs_sound(server)
    last = sent_messages(server)[-1]
    assert last[0]["content"] == "You are a coder." and last[1]["content"] == "Fix the bug."
    # after the resume the model got the first task's context plus the new request
    resumed = sent_messages(server)[5]
    assert resumed[-1] == {"role": "user", "content": "Now the next bug."}
    assert resumed[:2] == last[:2]
    # every model call was logged, with the context the model actually received
    assert len(collector.calls) == len(sent_messages(server)) == 10
    assert {c.episode_id for c in collector.calls} == {"ep-graph"}
    assert {c.group_id for c in collector.calls} == {"task-1"}
    for call, sent in zip(collector.calls, sent_messages(server), strict=True):
        assert len(call.messages) == len(sent)
        assert call.compacted == has_compaction(sent)
        assert call.response and call.response[0]["role"] == "assistant"
        assert call.usage
    assert collector.events and all(e.episode_id == "ep-graph" for e in collector.events)


async def test_async_graph_streams_and_compacts(
    server: RunningServer, pm: Any, collector: Collector
) -> None:
    node = CompactionNode(budget=Budget(trigger_tokens=TRIGGER), plugins=pm)
    graph = build_graph(server, node, streaming=True)
    config = run_config(node, "async")
    chunks = 0
    async for _chunk, _meta in graph.astream(
        {"messages": [HumanMessage("Fix the bug.")]}, config, stream_mode="messages"
    ):
        chunks += 1
    assert chunks > 5
    state = await graph.aget_state(config)
    full_history_ok(state.values["messages"], 1)
    assert all(r.body.get("stream") for r in server.requests)
    assert_model_inputs_sound(server)
    assert len(collector.calls) == 5
    assert collector.calls[-1].response[0]["content"] == "task 1 done"


def test_rewrite_mode_replaces_state(server: RunningServer, pm: Any) -> None:
    node = CompactionNode(budget=Budget(trigger_tokens=TRIGGER), mode="rewrite", plugins=pm)
    graph = build_graph(server, node)
    config = run_config(node, "rewrite")
    for stream_item in graph.stream({"messages": [HumanMessage("Fix the bug.")]}, config,
                                    stream_mode="updates"):
        assert stream_item
    messages = graph.get_state(config).values["messages"]
    assert messages[0].content == "Fix the bug."
    assert any(isinstance(m, HumanMessage) and is_marked(m.text) for m in messages)
    assert len([m for m in messages if isinstance(m, ToolMessage)]) < 5
    validate(messages, LC)
    for sent in sent_messages(server):
        validate(sent, CHAT)


# ------------------------------------------------------------------ create_react_agent


def test_create_react_agent_pre_model_hook(
    server: RunningServer, pm: Any, collector: Collector
) -> None:
    from langgraph.prebuilt import create_react_agent

    hook = pre_model_hook(budget=Budget(trigger_tokens=TRIGGER), plugins=pm, episode_id="ep-react")
    with warnings.catch_warnings():  # create_react_agent is deprecated in langgraph 1.x
        warnings.simplefilter("ignore", DeprecationWarning)
        agent = create_react_agent(chat_model(server), TOOLS, pre_model_hook=hook,
                                   checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "react"}, "callbacks": [hook.logger]}
    state = agent.invoke({"messages": [HumanMessage("Fix the bug.")]}, config)
    full_history_ok(state["messages"], 1)
    state = agent.invoke({"messages": [HumanMessage("And the next one.")]}, config)
    full_history_ok(state["messages"], 2)
    assert_model_inputs_sound(server)
    assert len(collector.calls) == 10 and collector.calls[0].episode_id == "ep-react"
    assert any(c.compacted for c in collector.calls)


# ------------------------------------------------------------------ create_agent middleware


def make_agent(server: RunningServer, middleware: CompactionMiddleware, **extra: Any) -> Any:
    from langchain.agents import create_agent

    return create_agent(chat_model(server, **extra), TOOLS, system_prompt="You are a coder.",
                        middleware=[middleware], checkpointer=InMemorySaver())


def test_create_agent_middleware(server: RunningServer, pm: Any, collector: Collector) -> None:
    middleware = CompactionMiddleware(budget=Budget(trigger_tokens=TRIGGER), plugins=pm,
                                      episode_id="ep-mw", group_id="g")
    agent = make_agent(server, middleware)
    config = {"configurable": {"thread_id": "mw"}}
    state = agent.invoke({"messages": [HumanMessage("Fix the bug.")]}, config)
    full_history_ok(state["messages"], 1)
    state = agent.invoke({"messages": [HumanMessage("And the next one.")]}, config)
    full_history_ok(state["messages"], 2)
    assert_model_inputs_sound(server)
    requests = sent_messages(server)
    assert all(r[0] == {"role": "system", "content": "You are a coder."} for r in requests)
    assert len(collector.calls) == len(requests) == 10
    for call, sent in zip(collector.calls, requests, strict=True):
        assert call.messages[0]["role"] == "system" and len(call.messages) == len(sent)
        assert call.compacted == has_compaction(sent)
        assert {t["name"] for t in call.request["tools"]} == {"read_file", "search"}
    assert {(c.episode_id, c.group_id) for c in collector.calls} == {("ep-mw", "g")}


async def test_create_agent_middleware_async_streaming(
    server: RunningServer, pm: Any, collector: Collector
) -> None:
    middleware = CompactionMiddleware(budget=Budget(trigger_tokens=TRIGGER), plugins=pm)
    agent = make_agent(server, middleware, streaming=True)
    config = {"configurable": {"thread_id": "mw-async"}}
    async for _ in agent.astream({"messages": [HumanMessage("Fix the bug.")]}, config,
                                 stream_mode="messages"):
        pass
    state = await agent.aget_state(config)
    full_history_ok(state.values["messages"], 1)
    assert_model_inputs_sound(server)
    assert len(collector.calls) == 5


def test_engine_instance_and_logger_metadata(server: RunningServer, pm: Any,
                                             collector: Collector) -> None:
    engine = Engine(dialect=LC, budget=Budget(trigger_tokens=TRIGGER, recent_turns=2),
                    plugins=pm)
    node = CompactionNode(engine)
    assert node.engine is engine
    graph = build_graph(server, node)
    logger = ModelCallLogger(plugins=pm)
    config = {"configurable": {"thread_id": "meta"}, "callbacks": [logger],
              "metadata": {"agentcompact_episode_id": "run-7", "agentcompact_group_id": "g7"}}
    graph.invoke({"messages": [HumanMessage("Fix the bug.")]}, config)
    assert {(c.episode_id, c.group_id) for c in collector.calls} == {("run-7", "g7")}
    with pytest.raises(Exception, match="LangChainDialect"):
        CompactionNode(Engine(dialect="openai_chat", budget=Budget(trigger_tokens=100)))


# ------------------------------------------------------------------ what the model receives

BIG_TRIGGER = 20_000
BIG_PROMPT = "You are a careful coder. House rules follow.\n" + filler_text(15_000)


def looping_sim(steps: int = 19) -> UpstreamSim:
    """A model that reads ``steps`` files (~520 tokens each), then answers."""
    reads = [Reply.tool("read_file", {"path": f"src/x{i}.py"}) for i in range(steps)]
    return UpstreamSim(Script(*reads, then=lambda body: "done"))


def test_create_agent_counts_a_15k_system_prompt(pm: Any, collector: Collector) -> None:
    """The recommended path: create_agent + CompactionMiddleware; the system prompt and
    the tool schemas are part of what the trigger bounds."""
    from langchain.agents import create_agent

    with serve(looping_sim()) as server:
        middleware = CompactionMiddleware(budget=Budget(trigger_tokens=BIG_TRIGGER), plugins=pm)
        agent = create_agent(chat_model(server), TOOLS, system_prompt=BIG_PROMPT,
                             middleware=[middleware])
        state = agent.invoke({"messages": [HumanMessage("Fix the bug.")]},
                             {"recursion_limit": 100})
        assert largest_request(server, "/v1/chat/completions") <= BIG_TRIGGER
        assert len(sent_messages(server)) == 20
    assert any(e.cut for e in collector.events)  # bounded by compacting, not by luck
    assert len(state["messages"]) == 1 + 2 * 20 - 1  # the full history stays in state
    assert middleware.last_result is not None and middleware.last_result.tokens_after > 15_000


def test_pre_model_hook_counts_the_prompt_it_is_told(pm: Any, collector: Collector) -> None:
    from langgraph.prebuilt import create_react_agent

    with serve(looping_sim()) as server:
        hook = pre_model_hook(budget=Budget(trigger_tokens=BIG_TRIGGER), plugins=pm,
                              system_prompt=BIG_PROMPT,
                              tools=TOOLS)
        with warnings.catch_warnings():  # create_react_agent is deprecated in langgraph 1.x
            warnings.simplefilter("ignore")
            agent = create_react_agent(chat_model(server), TOOLS, pre_model_hook=hook,
                                       prompt=BIG_PROMPT)
        agent.invoke({"messages": [HumanMessage("Fix the bug.")]}, {"recursion_limit": 100})
        assert largest_request(server, "/v1/chat/completions") <= BIG_TRIGGER
    assert any(e.cut for e in collector.events)


def bypass_graph(model: Any, node: CompactionNode | None) -> Any:
    """START -> (compact) -> agent <-> tools: the tools -> agent edge skips any node."""
    def agent(state: dict[str, Any]) -> dict[str, Any]:
        if node is None:
            return {"messages": [model.invoke(state["messages"])]}
        return {"messages": [model.invoke(state.get("llm_input_messages")
                                          or state["messages"])]}

    class State(MessagesState):
        llm_input_messages: list[AnyMessage]

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(TOOLS))
    if node is not None:
        builder.add_node("compact", node)
        builder.add_edge(START, "compact")
        builder.add_edge("compact", "agent")
    else:
        builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def test_wrapped_model_cannot_be_bypassed(pm: Any, collector: Collector) -> None:
    """node.wrap(model) compacts inside the model: a tools -> agent edge cannot skip it."""
    with serve(looping_sim()) as server:
        node = CompactionNode(budget=Budget(trigger_tokens=BIG_TRIGGER), plugins=pm,
                              system_prompt=None)
        model = node.wrap(chat_model(server).bind_tools(TOOLS))
        graph = bypass_graph(model, None)
        state = graph.invoke({"messages": [SystemMessage(BIG_PROMPT), HumanMessage("Go.")]},
                             {"recursion_limit": 100, "configurable": {"thread_id": "t"}})
        assert largest_request(server, "/v1/chat/completions") <= BIG_TRIGGER
        assert len(sent_messages(server)) == 20
    assert any(e.cut for e in collector.events)
    assert len(state["messages"]) == 2 + 2 * 20 - 1


def test_node_detects_a_stale_llm_input(pm: Any) -> None:
    """The node behind a START edge only: the tools -> agent edge reuses its output. On
    the thread's next turn the node sees the model answered many times since its pass."""
    sim = UpstreamSim(Script(*task_steps(1), then=lambda body: "done"))
    with serve(sim) as server:
        node = CompactionNode(budget=Budget(trigger_tokens=BIG_TRIGGER), plugins=pm)
        graph = bypass_graph(chat_model(server).bind_tools(TOOLS), node)
        config = {"recursion_limit": 100, "configurable": {"thread_id": "t"}}
        graph.invoke({"messages": [HumanMessage("Go.")]}, config)
        stale = sent_messages(server)
        assert len(stale) == 5 and all(len(m) == 1 for m in stale)  # what the bug looks like
        with pytest.raises(ConfigError, match="answered 5 times since this node's last pass"):
            graph.invoke({"messages": [HumanMessage("Again.")]}, config)


def test_options_and_messages_are_checked() -> None:
    with pytest.raises(ConfigError, match="recent_turns"):
        CompactionMiddleware(budget=Budget(trigger_tokens=1000, recent_turns=0))
    with pytest.raises(ConfigError, match="trigger_tokens"):
        CompactionNode(budget=Budget(trigger_tokens="abc"))
    with pytest.raises(ConfigError, match="'nope'"):
        CompactionMiddleware(budget=Budget(trigger_tokens=1000), strategy="nope")
    with pytest.raises(ConfigError, match="CompactionMiddleware: unknown option.*trigger_tokens"):
        CompactionMiddleware(trigger_tokens=1000)
    with pytest.raises(ConfigError, match="CompactionNode: unknown option.*triger"):
        CompactionNode(triger_tokens=1000)
    assert CompactionMiddleware(budget=Budget(trigger_tokens=1000, recent_turns=1,
                                              min_recent_turns=1)).engine.budget.recent_turns == 1
    node = CompactionNode(budget=Budget(trigger_tokens=1000))
    with pytest.raises(DialectError, match=r"message 1 is str"):
        node.invoke({"messages": [HumanMessage("a"), "b"]})
    with pytest.raises(DialectError, match=r"message 0 is dict"):
        node.wrap(RunnableLambda(lambda x: x)).invoke([{"role": "user", "content": "a"}])


@pytest.mark.parametrize("bad", [42, {"role": "user", "content": "secret"}])
def test_engine_names_a_non_message_in_a_langchain_history(bad: Any) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    from agentcompact import Engine
    from agentcompact.errors import DialectError
    from agentcompact.integrations.langgraph import LangChainDialect

    msgs: list[Any] = []
    for _ in range(12):
        msgs += [HumanMessage("hi " * 40), AIMessage("ok " * 40)]
    msgs.insert(5, bad)
    with pytest.raises(DialectError, match=rf"^message 5 \({type(bad).__name__}\): langchain"
                       ) as info:
        Engine(dialect=LangChainDialect(), budget=Budget(trigger_tokens=300)).compact(msgs)
    assert "secret" not in str(info.value)


# ------------------------------------------------------------- sampled tokens recorded


@needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")
@pytest.mark.parametrize("streaming", [False, True])
def test_logger_records_the_servers_logprobs(pm: Any, collector: Collector,
                                            streaming: bool) -> None:
    """ChatOpenAI(logprobs=True) keeps each sampled token's logprob and bytes in
    response_metadata; the logger records them, and the bytes map back to the server's
    token ids (what the exporter does when a chat model drops vLLM's ids)."""
    transformers = pytest.importorskip("transformers")
    from agentcompact.testing import SimTokenizer, logprob_of
    from agentcompact.wire import token_ids_from_bytes

    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    sim = UpstreamSim(Script(Reply("Done: naïve fix ✓ applied.")), tokenizer=hf)
    with serve(sim) as server:
        model = ChatOpenAI(model="gpt-sim", base_url=server.base_url + "/v1", api_key="x",
                           max_retries=0, logprobs=True, streaming=streaming,
                           extra_body={"return_token_ids": True})
        model.invoke([HumanMessage("Fix it.")],
                     {"callbacks": [ModelCallLogger(plugins=pm, episode_id="lp")]})
    (call,) = collector.calls
    served = SimTokenizer(hf)
    ids = token_ids_from_bytes(call.response_token_bytes, hf)
    assert ids is not None and hf.decode(ids).startswith("Done: naïve fix ✓ applied.")
    assert [bytes(b) for b in call.response_token_bytes] == [served.token_bytes(i) for i in ids]
    assert call.response_logprobs == pytest.approx(
        [logprob_of(k) for k in range(len(ids))], abs=1e-6)
