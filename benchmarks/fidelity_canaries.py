"""Fidelity: what survives compaction, agentcompact cliff vs CliffCompaction 0.1.0, one run.

Typed canaries are planted in the real Claude Code sessions (the three main sessions,
each 116k-144k tokens) at 10, 30, 50, 70 and 90% depth, one run per (session, depth):

- ``safety rule``: a rule appended to the first user message;
- ``user rule``: a rule the user adds later (a text block beside tool results);
- ``path``: a file path in a tool result; ``number``: a measured figure in a tool result;
- ``command``: a shell command in a Bash tool call's ``command``;
- ``decision``: a decision in the assistant's text.

Every model call of the session is sent, in order, through both engines (incrementally, as
a proxy would) at a 60k trigger with default settings. A canary *survives* when its string
is in the text of the context sent at the session's last call; for agentcompact it is *one
expand away* when it is in an archived original whose handle is in that context.

Recall: at every call after the first compaction, the salient items of the next assistant
message (``agentcompact.replay._recall``: paths, identifiers, commands, numbers, errors)
that appeared earlier must be in the context sent ("in context"), or, for agentcompact, in
an archived original whose handle is in it ("or one expand away").

Cost: input cost with prompt caching (read 0.1x, write 1.25x), summed over the calls,
as a ratio agentcompact / CliffCompaction.

Run:  TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/fidelity_canaries.py
      (--depths 0.5 --sessions 1 for a quick look; --target N to try a target)

What-if rules for the fold (``Engine._fold``; they replace the engine's private ``_read`` and
``_FOLD_TOKENS`` for this run, to measure a rule before it goes into the engine):
``--fold-after K`` folds after K model outputs instead of 1; ``--fold-unquoted`` counts only
the model outputs that quote none of the folded outputs' items new to the history (what
``extract_items`` finds in them and not in the messages before them); ``--fold-tokens N``
sets the folded size; ``--fold-after 0`` turns the fold off.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cliffcompaction import dialects as cc_dialects
from cliffcompaction.config import Config
from cliffcompaction.engine import Engine as CliffEngine

import agentcompact._engine as engine_module
from agentcompact import Budget, Engine, MemoryArchive, StrategySettings, get_dialect
from agentcompact._cachecost import CacheCost
from agentcompact._tokens import MessageMeter, TiktokenCounter
from agentcompact.replay import extract_items
from agentcompact.trajectory import load

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "trajectories"
CLAUDE = sorted((DATA / "claude-code").glob("*-*-*-*-*.jsonl"))
KINDS = ("safety rule", "user rule", "path", "command", "number", "decision")
_HANDLE = re.compile(r"ac-[0-9a-f]{12}")
VERBOSE = False


def canaries(tag: str) -> dict[str, str]:
    return {
        "safety rule": f"Safety rule: never run git push --force on the branch release-{tag}.",
        "user rule": f"From now on do not edit anything under legacy_{tag}/ and keep "
                     f"functions under {40 + len(tag)} lines.",
        "path": f"/srv/app/config/settings_{tag}.yaml",
        "command": f"python -m scripts.migrate_{tag} --dry-run",
        "number": f"p99_latency_ms={7000 + sum(map(ord, tag)) % 1000}",
        "decision": f"Decision: we keep the adapter pattern for payments_{tag} instead of "
                    "subclassing.",
    }


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        message["content"] = content = [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _nearest(messages: list[Any], at: int, test: Any) -> int | None:
    for d in range(len(messages)):
        for i in (at + d, at - d):
            if 0 <= i < len(messages) and test(messages[i]):
                return i
    return None


def plant(messages: list[Any], depth: float, tag: str) -> dict[str, str]:
    """Plant the canaries of ``tag`` into ``messages`` (in place); returns kind -> string."""
    texts = canaries(tag)
    at = int(len(messages) * depth)
    first = _blocks(messages[0])
    first.append({"type": "text", "text": texts["safety rule"]})

    def has(kind: str, role: str) -> Any:
        return lambda m: m.get("role") == role and any(
            isinstance(b, dict) and b.get("type") == kind for b in _blocks(m))

    def bash(m: dict[str, Any]) -> bool:
        return m.get("role") == "assistant" and any(
            isinstance(b, dict) and b.get("type") == "tool_use"
            and isinstance(b.get("input"), dict) and "command" in b["input"] for b in _blocks(m))

    i = _nearest(messages, at, has("tool_result", "user"))
    if i is not None:
        _blocks(messages[i]).append({"type": "text", "text": texts["user rule"]})
    for kind, line in (("path", f"wrote {texts['path']}"), ("number", texts["number"])):
        j = _nearest(messages, at + (3 if kind == "number" else -3), has("tool_result", "user"))
        if j is None:
            continue
        block = next(b for b in _blocks(messages[j]) if b.get("type") == "tool_result")
        content = block.get("content")
        if isinstance(content, list):
            content.append({"type": "text", "text": line})
        else:
            block["content"] = f"{content or ''}\n{line}"
    k = _nearest(messages, at, bash)
    if k is not None:
        use = next(b for b in _blocks(messages[k]) if b.get("type") == "tool_use"
                   and isinstance(b.get("input"), dict) and "command" in b["input"])
        use["input"] = {**use["input"], "command": f"{texts['command']} && "
                                                  f"{use['input']['command']}"}
    m = _nearest(messages, at, has("text", "assistant"))
    if m is not None:
        block = next(b for b in _blocks(messages[m]) if b.get("type") == "text")
        block["text"] = f"{block.get('text', '')}\n\n{texts['decision']}"
    return texts


def call_points(messages: list[Any], dialect: Any) -> list[int]:
    return [i for i in range(1, len(messages) + 1)
            if i == len(messages) or (dialect.is_model_output(messages[i])
                                      and not dialect.is_model_output(messages[i - 1]))]


@dataclass
class Tally:
    survived: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    expandable: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    planted: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    needed: int = 0
    present: int = 0
    reachable: int = 0
    cost: float = 0.0
    calls: int = 0
    tokens: int = 0
    written: int = 0
    compactions: int = 0
    levels: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    folds: int = 0


def fold_rule(after: int, unquoted: bool) -> Any:
    """A replacement for ``Engine._read``: the folds are due once ``after`` model outputs
    (runs of model-output messages: one per call) follow them, counting, if ``unquoted``,
    only the outputs that quote none of the folded outputs' new items (a quoting one
    restarts the count). A function of ``messages[:n]`` alone, monotone in ``n``: replay
    and incremental calls fold at the same call."""
    cache: dict[str, frozenset[str]] = {}

    def new_items(dialect: Any, view: Any, i: int) -> frozenset[str]:
        key = view.chain[i]  # the digest of messages[:i + 1]
        if key not in cache:
            earlier = _text(dialect, view.messages[:i])
            cache[key] = frozenset(item for item in extract_items(dialect.text_of(
                view.messages[i])) if item not in earlier)
        return cache[key]

    def read(self: Any, view: Any, state: Any, n: int) -> bool:
        if after <= 0:
            return False
        dialect, msgs = self._dialect, view.messages
        folds = [i for i, _ in state.entry.folds if i < n]
        items: set[str] = set()
        if unquoted:
            for i in folds:
                items |= new_items(dialect, view, i)
        count, quoted, previous = 0, False, False
        for k in range(max(i for i, _ in state.entry.folds) + 1, n + 1):
            model = k < n and dialect.is_model_output(msgs[k])
            if model:
                quoted = quoted or any(item in dialect.text_of(msgs[k]) for item in items)
            elif previous:  # a model output ended
                count = 0 if quoted else count + 1
                quoted = False
                if count >= after:
                    return True
            previous = model
        return False
    return read


def _text(dialect: Any, messages: Any) -> str:
    return "\n".join(dialect.text_of(m) for m in messages)


def _reachable(item: str, handles: set[str], archive: MemoryArchive) -> bool:
    for handle in handles:
        found = archive.get(handle)
        if found is not None and item in found.text:
            return True
    return False


def run(messages: list[Any], trigger: int, target: int | None, meter: MessageMeter,
        texts: dict[str, str], ours: Tally, theirs: Tally,
        settings: dict[str, Any] | None = None) -> None:
    dialect = get_dialect("anthropic")
    archive = MemoryArchive()
    engine = Engine(strategy=StrategySettings("cliff",
                                              options={**(settings or {}), "archive": archive}),
                    dialect="anthropic",
                    budget=Budget(trigger_tokens=trigger, target_tokens=target))
    peer = CliffEngine(Config(threshold_tokens=trigger))
    costs = [CacheCost(), CacheCost()]
    points = call_points(messages, dialect)
    last_sent: list[str] = ["", ""]
    compacted = [False, False]
    handles: set[str] = set()
    for c in points:
        result = engine.compact(messages[:c])
        for event in result.events:
            if event.reason == "fold":  # the newest turn's large outputs, once read
                ours.folds += 1
            else:
                ours.levels[event.level] += 1
        sent = result.messages
        sent2 = peer.prepare({"messages": copy.deepcopy(messages[:c])},
                             cc_dialects.anthropic.DIALECT).outgoing_body()["messages"]
        for k, out in enumerate((sent, sent2)):
            m = meter.measure(out)
            costs[k].add(m.digests, m.tokens)
        compacted[0] |= result.compacted
        compacted[1] |= len(sent2) < c
        if c < len(messages) and any(compacted):
            outputs = extract_items(dialect.text_of(messages[c]))
            earlier = _text(dialect, messages[:c])
            needed = [item for item in outputs if item in earlier]
            for k, (out, tally) in enumerate(((sent, ours), (sent2, theirs))):
                if not compacted[k]:
                    continue
                sent_text = _text(dialect, out)
                if k == 0:
                    handles = set(_HANDLE.findall(sent_text))
                for item in needed:
                    tally.needed += 1
                    inside = item in sent_text
                    tally.present += inside
                    tally.reachable += inside or (k == 0 and _reachable(item, handles, archive))
        last_sent = [_text(dialect, sent), _text(dialect, sent2)]
    handles = set(_HANDLE.findall(last_sent[0]))
    for kind, string in texts.items():
        for k, tally in enumerate((ours, theirs)):
            tally.planted[kind] += 1
            inside = string in last_sent[k]
            tally.survived[kind] += inside
            tally.expandable[kind] += inside or (k == 0 and _reachable(string, handles, archive))
            if VERBOSE and not inside:
                print(f"  lost by {('agentcompact', 'CliffCompaction')[k]}: {kind} {string!r}")
    for cost, tally in zip(costs, (ours, theirs)):
        tally.cost += cost.cost
        tally.calls += len(cost.calls)
        tally.tokens += cost.total_tokens
        tally.written += cost.total_tokens - cost.cached_tokens
        # a compaction rewrites a prefix: a call whose cached part is below the last's
        tally.compactions += sum(1 for a, b in zip(cost.calls, cost.calls[1:])
                                 if b.tokens < a.tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trigger", type=int, default=60_000)
    parser.add_argument("--target", type=int, default=None, help="default: the Budget's")
    parser.add_argument("--depths", type=float, nargs="*", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--sessions", type=int, default=len(CLAUDE))
    parser.add_argument("--verbose", action="store_true", help="name each canary lost")
    parser.add_argument("--breakdown", action="store_true",
                        help="where the cost goes: mean context, tokens written, compactions")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=JSON",
                        help="a cliff strategy setting to try (repeatable)")
    parser.add_argument("--fold-after", type=int, default=1, metavar="K",
                        help="what-if: fold after K model outputs (0: no fold)")
    parser.add_argument("--fold-unquoted", action="store_true",
                        help="what-if: count only outputs quoting none of the folded items")
    parser.add_argument("--fold-tokens", type=int, default=None, metavar="N",
                        help="what-if: the folded size (default: the engine's)")
    args = parser.parse_args()
    global VERBOSE
    VERBOSE = args.verbose
    if not CLAUDE:
        raise SystemExit(f"shared data absent: {DATA}")
    settings = {name: json.loads(value) for name, value in
                (item.split("=", 1) for item in args.set)}
    meter = MessageMeter(TiktokenCounter(), get_dialect("anthropic"))
    ours, theirs = Tally(), Tally()
    if args.fold_after != 1 or args.fold_unquoted:
        engine_module.Engine._read = fold_rule(args.fold_after,  # type: ignore[method-assign]
                                               args.fold_unquoted)
    if args.fold_tokens is not None:
        engine_module._FOLD_TOKENS = args.fold_tokens
    per_session, recall = [], []
    for path in CLAUDE[: args.sessions]:
        before = ours.cost, theirs.cost
        seen = ours.present, ours.needed, theirs.present, theirs.needed
        original = load(path)[0].messages
        for depth in args.depths:
            messages = copy.deepcopy(original)
            tag = f"{path.stem[:4]}{int(depth * 100):02d}"
            texts = plant(messages, depth, tag)
            run(messages, args.trigger, args.target, meter, texts, ours, theirs, settings)
        ratio = (ours.cost - before[0]) / (theirs.cost - before[1])
        per_session.append(f"{path.stem[:8]} {ratio:.3f}")
        recall.append(f"{path.stem[:8]} {(ours.present - seen[0]) / (ours.needed - seen[1]):.3f}"
                      f" vs {(theirs.present - seen[2]) / max(theirs.needed - seen[3], 1):.3f}")
    target = Budget(trigger_tokens=args.trigger, target_tokens=args.target).target
    print(f"trigger {args.trigger:,}, target {target:,}; {args.sessions} sessions x "
          f"{len(args.depths)} depths")
    print(f"{'canary':12} {'agentcompact':>13} {'+ expand':>9} {'CliffCompaction':>16}")
    totals = [0, 0, 0, 0]
    for kind in KINDS:
        n = ours.planted[kind]
        a, e, b = ours.survived[kind], ours.expandable[kind], theirs.survived[kind]
        totals = [totals[0] + a, totals[1] + e, totals[2] + b, totals[3] + n]
        print(f"{kind:12} {a:>6}/{n:<3} {a / n:4.0%} {e / n:8.0%} {b:>9}/{n:<3} {b / n:4.0%}")
    a, e, b, n = totals
    print(f"{'all':12} {a:>6}/{n:<3} {a / n:4.0%} {e / n:8.0%} {b:>9}/{n:<3} {b / n:4.0%}")
    print(f"recall in context: agentcompact {ours.present / ours.needed:.3f} "
          f"(or one expand away {ours.reachable / ours.needed:.3f}; {ours.needed} needed), "
          f"CliffCompaction {theirs.present / max(theirs.needed, 1):.3f} "
          f"({theirs.needed} needed)")
    print(f"cost with caching, agentcompact / CliffCompaction: {ours.cost / theirs.cost:.3f}")
    print(f"agentcompact compactions by level: {dict(sorted(ours.levels.items()))}, "
          f"folds {ours.folds}")
    if args.breakdown:
        for name, tally in (("agentcompact", ours), ("CliffCompaction", theirs)):
            print(f"{name:16} calls {tally.calls}, mean context "
                  f"{tally.tokens / max(tally.calls, 1):,.0f} tokens, written "
                  f"{tally.written:,} ({tally.written / max(tally.tokens, 1):.1%}), "
                  f"context shrank {tally.compactions} times")
        print(f"cost with caching by session: {', '.join(per_session)}")
        print(f"recall in context by session (vs CliffCompaction): {', '.join(recall)}")


if __name__ == "__main__":
    main()
