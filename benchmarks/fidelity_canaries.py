"""Fidelity: what survives compaction, agentcompact cliff vs CliffCompaction 0.1.0, one run.

Every real session with tool calls under ``../shared/data/trajectories`` (Claude Code main
and subagent sessions, mini-swe-agent, SWE-agent, tau-bench), and per family and half the
concatenation of its sessions (up to about 1M tokens), each with many typed canaries
planted at random token depths, positions and carriers (``_fidelity_plant.py``: the
sessions, the tuning / held-out halves, the canaries). Every model call is replayed, in
order, through both engines (incrementally, as a proxy would call them) with default
settings, at a trigger drawn per run and seed from ``--triggers`` (those the run exceeds
1.5 times and is at most 50 times; the smallest only where no other fits).

CliffCompaction counts chars/4 of the body; its threshold is **calibrated per run** so that
its largest real (o200k) request is just under the trigger (or under agentcompact's own
peak, where a single turn is larger than the trigger): the two engines run at a matched
real peak (``_fidelity_peer.py``).

Measured, per half (**held-out first**: the strategy was tuned on the other half only):

- **survival** of each canary in the context sent at the run's last call: in context, and
  for agentcompact one expand away (in an archived original whose handle the context
  names); by canary kind, carrier kind, position in the carrier, depth decile of the
  carrier, compactions the canary went through (each engine's own count), family and
  length band;
- **recall** (``agentcompact.replay``): at every call, the salient items of the next model
  output that appeared earlier, in context (and one expand away);
- **cost with caching**: input priced with prompt caching (cache read 0.1x, write 1.25x),
  agentcompact / CliffCompaction, by family and length band.

Run:  TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/fidelity_canaries.py
      (--quick: one seed, the smallest run of each family and half; --json PATH writes
      every canary's record;
      --set NAME=JSON tries a cliff setting; --jobs N processes)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import random
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agentcompact import Budget, Engine, MemoryArchive, StrategySettings, get_dialect
from agentcompact._tokens import MessageMeter, TiktokenCounter
from agentcompact.replay import ContenderSettings, Sent, replay_trajectory, resolve_price
from agentcompact.strategies._cliff import DEFAULT_LEVELS
from agentcompact.trajectory import Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helper modules beside it

from _fidelity_peer import FastPeer, calibrate, check_equivalence, forget_sizes  # noqa: E402
from _fidelity_plant import HALVES, KINDS, Run, plant, runs, sources  # noqa: E402

TRIGGERS = (6_000, 12_000, 24_000, 60_000)
_HANDLE = re.compile(r"ac-[0-9a-f]{12}")
_BANDS = ((50_000, "<50k"), (150_000, "50k-150k"), (500_000, "150k-500k"), (10**12, ">=500k"))
_RESAMPLES = 2_000  # bootstrap resamples of the runs for the intervals of recall and cost
_AFTER = ((0, "0"), (1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"), (10**9, "9+"))


# --- one run ------------------------------------------------------------------------------
class _Ours:
    """agentcompact's engine as a replay contender, noting its compactions and last send."""

    name = "agentcompact"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.last: list[Any] = []
        self.compactions: list[int] = []  # the history length at each compacting call
        self.levels: dict[int, int] = defaultdict(int)
        self.folds = 0
        self.errors: list[str] = []

    def prepare(self, messages: list[Any]) -> Sent:
        result = self.engine.compact(messages)
        done = [e for e in result.events if e.reason != "fold" and e.fallback != "none"]
        self.folds += sum(1 for e in result.events if e.reason == "fold")
        for event in done:
            self.levels[event.level] += 1
        self.errors += [e.error for e in result.events if e.error]
        if done:
            self.compactions.append(len(messages))
        self.last = result.messages if result.modified else messages
        return Sent(self.last, result.compacted, result.events, None, "compacted")


