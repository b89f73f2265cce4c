"""Host frameworks bounded: agentcompact inside LiteLLM, the OpenAI Agents SDK, PydanticAI and
Google ADK, beside each framework's own compaction where it has one, in one run.

Each framework runs its real agent loop against the upstream simulator (a scripted model
that calls ``read_file`` once per step, reading the step from the newest tool result): a
``--steps``-step tool loop (40) under a ``--system``-token system prompt (15000), each tool
result ``--result`` tokens (1200), compaction trigger ``--trigger`` (40000). Canaries are
planted in the task (a rule) and in three tool results (a path and a number each, at 10,
50 and 90% of the loop). For every arm, measured at the simulator (what the provider got):

- ``largest``: the largest request in tokens (tiktoken o200k: messages, system prompt or
  instructions, tool schemas), and whether it is within the trigger;
- ``cost``: input cost with prompt caching (cache read 0.1x, write 1.25x; the prefix shared
  with the previous request, in whole messages, is read from cache), as a ratio to the
  same framework's run without compaction;
- ``canaries``: canaries found in the text of the last request (of 7);
- ``invalid``: requests the provider would refuse (tool pairs, role order).

The arms: ``none`` (the framework as it is), ``agentcompact``, and the framework's own:
LiteLLM's ``context_management`` (``clear_tool_uses_20250919``, trigger = the trigger, keep
3, applied by LiteLLM for any provider on its ``/v1/messages`` path, which all three LiteLLM
arms use), the Agents SDK's ``OpenAIResponsesCompactionSession`` and ADK's
``EventsCompactionConfig`` (token threshold = the trigger, 6 events kept; it summarizes
with the agent's model, so its runs have extra calls). PydanticAI has none. The Agents SDK's
session compacts after a run: within one run it sends what ``none`` sends.

Overhead (``--overhead``): each integration's hook on a ``--overhead-tokens`` (100000)
history growing by one tool step per call, under a trigger it does not reach (the common
case), timed over 40 calls (p50), beside the p50 of a direct chat-completions call of the
same history to the simulator (the openai SDK), in the same run: added ms and the ratio.
Wall-clock figures on a shared machine are noisy; compare the ratio.

Run:  TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/hosts_bound.py
      (--steps 12 --system 3000 --trigger 12000 for a quick look; --only litellm,adk)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import orjson

from agentcompact import Budget, Engine, get_dialect
from agentcompact.testing import Reply, Script, ToolCall, UpstreamSim, serve

_STEP = re.compile(r"STEP (\d+) OF ")
_PATHS = {"/v1/chat/completions": "openai_chat", "/v1/responses": "openai_responses"}
DONE = "All steps done."


class Loop:
    """The task: its system prompt, its canaries, its tool and the stand-in model."""

    def __init__(self, steps: int, system_tokens: int, result_tokens: int) -> None:
        self.steps = steps
        self.system = _filler("Follow the engineering handbook. ", system_tokens)
        self.result_tokens = result_tokens
        planted = sorted({max(1, round(steps * d)) for d in (0.1, 0.5, 0.9)})
        self.canaries = {"rule": "CANARY-RULE never edit vendor/ without asking"}
        self.planted: dict[int, list[str]] = {}
        for n in planted:
            found = [f"/srv/app/canary_module_{n}.py", f"build took {4100 + n} ms"]
            self.planted[n] = found
            self.canaries[f"path {n}"], self.canaries[f"number {n}"] = found
        self.task = f"Read every step file, one per call. {self.canaries['rule']}."

    def read_file(self, path: str) -> str:
        match = re.search(r"(\d+)", path)
        n = int(match.group(1)) if match else 0
        lines = [f"STEP {n} OF {self.steps}"]
        for item in self.planted.get(n, ()):
            lines.append(f"note: {item}")
        body = _filler(f"log line {n}: compiled module and ran checks\n", self.result_tokens)
        middle = len(body) // 2
        return "\n".join(lines) + "\n" + body[:middle] + "\n".join(
            self.planted.get(n, ())) + body[middle:]

    def responder(self, body: dict[str, Any]) -> Reply:
        tools = orjson.dumps(body.get("tools") or [])
        history = orjson.dumps(body.get("messages", body.get("input", []))).decode()
        if b"read_file" not in tools:
            return Reply("Summary: steps read so far.")
        done = [int(m.group(1)) for m in _STEP.finditer(history)]
        n = max(done) + 1 if done else 1
        if n > self.steps:
            return Reply(DONE)
        return Reply.calling(ToolCall("read_file", {"path": f"step_{n}.txt"}))


def _filler(unit: str, tokens: int) -> str:
    return (unit * (tokens * 4 // len(unit) + 1))[: tokens * 4]


# ------------------------------------------------------------------ measuring requests


class Meter:
    """Tokens, digests and validity of the requests the simulator received."""

    def __init__(self) -> None:
        self.engines = {d: Engine(dialect=d, budget=Budget(trigger_tokens=10**9))
                        for d in _PATHS.values()}

    def measure(self, requests: list[Any], trigger: int, canaries: dict[str, str],
                baseline_cost: float | None) -> dict[str, Any]:
        from agentcompact import validate
        from agentcompact._cachecost import CacheCost

        sent = [(r.body, _PATHS[r.path]) for r in requests if r.path in _PATHS]
        cost = CacheCost()
        largest, invalid = 0, 0
        for body, dialect in sent:
            engine = self.engines[dialect]
            d = get_dialect(dialect)
            messages = body[d.messages_key]
            fixed = engine.fixed_tokens(body)
            tokens = [fixed, *(engine.count([m]) for m in messages)]
            digests = ["fixed:" + str(hash(orjson.dumps(
                {k: body.get(k) for k in ("system", "instructions", "tools")}))),
                *(d.digest(m) for m in messages)]
            cost.add(digests, tokens)
            largest = max(largest, sum(tokens))
            try:
                validate(messages, d)
            except Exception:
                invalid += 1
        last = orjson.dumps(sent[-1][0]).decode() if sent else ""
        found = sum(1 for c in canaries.values() if json.dumps(c)[1:-1] in last)
        total = sum(c.cost for c in cost.calls)
        return {"calls": len(sent), "largest": largest, "within": largest <= trigger,
                "cost": total, "cost_ratio": total / baseline_cost if baseline_cost else 1.0,
                "canaries": f"{found}/{len(canaries)}", "invalid": invalid}


# ------------------------------------------------------------------ the frameworks


async def litellm_arm(loop: Loop, base: str, arm: str, trigger: int) -> None:
    import litellm

    from agentcompact.integrations.litellm import CompactionCallback

    litellm.callbacks = ([CompactionCallback(budget=Budget(trigger_tokens=trigger))]
                         if arm == "agentcompact" else [])
    extra: dict[str, Any] = {}
    if arm == "builtin":
        extra["context_management"] = {"edits": [{
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": trigger},
            "keep": {"type": "tool_uses", "value": 3}}]}
    tools = [{"name": "read_file", "description": "Read a file of the repository.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                               "required": ["path"]}}]
    messages: list[Any] = [{"role": "user", "content": loop.task}]
    for _ in range(loop.steps + 1):
        reply = await litellm.anthropic.messages.acreate(
            model="openai/sim-model", api_base=f"{base}/v1", api_key="sk-bench",
            max_tokens=512, system=loop.system, messages=messages, tools=tools, **extra)
        content = reply["content"] if isinstance(reply, dict) else reply.content
        blocks = [b if isinstance(b, dict) else b.model_dump() for b in content]
        calls = [b for b in blocks if b.get("type") == "tool_use"]
        if not calls:
            break
        messages.append({"role": "assistant", "content": blocks})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b["id"],
             "content": loop.read_file(str(b["input"].get("path")))} for b in calls]})
    litellm.callbacks = []


async def agents_arm(loop: Loop, base: str, arm: str, trigger: int) -> None:
    from agents import (
        Agent,
        OpenAIResponsesCompactionSession,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        SQLiteSession,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    from agentcompact.integrations.openai_agents import CompactionFilter

    set_tracing_disabled(True)

    @function_tool
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        return loop.read_file(path)

    async with AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-bench") as client:
        agent = Agent(name="engineer", instructions=loop.system, tools=[read_file],
                      model=OpenAIResponsesModel(model="sim-model", openai_client=client))
        budget = Budget(trigger_tokens=trigger)
        config = (RunConfig(call_model_input_filter=CompactionFilter(budget=budget))
                  if arm == "agentcompact" else RunConfig())
        session = None
        if arm == "builtin":
            # its compaction call names a model it supports; the simulator answers any
            session = OpenAIResponsesCompactionSession("bench", SQLiteSession("bench"),
                                                       client=client)
        await Runner.run(agent, loop.task, max_turns=loop.steps + 5, run_config=config,
                         session=session)


async def pydantic_ai_arm(loop: Loop, base: str, arm: str, trigger: int) -> None:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from agentcompact.integrations.pydantic_ai import Compaction

    async with AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-bench") as client:
        model = OpenAIChatModel("sim-model", provider=OpenAIProvider(openai_client=client))
        caps = [Compaction(budget=Budget(trigger_tokens=trigger))] if arm == "agentcompact" else []
        agent: Any = Agent(model, instructions=loop.system, capabilities=caps)

        @agent.tool_plain
        def read_file(path: str) -> str:
            """Read a file of the repository."""
            return loop.read_file(path)

        await agent.run(loop.task)


async def adk_arm(loop: Loop, base: str, arm: str, trigger: int) -> None:
    from google.adk.agents import LlmAgent
    from google.adk.apps import App
    from google.adk.apps.app import EventsCompactionConfig
    from google.adk.models.lite_llm import LiteLlm
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService
    from google.genai import types

    from agentcompact.integrations.adk import CompactionCallback

    def read_file(path: str) -> str:
        """Read a file of the repository."""
        return loop.read_file(path)

    agent = LlmAgent(name="engineer", instruction=loop.system, tools=[read_file],
                     model=LiteLlm(model="openai/sim-model", api_base=f"{base}/v1",
                                   api_key="sk-bench"),
                     before_model_callback=CompactionCallback(budget=Budget(trigger_tokens=trigger))
                     if arm == "agentcompact" else None)
    compaction = EventsCompactionConfig(token_threshold=trigger, event_retention_size=6) \
        if arm == "builtin" else None
    sessions = InMemorySessionService()
    runner = Runner(app=App(name="bench", root_agent=agent,
                            events_compaction_config=compaction), session_service=sessions)
    session = await sessions.create_session(app_name="bench", user_id="u")
    task = types.Content(role="user", parts=[types.Part(text=loop.task)])
    async for _ in runner.run_async(user_id="u", session_id=session.id, new_message=task):
        pass


FRAMEWORKS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "litellm": (litellm_arm, ("none", "builtin", "agentcompact")),
    "openai-agents": (agents_arm, ("none", "builtin", "agentcompact")),
    "pydantic-ai": (pydantic_ai_arm, ("none", "agentcompact")),
    "adk": (adk_arm, ("none", "builtin", "agentcompact")),
}
BUILTIN = {"litellm": "context_management clear_tool_uses",
           "openai-agents": "OpenAIResponsesCompactionSession",
           "adk": "EventsCompactionConfig token_threshold"}


def bound(args: argparse.Namespace, only: list[str]) -> None:
    loop = Loop(args.steps, args.system, args.result)
    meter = Meter()
    print(f"{args.steps}-step tool loop, {args.system}-token system prompt, "
          f"{args.result}-token tool results, trigger {args.trigger}")
    print(f"{'framework':14} {'arm':38} {'calls':>5} {'largest':>8} {'<=trig':>6} "
          f"{'cost x':>7} {'canaries':>8} {'invalid':>7}")
    for name in only:
        run, arms = FRAMEWORKS[name]
        baseline: float | None = None
        for arm in arms:
            sim = UpstreamSim(Script(then=loop.responder))
            with serve(sim) as server:
                try:
                    asyncio.run(run(loop, server.base_url, arm, args.trigger))
                except Exception as exc:  # a framework's own failure is a result too
                    print(f"{name:14} {arm:38} failed: {type(exc).__name__}: "
                          f"{str(exc)[:120]}")
                    continue
                row = meter.measure(server.requests, args.trigger, loop.canaries, baseline)
            if arm == "none":
                baseline = row["cost"]
            label = BUILTIN.get(name, arm) if arm == "builtin" else arm
            print(f"{name:14} {label:38} {row['calls']:>5} {row['largest']:>8} "
                  f"{'yes' if row['within'] else 'no':>6} {row['cost_ratio']:>7.2f} "
                  f"{row['canaries']:>8} {row['invalid']:>7}")


# ------------------------------------------------------------------ overhead


def _chat_history(tokens: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be careful."},
                                      {"role": "user", "content": "Read the logs."}]
    n = 0
    while len(orjson.dumps(messages)) < tokens * 4:
        n += 1
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"c{n}", "type": "function",
                "function": {"name": "read_file", "arguments": f'{{"path": "f{n}"}}'}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": _filler(f"line {n} ", 1000)}]
    return messages


def _p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def _hooks(history: list[dict[str, Any]], calls: int) -> dict[str, list[float]]:
    """Each integration's hook timed on ``history`` growing by one step per call."""
    from agents import Agent, ModelSettings
    from agents.run import CallModelData, ModelInputData
    from google.adk.models.llm_request import LlmRequest
    from google.genai import types
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    from agentcompact.integrations.adk import CompactionCallback as ADKCallback
    from agentcompact.integrations.litellm import CompactionCallback
    from agentcompact.integrations.openai_agents import CompactionFilter
    from agentcompact.integrations.pydantic_ai import Compaction

    huge = 10**9
    steps = [m for m in history[2:]]
    times: dict[str, list[float]] = {k: [] for k in ("litellm (gateway)", "litellm (SDK)",
                                                     "openai-agents", "pydantic-ai", "adk")}
    budget = Budget(trigger_tokens=huge)
    gateway, sdk = CompactionCallback(budget=budget), CompactionCallback(budget=budget)
    filt, cap, adk = (CompactionFilter(budget=budget), Compaction(budget=budget),
                      ADKCallback(budget=budget))
    agent = Agent(name="a", instructions="Be careful.", model_settings=ModelSettings())
    # native histories, built once (a framework re-sends the same objects each call)
    items: list[Any] = [{"role": "user", "content": "Read the logs."}]
    pyd: list[Any] = [ModelRequest(parts=[SystemPromptPart("Be careful."),
                                          UserPromptPart("Read the logs.")])]
    genai: list[Any] = [types.Content(role="user", parts=[types.Part(text="Read the logs.")])]
    for a, t in zip(steps[::2], steps[1::2]):
        call = a["tool_calls"][0]
        items += [{"type": "function_call", "call_id": call["id"], "name": "read_file",
                   "arguments": call["function"]["arguments"]},
                  {"type": "function_call_output", "call_id": call["id"], "output": t["content"]}]
        pyd += [ModelResponse(parts=[ToolCallPart("read_file", call["function"]["arguments"],
                                                  tool_call_id=call["id"])]),
                ModelRequest(parts=[ToolReturnPart("read_file", t["content"],
                                                   tool_call_id=call["id"])])]
        genai += [types.Content(role="model", parts=[types.Part(function_call=types.FunctionCall(
                      id=call["id"], name="read_file", args={"path": call["id"]}))]),
                  types.Content(role="user", parts=[types.Part(
                      function_response=types.FunctionResponse(
                          id=call["id"], name="read_file", response={"result": t["content"]}))])]
    base = len(steps) - 2 * calls
    for i in range(calls):
        upto = base + 2 * (i + 1)
        chat = history[:2 + upto]
        fresh = orjson.loads(orjson.dumps({"model": "m", "messages": chat}))  # a gateway parses
        data = {**fresh, "proxy_server_request": {"headers": {}}}
        t0 = time.perf_counter()
        await gateway.async_pre_call_hook(None, None, data, "acompletion")
        t1 = time.perf_counter()
        await sdk.async_pre_call_deployment_hook({"model": "m", "messages": chat}, "acompletion")
        t2 = time.perf_counter()
        await filt(CallModelData(model_data=ModelInputData(input=items[:1 + upto],
                                                           instructions="Be careful."),
                                 agent=agent, context=None))
        t3 = time.perf_counter()
        await cap.compact(pyd[:1 + upto], instructions="Be careful.")
        t4 = time.perf_counter()
        await adk(None, LlmRequest(contents=genai[:1 + upto]))  # type: ignore[arg-type]
        t5 = time.perf_counter()
        for key, (a0, a1) in zip(times, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5))):
            times[key].append(a1 - a0)
    return times


