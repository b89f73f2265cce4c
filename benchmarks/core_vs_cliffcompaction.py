"""agentcompact cliff vs CliffCompaction 0.1.0, side by side on real trajectories.

Every model call of each session (the messages before each assistant turn) is sent, in
order, through both engines, each incrementally as a live proxy or agent would call it:

- engine time per call (``Engine.compact`` vs ``cliffcompaction.engine.Engine.prepare``);
- the largest context each one sends, in real o200k tokens (the same counter measures
  both outputs), against the trigger;
- input cost with prompt caching (cache read 0.1×, cache write 1.25× the input price);
- whether every output passes ``agentcompact.validate``.

Two input modes: ``objects`` (the same message objects every call, as in-process
integrations pass them) and ``json`` (each call parses a fresh copy, as a server sees them,
and hands it to ``Engine.compact_request``; the parse is not timed).

The two engines are called alternately, call by call, so each runs with the caches the
other (and the measuring in between) left behind, as in a process doing other work.
``--clock cpu`` times with the calling thread's CPU time instead of the wall clock: on a
machine shared with other jobs it leaves out the time the process was not running.
``--breakdown`` adds a line per set splitting our time per call into tokenizing (the
engine's counter: each new message's exact count, and the strategy's counts of its
renderings), the strategy (``compact`` of the compaction calls, its own tokenizing aside)
and the rest of the engine; the tokenizing share is what CliffCompaction's chars/4 does
not pay. It times the counter and the strategy from inside (a few timer reads per call):
its totals run slightly over the plain run's. ``--counter chars`` runs our engine with
chars/4 counting, as CliffCompaction counts: the two engines' own work side by side, the
exact tokenizer's share left out (and its guarantee: the peak and over columns still
measure real o200k tokens). ``--set NAME=JSON`` (repeatable) runs our engine with a cliff
strategy setting changed, to see what one feature costs next to CliffCompaction's time in
the same run (``--set carry_forward_calls=false``; outputs differ from the default's).

Run:  TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/core_vs_cliffcompaction.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from cliffcompaction import dialects as cc_dialects
from cliffcompaction.config import Config
from cliffcompaction.engine import Engine as CliffEngine

from agentcompact import Budget, Engine, StrategySettings, ValidationError, get_dialect, validate
from agentcompact._cachecost import CacheCost
from agentcompact._tokens import MessageMeter, TiktokenCounter
from agentcompact.trajectory import load

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "trajectories"
CLAUDE = sorted((DATA / "claude-code").glob("*-*-*-*-*.jsonl"))
MINI = sorted((DATA / "mini-swe-agent-pr816-deepseek").rglob("*.traj.json"))
CC_DIALECT = {"anthropic": cc_dialects.anthropic.DIALECT,
              "openai_chat": cc_dialects.openai_chat.DIALECT}


@dataclass
class Breakdown:
    """Our time split by where it goes (``--breakdown``), in the benchmark's clock."""

    clock: Any = time.perf_counter
    tokenize: float = 0.0
    strategy: float = 0.0
    depth: int = 0  # > 0 while inside the strategy (its tokenizing counted as tokenizing)
    strategy_tokenize: float = 0.0

    def watch(self, engine: Engine) -> None:
        """Time ``engine``'s counter and strategy from inside (instance attributes: the
        classes stay untouched, so the strategy's own counter checks see the same types)."""
        counter, strategy = engine.counter, engine.strategy
        count, compact = counter.count_texts, strategy.compact

        def count_texts(texts: Any) -> list[int]:
            t0 = self.clock()
            try:
                return count(texts)
            finally:
                spent = self.clock() - t0
                self.tokenize += spent
                if self.depth:
                    self.strategy_tokenize += spent

        def strategy_compact(request: Any) -> Any:
            self.depth += 1
            t0 = self.clock()
            try:
                return compact(request)
            finally:
                self.strategy += self.clock() - t0
                self.depth -= 1

        counter.count_texts = count_texts  # type: ignore[method-assign]
        strategy.compact = strategy_compact


@dataclass
class Side:
    times: list[float] = field(default_factory=list)
    cost: CacheCost = field(default_factory=CacheCost)
    invalid: int = 0
    over: int = 0


def call_points(messages: list[Any], dialect: Any) -> list[int]:
    return [i for i in range(1, len(messages) + 1)
            if i == len(messages) or (dialect.is_model_output(messages[i])
                                      and not dialect.is_model_output(messages[i - 1]))]