class _Peer:
    """CliffCompaction at its calibrated threshold, as a replay contender."""

    name = "cliffcompaction"

    def __init__(self, dialect: str, threshold: int) -> None:
        self.peer = FastPeer(dialect, threshold)
        self.last: list[Any] = []
        self.compactions: list[int] = []

    def prepare(self, messages: list[Any]) -> Sent:
        sent, compacted = self.peer.prepare(messages)
        if compacted:
            self.compactions.append(len(messages))
        self.last = sent
        return Sent(sent, compacted, drop_action="compacted")


_CALIBRATED: dict[tuple[str, int], int] = {}  # (run, trigger) -> threshold, per process


def _peer_peak(dialect: str, messages: list[Any], calls: list[int], meter: MessageMeter,
               system: int) -> Callable[[int], int]:
    def peak(threshold: int) -> int:
        peer, top = FastPeer(dialect, threshold), 0
        for at in calls:
            sent, _ = peer.prepare(messages[:at])
            top = max(top, system + sum(meter.measure(sent).tokens))
        return top
    return peak


def measure(job: tuple[Run, int, int, dict[str, Any]]) -> dict[str, Any]:
    """Replay one run with its canaries through both engines; JSON-able figures."""
    run, seed, trigger, options = job
    options = dict(options)
    share = options.pop("target_share", None)  # a what-if: Budget(target_tokens=...)
    patch = options.pop("levels_patch", None)  # a what-if: {"0": {"thinking_max": 600}}
    if patch is not None:
        options["levels"] = tuple(dataclasses.replace(level, **patch.get(str(k), {}))
                                  for k, level in enumerate(DEFAULT_LEVELS))
    least = options.pop("target_floor", 0)  # ... at least this (at most half the trigger)
    target = None
    if share is not None:
        target = max(int(share * trigger), min(least, trigger // 2))
    budget = Budget(trigger_tokens=trigger, target_tokens=target)
    t0 = time.perf_counter()
    forget_sizes()
    dialect = get_dialect(run.dialect)
    meter = MessageMeter(TiktokenCounter(), dialect)
    system = meter.count_text_message(run.system) if run.system else 0
    starts = [s for s in _starts(run.messages, dialect) if s > 0]
    messages, canaries = plant(run, seed, meter.measure(run.messages).tokens, starts[-1])
    calls = [s for s in _starts(messages, dialect) if s > 0]
    archive = MemoryArchive()
    peak_of = _peer_peak(run.dialect, messages, calls, meter, system)
    threshold = _CALIBRATED.get((run.key, trigger))
    limit = trigger
    for _ in range(3):
        if threshold is None:
            threshold, peak = calibrate(peak_of, limit, threshold or trigger)
            if peak > limit and limit == trigger:  # a turn alone over the trigger:
                limit = max(trigger, _our_peak(run, messages, calls, budget, options))
                threshold, _ = calibrate(peak_of, limit, threshold)
            _CALIBRATED[(run.key, trigger)] = threshold
        peer = _Peer(run.dialect, threshold)
        traj = Trajectory(source=run.key, format="bench", dialect=run.dialect,
                          messages=messages, system=run.system)
        ours = _Ours(Engine(StrategySettings("cliff", options={**options, "archive": archive}),
                            run.dialect, budget))
        replay = replay_trajectory(
            traj, ["agentcompact", "cliffcompaction"],
            ContenderSettings(trigger), resolve_price(None, None, run.dialect),
            contenders={"agentcompact": ours, "cliffcompaction": peer})
        ran = replay.runs
        if max(ran["cliffcompaction"].tokens) <= max(limit, max(ran["agentcompact"].tokens)):
            break
        threshold = None  # the canaries moved its peak: calibrate on this history
        limit = trigger
    return {
        "key": run.key, "family": run.family, "half": run.half, "sessions": run.sessions,
        "tokens": replay.history_tokens, "trigger": trigger, "seed": seed,
        "threshold": threshold, "calls": len(calls), "seconds": time.perf_counter() - t0,
        "ours": _figures(ran["agentcompact"], ours.compactions, ours.levels, ours.folds,
                         ours.errors),
        "peer": _figures(ran["cliffcompaction"], peer.compactions),
        "canaries": _canaries(canaries, dialect, ours, peer, archive),
    }


def _starts(messages: list[Any], dialect: Any) -> list[int]:
    is_model = dialect.is_model_output
    return [i for i in range(len(messages))
            if is_model(messages[i]) and (i == 0 or not is_model(messages[i - 1]))]


def _our_peak(run: Run, messages: list[Any], calls: list[int], budget: Budget,
              options: dict[str, Any]) -> int:
    engine = Engine(StrategySettings("cliff", options={**options, "archive": False}),
                    run.dialect, budget)
    return max(engine.compact(messages[:at]).tokens_after for at in calls)


def _figures(run: Any, compactions: list[int], levels: dict[int, int] | None = None,
             folds: int = 0, errors: list[str] | None = None) -> dict[str, Any]:
    tokens, cached = sum(run.tokens), sum(run.cached)
    reach = run.expand_count
    return {"peak": max(run.tokens), "tokens": tokens, "cached": cached,
            "cost": cached * 0.1 + (tokens - cached) * 1.25,
            "needed": run.recall_count.needed, "present": run.recall_count.present,
            "reachable": reach.present if reach is not None else None,
            "by_kind": {k: list(v) for k, v in (run.recall_count.by_kind or {}).items()},
            "compactions": len(compactions), "levels": dict(levels or {}), "folds": folds,
            "errors": len(errors or [])}


def _canaries(canaries: Iterable[Any], dialect: Any, ours: _Ours, peer: _Peer,
              archive: MemoryArchive) -> list[dict[str, Any]]:
    ours_text = "\n".join(dialect.text_of(m) for m in ours.last)
    peer_text = "\n".join(dialect.text_of(m) for m in peer.last)
    originals = [item.text for h in sorted(set(_HANDLE.findall(ours_text)))
                 if (item := archive.get(h)) is not None]
    ours_ids, peer_ids = {id(m) for m in ours.last}, {id(m) for m in peer.last}
    out = []
    for c in canaries:
        inside = c.text in ours_text
        out.append({"kind": c.kind, "carrier": c.carrier, "where": c.where,
                    "depth": round(c.depth, 4), "ours": inside,
                    "expand": inside or any(c.text in t for t in originals),
                    "peer": c.text in peer_text,
                    "verbatim": [id(c.message) in ours_ids, id(c.message) in peer_ids],
                    "ours_after": sum(1 for at in ours.compactions if at > c.index),
                    "peer_after": sum(1 for at in peer.compactions if at > c.index)})
    return out


# --- the report ---------------------------------------------------------------------------
def _band(tokens: int) -> str:
    return next(name for top, name in _BANDS if tokens < top)


def _bucket(n: int) -> str:
    return next(name for top, name in _AFTER if n <= top)


def _rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**c, "family": r["family"], "band": _band(r["tokens"]), "run": r["key"]}
            for r in results for c in r["canaries"]]


