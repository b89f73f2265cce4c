"""LLM strategies: parallel vs summary wall time, and background compaction's stall.

Both run against ``agentcompact.integrations.upstream_sim`` on loopback (real HTTP through
the ``openai`` SDK), whose latency model charges each request ``ttft + input/prefill_rate``
then ``output/decode_rate``, concurrent requests overlapping as on a real server. Replies
are long filler text cut by each request's ``max_tokens``, so every request decodes its
whole output budget (the worst case, and what makes decode volumes comparable).

1. parallel vs summary: one compaction of the same history; ``summary`` sends one request
   with the whole output budget, ``parallel`` sends N block requests whose budgets sum to
   at most the same budget. Prints wall times, the decode volumes, the ratio, and how
   close parallel gets to its floor (the latency model's time for its slowest block).
2. background: an agent loop (each model call ``--agent-step`` seconds) growing a history
   past the trigger; the stall is the time the agent waits on compaction before a model
   call. Blocking ``summary`` engine vs ``BackgroundCompactor`` over the same engine.

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/llm_strategies.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from typing import Any

import openai  # noqa: F401 - imported up front so its import time is not in the timings

from agentcompact import Engine, new_plugin_manager
from agentcompact.background import BackgroundCompactor
from agentcompact.integrations.upstream_sim import (
    LatencyModel,
    Reply,
    Script,
    UpstreamSim,
    estimate_tokens,
    prompt_tokens,
    serve,
)

WORDS = ("the build of src/app.py failed with FileNotFoundError at line 42 so we ran make "
         "test again and pytest reported 3 errors in tests/test_io.py ").split()


def history(turns: int, start: int = 0, result_words: int = 300) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [] if start else [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing build. Never touch setup.cfg."}]
    for k in range(start, start + turns):
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"cmd": f"make T{k}"})}}
        body = " ".join(WORDS[(k * 7 + i) % len(WORDS)] for i in range(result_words))
        msgs.append({"role": "assistant", "content": f"Step {k}.", "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{k}", "content": f"T{k}: {body}"})
    return msgs


def filler(body: dict[str, Any]) -> Reply:
    return Reply.filler(100_000)  # cut to max_tokens by the simulator


def make_engine(strategy: str, base_url: str, trigger: int, target: int,
                **settings: Any) -> Engine:
    client = {"base_url": f"{base_url}/v1", "model": "bench", "api_key": "sk-bench",
              "max_retries": 0, "timeout": 120, "context_window": 128_000}
    return Engine(strategy=strategy, plugins=new_plugin_manager(), trigger_tokens=trigger,
                  target_tokens=target, strategy_settings={**client, **settings})


def turns_just_over(trigger: int) -> int:
    """Fewest turns whose history is over ``trigger`` (one crossing: one compaction)."""
    counter = Engine(trigger_tokens=trigger)
    n = 1
    while counter.count(history(n)) <= trigger:
        n += 1
    return n


def predicted_s(latency: LatencyModel, body: dict[str, Any]) -> float:
    out = min(estimate_tokens(Reply.filler(100_000).text), int(body["max_tokens"]))
    return latency.prefill_s(prompt_tokens(body)) + latency.decode_s(out)


async def one_compaction(strategy: str, latency: LatencyModel, args: argparse.Namespace,
                         msgs: list[dict[str, Any]], **settings: Any
                         ) -> tuple[float, list[dict[str, Any]]]:
    sim = UpstreamSim(Script(then=filler), latency=latency)
    with serve(sim) as server:
        engine = make_engine(strategy, server.base_url, args.trigger, args.target, **settings)
        t0 = time.perf_counter()
        result = await engine.acompact(msgs)
        wall = time.perf_counter() - t0
        assert result.compacted and result.event is not None and result.event.error is None
        return wall, [r.body for r in server.requests]


async def bench_parallel(args: argparse.Namespace) -> None:
    latency = LatencyModel(ttft_s=0.05, prefill_tokens_per_s=args.prefill,
                           decode_tokens_per_s=args.decode)
    msgs = history(turns_just_over(args.trigger))
    print(f"history: {len(msgs)} messages; latency model: ttft 0.05 s, prefill "
          f"{args.prefill:.0f} tok/s, decode {args.decode:.0f} tok/s per request")
    s_wall, s_bodies = await one_compaction("summary", latency, args, msgs)
    s_out = sum(b["max_tokens"] for b in s_bodies)
    s_model = predicted_s(latency, s_bodies[0])
    print(f"summary : {len(s_bodies)} request,  decode budget {s_out:5d} tokens, "
          f"wall {s_wall:6.2f} s (latency model alone: {s_model:.2f} s)")
    for blocks in args.blocks:
        p_wall, p_bodies = await one_compaction("parallel", latency, args, msgs, blocks=blocks)
        p_out = sum(b["max_tokens"] for b in p_bodies)
        floor = max(predicted_s(latency, b) for b in p_bodies)
        print(f"parallel: {len(p_bodies)} requests, decode budget {p_out:5d} tokens, "
              f"wall {p_wall:6.2f} s; speed-up x{s_wall / p_wall:.2f} (target >= 3 with 4+ "
              f"blocks); floor (slowest block) {floor:.2f} s, wall/floor {p_wall / floor:.2f}")


async def agent_loop(compact: Any, msgs: list[dict[str, Any]], steps: int, step_s: float
                     ) -> list[float]:
    """Each step: compact (stall measured), a model call (``step_s``), one more turn."""
    stalls = []
    turn = sum(1 for m in msgs if m["role"] == "assistant")
    for _ in range(steps):
        t0 = time.perf_counter()
        await compact(msgs)
        stalls.append(time.perf_counter() - t0)
        await asyncio.sleep(step_s)
        msgs = msgs + history(1, start=turn)
        turn += 1
    return stalls


async def bench_background(args: argparse.Namespace) -> None:
    latency = LatencyModel(ttft_s=0.05, prefill_tokens_per_s=args.prefill,
                           decode_tokens_per_s=args.decode)
    soft = (args.trigger + args.target) // 2
    start = turns_just_over(soft) - 1
    steps = turns_just_over(args.trigger) - start + 2
    print(f"agent: model call {args.agent_step:.2f} s per step; soft threshold {soft}, "
          f"trigger {args.trigger}; {steps} steps from {start} turns")
    results = {}
    for mode in ("blocking", "background"):
        sim = UpstreamSim(Script(then=filler), latency=latency)
        with serve(sim) as server:
            engine = make_engine("summary", server.base_url, args.trigger, args.target)
            if mode == "blocking":
                stalls = await agent_loop(engine.acompact, history(start), steps,
                                          args.agent_step)
            else:
                bg = BackgroundCompactor(engine, soft_trigger_tokens=soft, wait_s=30)
                stalls = await agent_loop(bg.compact, history(start), steps, args.agent_step)
                await bg.aclose()
                print(f"  background stats: {bg.stats}")
        results[mode] = max(stalls)
        print(f"{mode:10s}: worst stall {max(stalls):6.3f} s, total {sum(stalls):6.3f} s "
              f"over {steps} steps ({len(sim.requests)} summarizer requests)")
    ratio = results["background"] / results["blocking"]
    print(f"background / blocking worst stall: {ratio:.4f} (target <= 0.1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trigger", type=int, default=20_000)
    parser.add_argument("--target", type=int, default=5_000)
    parser.add_argument("--prefill", type=float, default=20_000.0, help="tokens/s")
    parser.add_argument("--decode", type=float, default=500.0, help="tokens/s per request")
    parser.add_argument("--blocks", type=int, nargs="*", default=[4, 8])
    parser.add_argument("--agent-step", type=float, default=0.6, help="seconds per model call")
    parser.add_argument("--only", choices=["parallel", "background"])
    args = parser.parse_args()
    # a summary cancelled client-side is still "running" in the simulator when it stops
    logging.getLogger("uvicorn.error").addFilter(
        lambda record: "graceful shutdown" not in record.getMessage()
        and not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError)))
    if args.only != "background":
        print("== 1. parallel vs summary (one compaction, matched decode budget) ==")
        asyncio.run(bench_parallel(args))
    if args.only != "parallel":
        print("== 2. background compaction: agent-visible stall ==")
        asyncio.run(bench_background(args))


if __name__ == "__main__":
    main()
