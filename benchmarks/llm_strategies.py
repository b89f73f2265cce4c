"""LLM strategies: parallel vs summary wall time, and background compaction's stall.

Both run against ``agentcompact.testing`` on loopback (real HTTP through
the ``openai`` SDK), whose latency model charges each request ``ttft + input/prefill_rate``
then ``output/decode_rate``, concurrent requests overlapping as on a real server. Replies
are long filler text cut by each request's ``max_tokens``, so every request decodes its
whole output budget (the worst case, and what makes decode volumes comparable).

1. parallel vs summary: one compaction of the same history; ``summary`` sends one request
   with the whole output budget, ``parallel`` sends N block requests whose budgets sum to
   at most the same budget. Prints wall times, the decode volumes, the ratio, and how
   close parallel gets to its floor (the latency model's time for its slowest block).
2. background: an agent loop (each model call ``--agent-step`` seconds, one turn per step)
   from a fresh session (just over the target) through ``--cycles`` cliffs of the
   blocking strategy; the stall is the time the agent waits on compaction before a model
   call. Blocking ``summary`` engine vs ``BackgroundCompactor`` over the same engine:
   fixed soft threshold, adaptive start (growth rate × measured latency), and adaptive
   with two staggered compactions in flight. The first cycle is reported apart ("cold":
   no summary latency measured yet, so adaptive starts at the soft threshold).

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/llm_strategies.py

``--real-url URL`` (with ``--real-model``, ``--real-window``) runs both against a real
OpenAI-compatible server instead — sized for a small local model serving one request at
a time (``../shared/tools/local-llm``): a short history, small output budgets, agent steps
of ``--real-agent-step`` seconds (simulated: the agent's own model is not this server)::

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/llm_strategies.py \
        --real-url http://127.0.0.1:8089/v1 --real-model local
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Any

import openai  # imported up front so its import time is not in the timings

from agentcompact import (
    BackgroundCompactor,
    Budget,
    Engine,
    StrategySettings,
    SummaryCall,
    hookimpl,
    new_plugin_manager,
)
from agentcompact.testing import (
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
    return Engine(strategy=StrategySettings(strategy, options={**client, **settings}),
                  plugins=new_plugin_manager(),
                  budget=Budget(trigger_tokens=trigger, target_tokens=target))


def turns_just_over(trigger: int) -> int:
    """Fewest turns whose history is over ``trigger`` (one crossing: one compaction)."""
    counter = Engine(budget=Budget(trigger_tokens=trigger))
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


async def agent_loop(compact: Any, msgs: list[dict[str, Any]], steps: int, step_s: float,
                     turn: Any = None, cold: Any = None) -> tuple[list[float], list[bool]]:
    """Each step: compact (stall measured), a model call (``step_s``), one more turn.
    Returns the stalls and, per step, whether it was still "cold" (``cold()``)."""
    stalls, colds = [], []
    k = sum(1 for m in msgs if m["role"] == "assistant")
    for _ in range(steps):
        colds.append(bool(cold()) if cold else False)
        t0 = time.perf_counter()
        await compact(msgs)
        stalls.append(time.perf_counter() - t0)
        await asyncio.sleep(step_s)
        msgs = msgs + (turn or history)(1, start=k)
        k += 1
    return stalls, colds


BG_MODES = {
    "fixed soft": {"adaptive": False},
    "adaptive": {},
    "adaptive x2": {"max_pending": 2},
}


def stall_line(mode: str, stalls: list[float], colds: list[bool], requests: int) -> str:
    warm = [s for s, c in zip(stalls, colds, strict=True) if not c] or [0.0]
    cold = [s for s, c in zip(stalls, colds, strict=True) if c] or [0.0]
    split = (f" (cold cycle {max(cold):6.3f} s, later {max(warm):6.3f} s)"
             if any(colds) else "")
    return (f"{mode:12s}: worst stall {max(stalls):6.3f} s{split}, total {sum(stalls):6.2f} s; "
            f"{requests} summarizer requests")


async def run_background(make: Any, steps: int, step_s: float, start: list[dict[str, Any]],
                         soft: int, wait_s: float, modes: dict[str, dict[str, Any]],
                         turn: Any = None, idle: Any = None) -> dict[str, float]:
    """Blocking vs each background mode over the same agent loop; worst stall by mode
    (for background modes: after the cold cycle)."""
    worst: dict[str, float] = {}
    for mode in ("blocking", *modes):
        if idle is not None:
            await idle()
        async with make() as (engine, requests):
            if mode == "blocking":
                stalls, colds = await agent_loop(engine.acompact, list(start), steps, step_s,
                                                 turn)
                worst[mode] = max(stalls)
            else:
                bg = BackgroundCompactor(engine, soft_trigger_tokens=soft, wait_s=wait_s,
                                         **modes[mode])
                stalls, colds = await agent_loop(
                    bg.compact, list(start), steps, step_s, turn,
                    cold=lambda bg=bg: bg.stats.latency_s is None)
                await bg.aclose()
                warm = [s for s, c in zip(stalls, colds, strict=True) if not c]
                worst[mode] = max(warm or [0.0])
            print(stall_line(mode, stalls, colds, requests()))
            if mode != "blocking":
                st = bg.stats
                print(f"{'':14s}started {st.started} (early {st.early_starts}), swapped "
                      f"{st.swapped}, waited {st.waited} ({st.wait_s:.2f} s), fell back "
                      f"{st.fell_back} (at once {st.skipped_waits}), cancelled {st.cancelled}; "
                      f"growth {st.rate_tokens_s:.0f} tok/s, latency {st.latency_s or 0:.2f} s")
    for mode in modes:
        print(f"{mode} / blocking worst stall after the cold cycle: "
              f"{worst[mode] / worst['blocking']:.4f} (target <= 0.1)")
    return worst


async def bench_background(args: argparse.Namespace) -> None:
    latency = LatencyModel(ttft_s=0.05, prefill_tokens_per_s=args.prefill,
                           decode_tokens_per_s=args.decode)
    soft = (args.trigger + args.target) // 2
    start = turns_just_over(args.target)
    per_cycle = turns_just_over(args.trigger) - start
    steps = per_cycle * args.cycles + 2
    for step_s in args.agent_step:
        print(f"-- agent: model call {step_s:.2f} s per step; target {args.target}, soft "
              f"threshold {soft}, trigger {args.trigger}; {steps} steps from {start} turns "
              f"(~{per_cycle} turns per cycle)")

        @asynccontextmanager
        async def make() -> Any:
            sim = UpstreamSim(Script(then=filler), latency=latency)
            with serve(sim) as server:
                yield (make_engine("summary", server.base_url, args.trigger, args.target),
                       lambda: len(sim.requests))

        await run_background(make, steps, step_s, history(start), soft, 30.0, BG_MODES)


# --- against a real model ---------------------------------------------------------------
class CallLog:
    """Summarizer calls of one run (latency, usage) through ``log_summary_call``."""

    def __init__(self) -> None:
        self.calls: list[SummaryCall] = []

    @hookimpl
    def agentcompact_log_summary_call(self, call: SummaryCall) -> None:
        self.calls.append(call)

    def usage(self, key: str) -> int:
        return sum(int(c.usage.get(key) or 0) for c in self.calls)


def real_engine(args: argparse.Namespace, strategy: str, log: CallLog | None = None,
                **settings: Any) -> Engine:
    pm = new_plugin_manager()
    if log is not None:
        pm.register(log)
    options = {"timeout": 600, "max_retries": 0, "context_window": args.real_window, **settings}
    return Engine(strategy=StrategySettings(strategy, options=options, base_url=args.real_url,
                                            model=args.real_model, api_key="local"),
                  plugins=pm, budget=Budget(trigger_tokens=args.real_trigger,
                                            target_tokens=args.real_target))


REAL_STEPS = [
    ("pytest tests/test_io.py -x -q", "FAILED tests/test_io.py::test_read_{k} - "
     "FileNotFoundError: data/input_{k}.csv\n1 failed, {n} passed"),
    ("grep -n open src/io/reader.py", "{k}:    with open(path, 'rb') as fh:  # reader v{k}"),
    ("sed -i 's/rb/r/' src/io/reader.py", "(no output)"),
    ("make build TARGET=app{k}", "gcc -O2 -o build/app{k} src/app.c\nbuild/app{k}: ok "
     "({n} warnings)"),
    ("python -m app --check {k}", "check {k}: {n} records, 0 errors, took 0.{k}s"),
]


def real_turn(turns: int, start: int = 0) -> list[dict[str, Any]]:
    """Short, varied tool turns (repetitive filler makes a small model loop)."""
    msgs: list[dict[str, Any]] = [] if start else [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing build. Never touch setup.cfg."}]
    for k in range(start, start + turns):
        cmd, out = REAL_STEPS[k % len(REAL_STEPS)]
        call = {"id": f"call_{k}", "type": "function", "function": {
            "name": "bash", "arguments": json.dumps({"cmd": cmd.format(k=k, n=3 * k + 7)})}}
        msgs.append({"role": "assistant", "content": f"Step {k}: run `{cmd.split()[0]}`.",
                     "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{k}",
                     "content": out.format(k=k, n=3 * k + 7)})
    return msgs


async def real_idle(args: argparse.Namespace) -> None:
    """Wait until the one-at-a-time server is idle (a 1-token request queues behind
    anything still running, e.g. a summary cancelled client-side)."""
    client = openai.AsyncOpenAI(base_url=args.real_url, api_key="local", timeout=600)
    await client.chat.completions.create(model=args.real_model, max_tokens=1,
                                         messages=[{"role": "user", "content": "ok"}])
    await client.close()


def real_turns_over(args: argparse.Namespace, tokens: int) -> int:
    counter = Engine(budget=Budget(trigger_tokens=args.real_trigger))
    n = 1
    while counter.count(real_turn(n)) <= tokens:
        n += 1
    return n


async def bench_real_parallel(args: argparse.Namespace) -> None:
    msgs = real_turn(real_turns_over(args, args.real_trigger))
    print(f"history: {len(msgs)} messages, {Engine().count(msgs)} tokens; trigger "
          f"{args.real_trigger}, target {args.real_target}; {args.real_url} ({args.real_model})")
    runs = [("summary", {})] + [("parallel", {"blocks": n, "max_concurrency": n})
                                for n in args.blocks]
    walls: dict[str, float] = {}
    for strategy, settings in runs:
        await real_idle(args)
        log = CallLog()
        engine = real_engine(args, strategy, log, **settings)
        t0 = time.perf_counter()
        result = await engine.acompact(msgs)
        wall = time.perf_counter() - t0
        event = result.event
        assert event is not None and result.compacted
        name = strategy if strategy == "summary" else f"parallel x{settings['blocks']}"
        walls[name] = wall
        serial = sum(c.latency_s for c in log.calls)
        status = "ok" if event.error is None and not event.errors else (
            f"FELL BACK: {event.error or event.errors}")
        print(f"{name:11s}: {len(log.calls)} requests, prompt {log.usage('prompt_tokens'):5d} + "
              f"output {log.usage('completion_tokens'):4d} tokens, wall {wall:6.1f} s, sum of "
              f"request times {serial:6.1f} s; {result.tokens_before} -> "
              f"{result.tokens_after} tokens; {status}")
        if strategy == "summary":
            text = engine.dialect.text_of(result.messages[result.head_len])
            print("  summary excerpt: " + " ".join(text.split())[:400])
    for name, wall in walls.items():
        if name != "summary":
            print(f"{name} vs summary: speed-up x{walls['summary'] / wall:.2f} (one request at "
                  "a time: the blocks run back to back, each re-reading the system prompt)")


async def bench_real_background(args: argparse.Namespace) -> None:
    soft = (args.real_trigger + args.real_target) // 2
    start = real_turns_over(args, args.real_target)
    per_cycle = real_turns_over(args, args.real_trigger) - start
    steps = per_cycle * args.cycles + 2
    print(f"-- agent: model call {args.real_agent_step:.1f} s per step (simulated); target "
          f"{args.real_target}, soft {soft}, trigger {args.real_trigger}; {steps} steps from "
          f"{start} turns (~{per_cycle} turns per cycle)")

    @asynccontextmanager
    async def make() -> Any:
        log = CallLog()
        yield real_engine(args, "summary", log), lambda: len(log.calls)

    modes = {"adaptive": {}}  # one request at a time: no staggering; keep the run short
    await run_background(make, steps, args.real_agent_step, real_turn(start), soft,
                         args.real_wait, modes, turn=real_turn,
                         idle=lambda: real_idle(args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trigger", type=int, default=20_000)
    parser.add_argument("--target", type=int, default=5_000)
    parser.add_argument("--prefill", type=float, default=20_000.0, help="tokens/s")
    parser.add_argument("--decode", type=float, default=500.0, help="tokens/s per request")
    parser.add_argument("--blocks", type=int, nargs="*", default=None,
                        help="parallel block counts (default 4 8; real: 2 4)")
    parser.add_argument("--agent-step", type=float, nargs="*", default=[0.6, 0.45],
                        help="seconds per model call (one background run each)")
    parser.add_argument("--cycles", type=int, default=2, help="cliffs of the blocking run")
    parser.add_argument("--only", choices=["parallel", "background"])
    real = parser.add_argument_group("real model")
    real.add_argument("--real-url", help="OpenAI-compatible base URL (with /v1)")
    real.add_argument("--real-model", default="local")
    real.add_argument("--real-window", type=int, default=8192)
    real.add_argument("--real-trigger", type=int, default=1_000)
    real.add_argument("--real-target", type=int, default=500)
    real.add_argument("--real-agent-step", type=float, default=6.0)
    real.add_argument("--real-wait", type=float, default=60.0)
    args = parser.parse_args()
    # a summary cancelled client-side is still "running" in the simulator when it stops
    logging.getLogger("uvicorn.error").addFilter(
        lambda record: "graceful shutdown" not in record.getMessage()
        and not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError)))
    if args.real_url:
        args.blocks = args.blocks or [2, 4]
        if args.only != "background":
            print("== 1. real model: parallel vs summary (one compaction) ==")
            asyncio.run(bench_real_parallel(args))
        if args.only != "parallel":
            print("== 2. real model: background compaction, agent-visible stall ==")
            asyncio.run(bench_real_background(args))
        return
    args.blocks = args.blocks or [4, 8]
    if args.only != "background":
        print("== 1. parallel vs summary (one compaction, matched decode budget) ==")
        asyncio.run(bench_parallel(args))
    if args.only != "parallel":
        print("== 2. background compaction: agent-visible stall ==")
        asyncio.run(bench_background(args))


if __name__ == "__main__":
    main()