def _rate(rows: list[dict[str, Any]], key: str) -> str:
    hit = sum(1 for r in rows if r[key])
    return f"{hit}/{len(rows)} {hit / len(rows):4.0%}" if rows else "-"


def _table(title: str, rows: list[dict[str, Any]], group: Callable[[dict[str, Any]], str],
           order: Iterable[str] | None = None) -> list[str]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[group(r)].append(r)
    names = [n for n in (order or sorted(groups)) if n in groups]
    out = [f"| {title} | agentcompact | + expand | CliffCompaction |", "|---|---|---|---|"]
    for name in names:
        g = groups[name]
        mark = " **<**" if sum(r["ours"] for r in g) < sum(r["peer"] for r in g) else ""
        out.append(f"| {name} | {_rate(g, 'ours')}{mark} | {_rate(g, 'expand')} | "
                   f"{_rate(g, 'peer')} |")
    out.append(f"| all | {_rate(rows, 'ours')} | {_rate(rows, 'expand')} | "
               f"{_rate(rows, 'peer')} |")
    return out


def _sums(results: list[dict[str, Any]], side: str, key: str) -> float:
    return sum(r[side][key] or 0 for r in results)


def _recall(results: list[dict[str, Any]], side: str, key: str = "present") -> float:
    """The share of ``side``'s needed items present (``key="reachable"``: one expand away)."""
    return _sums(results, side, key) / max(_sums(results, side, "needed"), 1)


