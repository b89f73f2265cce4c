"""Overhead per agent step of the LangGraph / LangChain / LlamaIndex integrations at a
~150k-token history, beyond the engine's own time, measured side by side in one run.

An agent history (~150k tokens at the start) grows by one tool turn per step. Each step,
in an alternating order, a bare engine compacts the messages and each integration handles
the same step with its own identically configured engine: so every engine sees the same
sequence of histories and does the same work. Everything the model receives counts
(a system prompt and two tool schemas, given to the bare engine as ``fixed_tokens``).

- ``CompactionNode``: ``node.invoke(state)`` (wiring check, fixed tokens, state update);
- ``CompactionMiddleware``: ``wrap_model_call(request, handler)`` with a handler that
  answers at once, recording on (every call converted for ``agentcompact_log_model_call``,
  to a plugin manager with no recorder);
- ``CompactionNode.wrap(model)``: the Runnable chain, with a model that answers at once;
- ``CompactingLLM.chat``: with an LLM that answers at once (messages converted to
  LlamaIndex ``ChatMessage`` once, outside the timing).

Overhead = median over steps of (integration time - engine time), with the garbage
collector run before and paused during each timing; the first step (cold caches: every
message tokenized, converted) is measured on fresh objects. The trigger sits a little
above the starting size, so the run includes a compaction and the steps that reuse its
stored prefix.

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/integration_overhead.py
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, SystemMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph_overhead import history, turn  # type: ignore[import-not-found]
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, LLMMetadata
from llama_index.core.llms.custom import CustomLLM

from agentcompact import Budget, Engine, new_plugin_manager
from agentcompact.integrations.langgraph import (
    CompactionMiddleware,
    CompactionNode,
    LangChainDialect,
)
from agentcompact.integrations.llamaindex import CompactingLLM, LlamaIndexDialect

SYSTEM = "You are a careful coder. Follow the repository's conventions. " * 40


@tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return path


@tool
def search(query: str) -> str:
    """Search the repository for a string."""
    return query


TOOLS = [read_file, search]


class _InstantLLM(CustomLLM):
    """The model: answers at once (not the code measured)."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=True, is_function_calling_model=True)

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return ChatResponse(message=ChatMessage(role="assistant", content="ok"))

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError


