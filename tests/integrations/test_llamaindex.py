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
from agentcompact._markers import COMPACTION_HEADER, is_marked
from agentcompact.dialects import OpenAIChatDialect
from agentcompact.errors import ConfigError, DialectError
from agentcompact.integrations.llamaindex import (
    CompactingLLM,
    CompactingMemory,
    LlamaIndexDialect,
    ModelCallLogger,
    to_openai_chat,
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
    memory = CompactingMemory(budget=Budget(trigger_tokens=TRIGGER))
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
    memory = CompactingMemory(budget=Budget(trigger_tokens=TRIGGER), plugins=pm, episode_id="ep-li",
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
        CompactingMemory(Engine(dialect="openai_chat", budget=Budget(trigger_tokens=100)))
    with pytest.raises(Exception, match="trigger_tokens"):
        CompactingMemory()
    logger = ModelCallLogger(episode_id="e")
    with logger:
        with logger:
            pass
    assert logger.episode_id == "e"


# ------------------------------------------------------------------------- bounded runs

BIG_TRIGGER = 20_000
BIG_PROMPT = "You are a coder. House rules follow.\n" + filler_text(15_000)
STEPS = 40


def long_run_server() -> RunningServer:
    """A model that reads STEPS files in one run (~430 tokens each), then answers."""
    reads = [Reply.tool("read_file", {"path": f"src/m{i}.py"}) for i in range(STEPS)]
    return serve(UpstreamSim(Script(*reads, then=lambda body: "all read")))


def sim_llm(server: RunningServer, http: httpx.AsyncClient) -> OpenAILike:
    return OpenAILike(model="gpt-sim", api_base=server.base_url + "/v1", api_key="x",
                      is_function_calling_model=True, is_chat_model=True, max_retries=0,
                      context_window=128_000, async_http_client=http)


@pytest.mark.parametrize("streaming", [True, False])
async def test_a_40_step_function_agent_run_stays_under_the_trigger(
        http: httpx.AsyncClient, pm: Any, collector: Collector, streaming: bool) -> None:
    """memory.wrap(llm): every LLM call of the run is compacted - system prompt (15k),
    tool schemas and the run's own tool loop included - and the memory keeps it all."""
    memory = CompactingMemory(budget=Budget(trigger_tokens=BIG_TRIGGER), plugins=pm)
    with long_run_server() as server:
        agent = FunctionAgent(tools=[read_file, search], llm=memory.wrap(sim_llm(server, http)),
                              streaming=streaming, system_prompt=BIG_PROMPT)
        with memory.logger:
            output = await agent.run("Read every module.", memory=memory, max_iterations=100)
        assert str(output).endswith("all read")
        assert len(sent_messages(server)) == STEPS + 1
        assert largest_request(server, "/v1/chat/completions") <= BIG_TRIGGER
    assert sum(1 for e in collector.events if e.cut) >= 2  # compacted inside the run
    history = memory.get_all()
    assert len(history) == 1 + 2 * STEPS + 1  # user, 40 x (call, result), answer
    assert not any(is_marked(m.content or "") for m in history)
    assert len(collector.calls) == STEPS + 1 and any(c.compacted for c in collector.calls)


async def test_memory_alone_bounds_only_what_came_before_the_run(
        http: httpx.AsyncClient) -> None:
    """The documented scope: CompactingMemory without the LLM wrapper cannot see the run's
    scratchpad, so one long run is not bounded - the figure docs/llamaindex.md quotes."""
    memory = CompactingMemory(budget=Budget(trigger_tokens=BIG_TRIGGER))
    with long_run_server() as server:
        agent = FunctionAgent(tools=[read_file, search], llm=sim_llm(server, http),
                              system_prompt=BIG_PROMPT)
        await agent.run("Read every module.", memory=memory, max_iterations=100)
        peak = largest_request(server, "/v1/chat/completions")
    assert peak > 1.5 * BIG_TRIGGER


async def test_react_agent_run_is_bounded(http: httpx.AsyncClient, pm: Any,
                                          collector: Collector) -> None:
    """ReActAgent (tools described in its system prompt, calls parsed from the text)."""
    from llama_index.core.agent.workflow import ReActAgent

    steps = [f"Thought: I need module {i}.\nAction: read_file\n"
             f'Action Input: {{"path": "src/r{i}.py"}}' for i in range(25)]
    script = Script(*steps, then=lambda body: "Thought: I can answer.\nAnswer: all read")
    memory = CompactingMemory(budget=Budget(trigger_tokens=6000), plugins=pm)
    with serve(UpstreamSim(script)) as server:
        llm = OpenAILike(model="gpt-sim", api_base=server.base_url + "/v1", api_key="x",
                         is_chat_model=True, max_retries=0, context_window=128_000,
                         async_http_client=http)
        agent = ReActAgent(tools=[read_file, search], llm=memory.wrap(llm), streaming=False)
        output = await agent.run("Read the modules.", memory=memory, max_iterations=100)
        assert "all read" in str(output)
        assert len(sent_messages(server)) == 26
        assert largest_request(server, "/v1/chat/completions") <= 6000
    assert any(e.cut for e in collector.events)


def test_messages_and_options_are_checked() -> None:
    memory = CompactingMemory(budget=Budget(trigger_tokens=TRIGGER))
    memory.put(ChatMessage(role="user", content="a"))
    with pytest.raises(DialectError, match=r"put: message 1 is str, not a LlamaIndex"):
        memory.put("a string")  # type: ignore[arg-type]
    with pytest.raises(DialectError, match=r"message 2 is dict"):
        memory.put_messages([ChatMessage(role="user", content="b"), {"role": "user"}])  # type: ignore[list-item]
    assert len(memory.get_all()) == 1 and len(memory.get()) == 1
    with pytest.raises(ConfigError, match="recent_turns"):
        CompactingMemory(budget=Budget(trigger_tokens=100, recent_turns=0))
    with pytest.raises(ConfigError, match="'nope'"):
        CompactingMemory(budget=Budget(trigger_tokens=100), strategy="nope")
    with pytest.raises(ConfigError, match="CompactingLLM: llm must be a LlamaIndex LLM"):
        CompactingLLM("gpt-4", budget=Budget(trigger_tokens=100))


# ------------------------------------------------------------- sampled tokens recorded


@needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")
@pytest.mark.parametrize("stream", [False, True])
def test_logger_records_the_servers_token_ids_and_logprobs(pm: Any, collector: Collector,
                                                           stream: bool) -> None:
    """A LlamaIndex OpenAI LLM asking a vLLM-style server for logprobs and token ids: the
    logger records the ids and logprobs the server sent (from ``response.raw``)."""
    transformers = pytest.importorskip("transformers")
    from agentcompact.testing import logprob_of

    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    sim = UpstreamSim(Script(Reply("Done: naïve fix ✓ applied.")), tokenizer=hf)
    with serve(sim) as server:
        llm = OpenAILike(model="gpt-sim", api_base=server.base_url + "/v1", api_key="x",
                         is_chat_model=True, max_retries=0, logprobs=True,
                         additional_kwargs={"extra_body": {"return_token_ids": True}})
        messages = [ChatMessage(role="user", content="Fix it.")]
        with ModelCallLogger(episode_id="lp", plugins=pm):
            if stream:
                raws = [r.raw.model_dump() for r in llm.stream_chat(messages)]
            else:
                raws = [llm.chat(messages).raw.model_dump()]
    (call,) = collector.calls
    ids = [i for raw in raws for i in raw["choices"][0].get("token_ids") or []]
    assert ids and call.response_token_ids == ids
    assert call.prompt_token_ids == raws[0]["prompt_token_ids"] is not None
    assert hf.decode(call.response_token_ids).startswith("Done: naïve fix ✓ applied.")
    assert call.response_logprobs == pytest.approx(
        [logprob_of(k) for k in range(len(call.response_token_ids))], abs=1e-6)
