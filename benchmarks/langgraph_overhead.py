"""Overhead of the LangGraph CompactionNode per agent step, beyond the engine's own time.

An agent history of LangChain messages (~150k tokens at the start) grows by one tool turn per
step. Each step, a CompactionNode is called on the graph state and, separately, an
identically configured engine compacts the same messages; both see the same sequence of
histories, so they do the same work. The node's overhead is the median over steps of
(node time - engine.compact time). The trigger sits a little above the starting size, so
the run includes a compaction and the steps that reuse its stored prefix.

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/langgraph_overhead.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage

from agentcompact import Budget, Engine
from agentcompact.integrations.langgraph import (
    CompactionNode,
    LangChainDialect,
)

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


def tool_output(i: int, words: int) -> str:
    body = " ".join(f"{WORDS[(i + j) % len(WORDS)]}{j % 97}" for j in range(words))
    return f"$ cat src/module_{i}.py\n{body}"


def turn(i: int, words: int) -> list[AnyMessage]:
    call = {"name": "read_file", "args": {"path": f"src/module_{i}.py"}, "id": f"call_{i}"}
    return [AIMessage(content=f"Reading module {i}.", tool_calls=[call]),
            ToolMessage(content=tool_output(i, words), tool_call_id=f"call_{i}")]


def history(tokens: int, words: int, engine: Engine) -> list[AnyMessage]:
    messages: list[AnyMessage] = [SystemMessage("You are a careful coder."),
                                  HumanMessage("Find and fix the failing test.")]
    i = 0
    while engine.count(messages) < tokens:
        messages += turn(i, words)
        i += 1
    return messages


def make_engine(trigger: int) -> Engine:
    return Engine(dialect=LangChainDialect(), budget=Budget(trigger_tokens=trigger))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=150_000, help="starting history size")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--turn-words", type=int, default=600, help="words per tool output")
    args = parser.parse_args()

    trigger = int(args.tokens * 1.05)
    node = CompactionNode(make_engine(trigger))
    engine = make_engine(trigger)
    messages = history(args.tokens, args.turn_words, make_engine(trigger))
    start_tokens = engine.count(messages)
    n = len(messages) // 2
    node_s: list[float] = []
    engine_s: list[float] = []
    compactions = 0
    for step in range(args.steps):
        state: dict[str, Any] = {"messages": list(messages)}
        runs = [("node", node, state), ("engine", engine.compact, messages)]
        for name, fn, arg in runs if step % 2 else reversed(runs):  # alternate the order
            t0 = time.perf_counter()
            fn(arg)
            elapsed = time.perf_counter() - t0
            (node_s if name == "node" else engine_s).append(elapsed)
        assert node.last_result is not None
        compactions += node.last_result.compacted
        messages = messages + turn(n + step, args.turn_words)

    overhead = [a - b for a, b in zip(node_s, engine_s, strict=True)]
    ms = 1000.0
    print(f"history: {start_tokens:,} tokens at start, {len(messages)} messages at the end; "
          f"{args.steps} steps, {compactions} compaction(s), trigger {trigger:,}")
    print(f"engine.compact median: {statistics.median(engine_s) * ms:.3f} ms/step")
    print(f"node call median:      {statistics.median(node_s) * ms:.3f} ms/step")
    print(f"node overhead (median of node - engine per step): "
          f"{statistics.median(overhead) * ms:.3f} ms/step (target <= 2 ms)")


if __name__ == "__main__":
    main()