def _recall_gap(results: list[dict[str, Any]]) -> float:
    return _recall(results, "ours") - _recall(results, "peer")


def _cost_ratio(results: list[dict[str, Any]]) -> float:
    return _sums(results, "ours", "cost") / max(_sums(results, "peer", "cost"), 1)


def _summary(results: list[dict[str, Any]]) -> list[str]:
    needed = int(_sums(results, "ours", "needed"))
    out = [f"cost with caching, agentcompact / CliffCompaction: {_cost_ratio(results):.3f}",
           f"recall in context: agentcompact {_recall(results, 'ours'):.3f} (one expand away "
           f"{_recall(results, 'ours', 'reachable'):.3f}), CliffCompaction "
           f"{_recall(results, 'peer'):.3f} ({needed} items needed)"]
    gap_low, gap_high = _interval(results, _recall_gap)
    cost_low, cost_high = _interval(results, _cost_ratio)
    out.append(f"recall gap (agentcompact - CliffCompaction) {_recall_gap(results):+.3f}, "
               f"95% interval {gap_low:+.3f} to {gap_high:+.3f}; cost ratio 95% interval "
               f"{cost_low:.3f} to {cost_high:.3f} ({_RESAMPLES} bootstrap resamples of the "
               "runs, their seeds together)")
    over = [r for r in results if r["peer"]["peak"] > max(r["trigger"], r["ours"]["peak"])]
    ours_peak = max(r["ours"]["peak"] / r["trigger"] for r in results)
    peer_peak = max(r["peer"]["peak"] / r["trigger"] for r in results)
    out.append(f"largest request / trigger: agentcompact {ours_peak:.3f}, CliffCompaction "
               f"{peer_peak:.3f} (calibrated; {len(over)} runs over the matched peak)")
    levels: dict[str, int] = defaultdict(int)
    for r in results:
        for level, n in r["ours"]["levels"].items():
            levels[str(level)] += n
    out.append(f"compactions: agentcompact {int(_sums(results, 'ours', 'compactions'))} "
               f"(by level {dict(sorted(levels.items()))}, folds "
               f"{int(_sums(results, 'ours', 'folds'))}, fallbacks "
               f"{int(_sums(results, 'ours', 'errors'))}), CliffCompaction "
               f"{int(_sums(results, 'peer', 'compactions'))}")
    return out