async def _direct(base: str, history: list[dict[str, Any]], calls: int) -> list[float]:
    from openai import AsyncOpenAI

    samples = []
    async with AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-bench") as client:
        for i in range(calls):
            t0 = time.perf_counter()
            await client.chat.completions.create(model="sim-model",
                                                 messages=history[:len(history) - calls + i])
            samples.append(time.perf_counter() - t0)
    return samples


def overhead(tokens: int, calls: int) -> None:
    history = _chat_history(tokens)
    with serve(UpstreamSim(Script(), max_recorded=0)) as server:
        direct = _p50_ms(asyncio.run(_direct(server.base_url, history, calls)))
    times = asyncio.run(_hooks(history, calls))
    print(f"\nadded time per call, {tokens}-token history growing one step per call, "
          f"{calls} calls (p50); direct chat-completions call to the simulator "
          f"{direct:.2f} ms p50")
    for name, samples in times.items():
        ms = _p50_ms(samples[1:])  # the first call measures the whole history
        print(f"{name:20} {ms:7.3f} ms   ratio to the direct call {ms / direct:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--system", type=int, default=15000)
    parser.add_argument("--result", type=int, default=1200)
    parser.add_argument("--trigger", type=int, default=40000)
    parser.add_argument("--only", default=",".join(FRAMEWORKS))
    parser.add_argument("--no-bound", action="store_true", help="only the overhead")
    parser.add_argument("--overhead", action="store_true", help="also the added time")
    parser.add_argument("--overhead-tokens", type=int, default=100_000)
    parser.add_argument("--overhead-calls", type=int, default=40)
    args = parser.parse_args()
    if not args.no_bound:
        bound(args, [n for n in args.only.split(",") if n])
    if args.overhead or args.no_bound:
        overhead(args.overhead_tokens, args.overhead_calls)


if __name__ == "__main__":
    main()