def run_session(messages: list[Any], dialect_name: str, trigger: int, mode: str,
                meter: MessageMeter, clock: Any = time.perf_counter,
                breakdown: Breakdown | None = None, counter: str = "tiktoken",
                settings: dict[str, Any] | None = None) -> tuple[Side, Side]:
    dialect = get_dialect(dialect_name)
    strategy = StrategySettings("cliff", options=settings) if settings else "cliff"
    ours = Engine(strategy=strategy, dialect=dialect_name, budget=Budget(trigger_tokens=trigger),
                  counter=counter)
    if breakdown is not None:
        breakdown.watch(ours)
    theirs = CliffEngine(Config(threshold_tokens=trigger))
    cc = CC_DIALECT[dialect_name]
    a, b = Side(), Side()
    blob = orjson.dumps(messages) if mode == "json" else b""
    for c in call_points(messages, dialect):
        context = orjson.loads(blob)[:c] if mode == "json" else messages[:c]
        context2 = orjson.loads(blob)[:c] if mode == "json" else messages[:c]
        t0 = clock()
        if mode == "json":  # a body parsed afresh: the API for it
            sent = ours.compact_request({"messages": context})[1].messages
        else:
            sent = ours.compact(context).messages
        a.times.append(clock() - t0)
        body = {"messages": context2}
        t0 = clock()
        ctx = theirs.prepare(body, cc)
        b.times.append(clock() - t0)
        sent2 = ctx.outgoing_body()["messages"]
        for side, out in ((a, sent), (b, sent2)):
            m = meter.measure(out)
            call = side.cost.add(m.digests, m.tokens)
            side.over += call.tokens > trigger
            try:
                validate(out, dialect, allow_pending=True)
            except ValidationError:
                side.invalid += 1
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["objects", "json", "both"], default="both")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: perf_counter (default); cpu: the thread's CPU time")
    parser.add_argument("--breakdown", action="store_true",
                        help="split our time per call: tokenizing, strategy, rest of engine")
    parser.add_argument("--counter", default="tiktoken",
                        help="our engine's counter (default tiktoken, exact o200k; 'chars' "
                             "counts chars/4 as CliffCompaction does). Outputs are measured "
                             "in o200k tokens either way")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=JSON",
                        help="a cliff strategy setting of our engine (repeatable)")
    args = parser.parse_args()
    settings = {name: json.loads(value) for name, value in
                (item.split("=", 1) for item in args.set)}
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if not DATA.is_dir():
        raise SystemExit(f"shared data absent: {DATA}")
    counter = TiktokenCounter()
    sets = [("claude-code", CLAUDE, 60_000), ("mini-swe-agent", MINI, 30_000)]
    modes = ["objects", "json"] if args.mode == "both" else [args.mode]
    print(f"clock: {args.clock}; our counter: {args.counter}"
          + (f"; cliff settings: {settings}" if settings else ""))
    print(f"{'set':15} {'mode':7} {'calls':>6} {'ms/call ours':>12} {'ms/call cliff':>13} "
          f"{'time ratio':>10} {'peak ours':>9} {'peak cliff':>10} {'trigger':>7} "
          f"{'cost ratio':>10} {'invalid o/c':>11} {'over o/c':>8}")
    for mode in modes:
        for name, files, trigger in sets:
            meters: dict[str, MessageMeter] = {}
            sides = [Side(), Side()]
            peaks = [0, 0]
            costs = [0.0, 0.0]
            split = Breakdown(clock) if args.breakdown else None
            for path in files:
                for traj in load(path):
                    meter = meters.setdefault(traj.dialect, MessageMeter(
                        counter, get_dialect(traj.dialect)))
                    a, b = run_session(traj.messages, traj.dialect, trigger, mode, meter, clock,
                                       split, args.counter, settings)
                    for k, side in enumerate((a, b)):
                        sides[k].times += side.times
                        sides[k].invalid += side.invalid
                        sides[k].over += side.over
                        peaks[k] = max(peaks[k], side.cost.peak)
                        costs[k] += side.cost.cost
            ta = statistics.mean(sides[0].times) * 1000
            tb = statistics.mean(sides[1].times) * 1000
            print(f"{name:15} {mode:7} {len(sides[0].times):6d} {ta:12.3f} {tb:13.3f} "
                  f"{ta / tb:10.3f} {peaks[0]:9,d} {peaks[1]:10,d} {trigger:7,d} "
                  f"{costs[0] / costs[1]:10.3f} {sides[0].invalid:5d}/{sides[1].invalid:<5d} "
                  f"{sides[0].over:3d}/{sides[1].over:<3d}")
            if split is not None:
                calls = len(sides[0].times)
                tok, strat = split.tokenize / calls * 1000, split.strategy / calls * 1000
                own = (split.strategy - split.strategy_tokenize) / calls * 1000
                in_strategy = split.strategy_tokenize / calls * 1000
                rest = ta - tok - own
                print(f"{'':15} {'':7} ours per call: tokenizing {tok:.3f} ms "
                      f"({tok / ta:.0%}; in the strategy {in_strategy:.3f}),"
                      f" strategy besides {own:.3f} ms ({strat:.3f} with its tokenizing), "
                      f"rest of engine {rest:.3f} ms; tokenizing alone is {tok / tb:.3f} of "
                      f"CliffCompaction's time")


if __name__ == "__main__":
    main()