def _interval(results: list[dict[str, Any]], figure: Callable[[list[dict[str, Any]]], float]
              ) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of ``figure`` over resamples of the runs (with
    replacement; a run's seeds go together, they replay the same sessions): seeded."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        runs[r["key"]].append(r)
    groups = [runs[k] for k in sorted(runs)]
    rng = random.Random(0)
    values = sorted(figure([r for g in rng.choices(groups, k=len(groups)) for r in g])
                    for _ in range(_RESAMPLES))
    return values[int(0.025 * _RESAMPLES)], values[int(0.975 * _RESAMPLES) - 1]


def _by(results: list[dict[str, Any]], key: Callable[[dict[str, Any]], str]) -> list[str]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[key(r)].append(r)
    out = ["| group | runs | canaries: agentcompact / CliffCompaction | recall | cost ratio |",
           "|---|---|---|---|---|"]
    for name in sorted(groups):
        g = groups[name]
        rows = _rows(g)
        out.append(f"| {name} | {len(g)} | {_rate(rows, 'ours')} / {_rate(rows, 'peer')} | "
                   f"{_recall(g, 'ours'):.3f} / {_recall(g, 'peer'):.3f} | "
                   f"{_cost_ratio(g):.3f} |")
    return out


def _shortfalls(results: list[dict[str, Any]]) -> list[str]:
    """Cells (family x band x kind, and each of them alone) where agentcompact keeps fewer,
    with the paired counts (canaries only agentcompact keeps / only CliffCompaction keeps)
    and McNemar's exact two-sided p: how often a difference this large in either direction
    comes from canaries that either engine keeps with even odds."""
    rows = _rows(results)
    cells: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for r in rows:
        for key in (("kind", r["kind"]), ("family", r["family"], r["kind"]),
                    ("band", r["band"], r["kind"]), ("family", r["family"]),
                    ("band", r["band"])):
            cell = cells[key]
            cell[0] += r["ours"]
            cell[1] += r["peer"]
            cell[2] += 1
            cell[3] += r["ours"] and not r["peer"]
            cell[4] += r["peer"] and not r["ours"]
    return [f"{' / '.join(k)}: {a}/{n} vs {b}/{n} (alone {x} / {y}, p {_mcnemar(x, y):.2f})"
            for k, (a, b, n, x, y) in sorted(cells.items()) if a < b]


def _mcnemar(x: int, y: int) -> float:
    """Exact two-sided McNemar p for ``x`` and ``y`` discordant pairs."""
    n = x + y
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(x, y) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def report(results: list[dict[str, Any]], runs_by_half: dict[str, list[str]]) -> str:
    out: list[str] = []
    for half in ("held-out", "tuning"):
        mine = [r for r in results if r["half"] == half]
        if not mine:
            continue
        rows = _rows(mine)
        seeds = sorted({r["seed"] for r in mine})
        out += ["", f"## {half} half: {len(runs_by_half[half])} runs x {len(seeds)} seeds, "
                    f"{len(rows)} canaries", ""]
        out += _summary(mine) + [""]
        out += _table("canary", rows, lambda r: r["kind"], KINDS) + [""]
        out += _table("carrier", rows, lambda r: r["carrier"]) + [""]
        out += _table("position", rows, lambda r: r["where"], ("start", "middle", "end")) + [""]
        out += _table("depth decile", rows, lambda r: f"{min(int(r['depth'] * 10), 9) + 1:>2}")
        out += [""] + _table("compactions since (own count)", rows,
                             lambda r: _bucket(r["ours_after"]),
                             [name for _, name in _AFTER]) + [""]
        out += _table("family", rows, lambda r: r["family"]) + [""]
        out += _table("length band", rows, lambda r: r["band"],
                      [name for _, name in _BANDS]) + [""]
        out += _by(mine, lambda r: r["family"]) + [""] + _by(mine, lambda r: _band(r["tokens"]))
        short = _shortfalls(mine)
        out += ["", "cells where agentcompact keeps fewer canaries: "
                + ("; ".join(short) if short else "none")]
    return "\n".join(out)


# --- driving ------------------------------------------------------------------------------
def allowed_triggers(tokens: int, turn: int, triggers: tuple[int, ...]) -> list[int]:
    """The triggers a run of ``tokens`` whose largest turn is ``turn`` tokens is replayed
    at: it exceeds the trigger 1.5 times and at most 50 times, and its largest turn is at
    most half the trigger (CliffCompaction keeps at least one whole turn: a larger one
    leaves no threshold at which its requests stay under the trigger). The smallest
    trigger only where no other fits (SWE-agent's function-calling runs: 16k tokens)."""
    fits = [t for t in triggers if 1.5 * t <= tokens <= 50 * t and turn <= t // 2]
    return [t for t in fits if t != triggers[0]] or fits


def _jobs(chosen: list[Run], seeds: int, triggers: tuple[int, ...], options: dict[str, Any],
          tokens: dict[str, int], turns: dict[str, int]
          ) -> list[tuple[Run, int, int, dict[str, Any]]]:
    jobs = []
    for run in chosen:
        allowed = allowed_triggers(tokens[run.key], turns[run.key], triggers)
        for seed in range(seeds):
            trigger = random.Random(f"trigger:{seed}:{run.key}").choice(allowed)
            jobs.append((run, seed, trigger, options))
    # the largest runs first (the pool's stragglers are small), a run's seeds in one worker
    jobs.sort(key=lambda j: (-tokens[j[0].key], j[0].key, j[1]))
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--triggers", type=int, nargs="+", default=list(TRIGGERS))
    parser.add_argument("--quick", action="store_true",
                        help="one seed, the smallest run of each family and half (under 60k "
                             "tokens)")
    parser.add_argument("--max-runs", type=int, default=None, help="the first N runs only")
    parser.add_argument("--half", choices=HALVES, default=None, help="one half only")
    parser.add_argument("--jobs", type=int, default=min(2, multiprocessing.cpu_count()))
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=JSON",
                        help="a cliff strategy setting to try (repeatable); target_share="
                             "X sets the Budget's target to X times the trigger, levels_patch="
                             "{\"0\": {\"thinking_max\": 600}} changes fields of the levels")
    parser.add_argument("--list", action="store_true", help="list the runs and halves, then stop")
    args = parser.parse_args()
    found = sources()
    if not found:
        raise SystemExit("shared data absent: ../shared/data/trajectories")
    options = {n: json.loads(v) for n, v in (item.split("=", 1) for item in args.set)}
    triggers = tuple(sorted(args.triggers))
    meters: dict[str, MessageMeter] = {}

    def count(dialect: str, messages: list[Any]) -> int:
        meter = meters.setdefault(dialect, MessageMeter(TiktokenCounter(), get_dialect(dialect)))
        return sum(meter.measure(messages).tokens)

    chosen = runs(found, count, int(1.5 * triggers[0]))
    tokens = {r.key: count(r.dialect, r.messages) for r in chosen}
    turns = {r.key: largest_turn(r, meters) for r in chosen}
    left_out = [r for r in chosen if not allowed_triggers(tokens[r.key], turns[r.key], triggers)]
    chosen = [r for r in chosen if r not in left_out]
    if args.half:
        chosen = [r for r in chosen if r.half == args.half]
    if args.quick:  # the smallest run of each family and half under 60k tokens
        small = sorted((r for r in chosen if tokens[r.key] < 60_000), key=lambda r: tokens[r.key])
        chosen = [next(r for r in small if (r.family, r.half) == group)
                  for group in sorted({(r.family, r.half) for r in small})]
        args.seeds = 1
    if args.max_runs:
        chosen = chosen[: args.max_runs]
    by_half = {h: [r.key for r in chosen if r.half == h] for h in HALVES}
    print(_listing(found, chosen, tokens))
    if left_out:
        print("not replayed alone (a turn over half of every trigger they reach; their "
              "sessions are in the concatenations): " + "; ".join(
                  f"{r.key} ({tokens[r.key] // 1000}k, turn {turns[r.key] // 1000}k)"
                  for r in left_out))
    if args.list:
        return
    check_equivalence(chosen[0].dialect, chosen[0].messages)
    jobs = _jobs(chosen, args.seeds, triggers, options, tokens, turns)
    t0 = time.perf_counter()
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = list(pool.imap_unordered(measure, jobs))
    else:
        results = [measure(job) for job in jobs]
    print(f"\n{len(jobs)} replays in {time.perf_counter() - t0:.0f} s ({args.jobs} processes; "
          f"triggers {', '.join(f'{t:,}' for t in triggers)}; default settings"
          f"{'' if not options else ' but ' + ', '.join(args.set)})")
    print(report(results, by_half))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def largest_turn(run: Run, meters: dict[str, MessageMeter]) -> int:
    """Tokens of the run's largest turn (a model output and the messages up to the next)."""
    meter = meters[run.dialect]
    is_model = meter.dialect.is_model_output
    largest = current = 0
    previous = False
    for m, n in zip(run.messages, meter.measure(run.messages).tokens):
        model = is_model(m)
        if model and not previous:
            current = 0
        current += n
        largest = max(largest, current)
        previous = model
    return largest


def _listing(found: list[Any], chosen: list[Run], tokens: dict[str, int]) -> str:
    out = [f"{len(found)} sessions with tool calls; {len(chosen)} runs"]
    for half in HALVES:
        keys = [f"{r.key} ({tokens[r.key] // 1000}k)" for r in chosen if r.half == half]
        out.append(f"{half}: {'; '.join(keys)}")
    return "\n".join(out)


if __name__ == "__main__":
    main()