def to_llama(messages: Sequence[Any], cache: dict[int, ChatMessage]) -> list[ChatMessage]:
    out = []
    for m in messages:
        found = cache.get(id(m))
        if found is None:
            role = {"system": "system", "human": "user", "ai": "assistant"}.get(m.type, "tool")
            kwargs = {"tool_call_id": m.tool_call_id} if role == "tool" else {}
            if role == "assistant" and m.tool_calls:
                kwargs = {"tool_calls": [{"id": c["id"], "type": "function", "function": {
                    "name": c["name"], "arguments": str(c["args"]).replace("'", '"')}}
                    for c in m.tool_calls]}
            found = cache[id(m)] = ChatMessage(role=role, content=m.content,
                                               additional_kwargs=kwargs)
        out.append(found)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=150_000, help="starting history size")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--turn-words", type=int, default=600, help="words per tool output")
    parser.add_argument("--first-calls", type=int, default=9, help="fresh first calls timed")
    args = parser.parse_args()

    trigger = int(args.tokens * 1.05)
    pm = new_plugin_manager()

    def lc_engine() -> Engine:
        return Engine(dialect=LangChainDialect(), budget=Budget(trigger_tokens=trigger),
                      plugins=pm)

    system = SystemMessage(SYSTEM)
    node = CompactionNode(lc_engine(), system_prompt=system, tools=TOOLS)
    middleware = CompactionMiddleware(lc_engine(), record=True)
    wrapper = CompactionNode(lc_engine(), system_prompt=system)
    answer = AIMessage(content="ok")
    wrapped = wrapper.wrap(RunnableLambda(lambda messages: answer), tools=TOOLS)
    llm = CompactingLLM(_InstantLLM(), Engine(dialect=LlamaIndexDialect(), plugins=pm,
                                              budget=Budget(trigger_tokens=trigger)))
    engine = lc_engine()
    li_engine = Engine(dialect=LlamaIndexDialect(), budget=Budget(trigger_tokens=trigger),
                       plugins=pm)
    fixed = node._fixed(system, TOOLS)  # what each integration counts besides the messages
    li_tools = [{"type": "function", "function": {"name": t.name, "description": t.description}}
                for t in TOOLS]
    li_fixed = li_engine.fixed_tokens({"tools": li_tools})

    messages = history(args.tokens, args.turn_words, lc_engine())
    start_tokens = engine.count(messages)
    model = FakeMessagesListChatModel(responses=[answer])
    n = len(messages) // 2
    li_cache: dict[int, ChatMessage] = {}
    times: dict[str, list[float]] = {k: [] for k in (
        "engine", "node", "middleware", "wrap", "li_engine", "CompactingLLM")}

    def handler(request: ModelRequest) -> ModelResponse:
        return ModelResponse(result=[answer])

    compactions = 0
    for step in range(args.steps):
        state: dict[str, Any] = {"messages": list(messages)}
        request = ModelRequest(model=model, messages=list(messages), system_message=system,
                               tools=list(TOOLS))
        li_messages = to_llama(messages, li_cache)
        runs: list[tuple[str, Callable[[], Any]]] = [
            ("engine", partial(engine.compact, messages, fixed_tokens=fixed)),
            ("node", partial(node.invoke, state)),
            ("middleware", partial(middleware.wrap_model_call, request, handler)),
            ("wrap", partial(wrapped.invoke, messages)),
            ("li_engine", partial(li_engine.compact, li_messages, fixed_tokens=li_fixed)),
            ("CompactingLLM", partial(llm.chat, li_messages, tools=li_tools)),
        ]
        for name, fn in runs if step % 2 else reversed(runs):  # alternate the order
            gc.collect()
            gc.disable()  # a collection lands on whichever runs: not a cost of either
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            gc.enable()
        assert node.last_result is not None and middleware.last_result is not None
        assert node.last_result.tokens_after == middleware.last_result.tokens_after
        compactions += node.last_result.compacted
        messages = messages + turn(n + step, args.turn_words)

    first = first_calls(messages, trigger, pm, system, args.first_calls)
    ms = 1000.0
    print(f"history: {start_tokens:,} tokens at start (+{fixed:,} system and tools), "
          f"{len(messages)} messages at the end; {args.steps} steps, {compactions} "
          f"compaction(s), trigger {trigger:,}")
    print(f"engine.compact median: {statistics.median(times['engine']) * ms:.3f} ms/step "
          f"(LlamaIndex messages: {statistics.median(times['li_engine']) * ms:.3f})")
    for name, base in (("node", "engine"), ("middleware", "engine"), ("wrap", "engine"),
                       ("CompactingLLM", "li_engine")):
        over = sorted(a - b for a, b in zip(times[name][1:], times[base][1:], strict=True))
        p10, p90 = over[len(over) // 10], over[len(over) * 9 // 10]
        print(f"{name:>14} overhead: median {statistics.median(over) * ms:.3f} ms/step "
              f"(p10 {p10 * ms:.2f}, p90 {p90 * ms:.2f}; target <= 2 ms)")
    for name, value in first.items():
        print(f"{name:>14} first call on the whole history, beyond a fresh engine's: "
              f"{value * ms:.1f} ms (median of {args.first_calls})")


def first_calls(messages: list[Any], trigger: int, pm: Any, system: SystemMessage,
                repeats: int) -> dict[str, float]:
    """The first call of a fresh integration on the whole history (every message
    tokenized; the middleware also converts each for the log) minus a fresh engine's."""
    model = FakeMessagesListChatModel(responses=[AIMessage(content="ok")])
    out: dict[str, list[float]] = {"node": [], "middleware": []}

    def handler(request: ModelRequest) -> ModelResponse:
        return ModelResponse(result=[AIMessage(content="ok")])

    for i in range(repeats):
        copies = [m.model_copy() for m in messages]  # fresh objects: no conversion cached
        budget = Budget(trigger_tokens=trigger)
        engine = Engine(dialect=LangChainDialect(), budget=budget, plugins=pm)
        node = CompactionNode(Engine(dialect=LangChainDialect(), budget=budget, plugins=pm),
                              system_prompt=system, tools=TOOLS)
        middleware = CompactionMiddleware(Engine(dialect=LangChainDialect(), budget=budget,
                                                 plugins=pm))
        request = ModelRequest(model=model, messages=copies, system_message=system,
                               tools=list(TOOLS))
        fixed = node._fixed(system, TOOLS)
        timed: dict[str, float] = {}
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("engine", partial(engine.compact, copies, fixed_tokens=fixed)),
            ("node", partial(node.invoke, {"messages": copies})),
            ("middleware", partial(middleware.wrap_model_call, request, handler))]
        for name, fn in calls[i % 3:] + calls[:i % 3]:  # each goes first in turn
            gc.collect()
            gc.disable()
            t0 = time.perf_counter()
            fn()
            timed[name] = time.perf_counter() - t0
            gc.enable()
        for name in out:
            out[name].append(timed[name] - timed["engine"])
    return {name: statistics.median(values) for name, values in out.items()}


if __name__ == "__main__":
    main()
