"""Overhead per call of the SDK wrapper (``compact(OpenAI(...))``) at a ~150k-token chat
history, beyond the engine's own time and the SDK's, measured side by side in one run.

The OpenAI client talks to an in-process ``httpx.MockTransport`` that answers every
request at once with the same small completion (no socket, no server: what is left is the
SDK's request building and response parsing). Each step, in an alternating order, the raw
client sends the history, a bare engine compacts it, and the wrapped client (its own
identically configured engine, recording on to a plugin manager with no recorder) sends
it; the raw client sends the bare engine's result, so both build the same request. The
history then grows by one tool turn. Overhead = the median over steps of (wrapped - raw -
engine): the steps before and after a compaction send very different sizes, so only the
per-step difference compares like with like.

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/integration_sdk_overhead.py
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import openai

from agentcompact import Budget, Engine, new_plugin_manager
from agentcompact.integrations.sdk import compact

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
ANSWER = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "finish_reason": "stop", "message": {
                         "role": "assistant", "content": "ok"}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                               "total_tokens": 2}}).encode()


def turn(i: int, words: int) -> list[dict[str, Any]]:
    body = " ".join(f"{WORDS[(i + j) % len(WORDS)]}{j % 97}" for j in range(words))
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"m{i}.py"})}}
    return [{"role": "assistant", "content": f"Reading module {i}.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"$ cat m{i}.py\n{body}"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=150_000, help="starting history size")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--turn-words", type=int, default=600, help="words per tool output")
    args = parser.parse_args()

    trigger = int(args.tokens * 1.05)
    pm = new_plugin_manager()
    transport = httpx.MockTransport(lambda request: httpx.Response(
        200, content=ANSWER, headers={"content-type": "application/json"}))
    raw = openai.OpenAI(api_key="x", base_url="http://sim/v1", max_retries=0,
                        http_client=httpx.Client(transport=transport))
    wrapped = compact(raw, budget=Budget(trigger_tokens=trigger), plugins=pm)
    engine = Engine(dialect="openai_chat", budget=Budget(trigger_tokens=trigger), plugins=pm)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coder."},
                                      {"role": "user", "content": "Fix the failing test."}]
    i = 0
    while engine.count(messages) < args.tokens:
        messages += turn(i, args.turn_words)
        i += 1
    start = engine.count(messages)
    fixed = engine.fixed_tokens({"tools": TOOLS})
    times: dict[str, list[float]] = {"raw": [], "engine": [], "wrapped": []}
    def timed(name: str, fn: Callable[[], Any]) -> Any:
        gc.collect()
        gc.disable()  # a collection lands on whichever runs: not a cost of either
        t0 = time.perf_counter()
        out = fn()
        times[name].append(time.perf_counter() - t0)
        gc.enable()
        return out

    for step in range(args.steps):
        send = partial(wrapped.chat.completions.create, model="m", messages=messages,
                       tools=TOOLS)
        if step % 2:
            timed("wrapped", send)
        result = timed("engine", partial(engine.compact, messages, fixed_tokens=fixed))
        # the raw client sends what the wrapper sends: the same request building
        timed("raw", partial(raw.chat.completions.create, model="m",
                             messages=result.messages, tools=TOOLS))
        if not step % 2:
            timed("wrapped", send)
        messages = messages + turn(i + step, args.turn_words)
    over = [w - r - e for w, r, e in zip(times["wrapped"][1:], times["raw"][1:],
                                         times["engine"][1:], strict=True)]
    ms = 1000.0
    print(f"history: {start:,} tokens at start, {len(messages)} messages at the end; "
          f"{args.steps} steps, trigger {trigger:,}")
    for name in times:
        print(f"{name:>8} median: {statistics.median(times[name][1:]) * ms:.3f} ms/call")
    med = {name: statistics.median(values[1:]) for name, values in times.items()}
    spread = sorted(over)
    p10, p90 = spread[len(spread) // 10], spread[len(spread) * 9 // 10]
    print(f"wrapper overhead: median of the per-step (wrapped - raw - engine) "
          f"{statistics.median(over) * ms:.3f} ms/call (p10 {p10 * ms:.2f}, p90 {p90 * ms:.2f};"
          f" target <= 2 ms); the SDK's own request building is "
          f"{med['raw'] / med['engine']:.0f}x the engine's time and dominates the spread")


if __name__ == "__main__":
    main()
