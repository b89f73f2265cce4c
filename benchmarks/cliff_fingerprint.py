"""A digest of every output of the default cliff engine over the shared trajectories.

Output-preserving optimisations of the cliff rendering must leave this digest unchanged:
every model call of every Claude Code session (60k trigger) and mini-swe-agent run (30k
trigger) is sent in order through a default ``Engine(strategy="cliff")``, as
``benchmarks/core_vs_cliffcompaction.py`` does, and the digest covers each output message
list (canonical JSON), each compaction event's level, sizes and dropped-item report, and
every original the archive stores, in the order stored (handle, text, skim line; an item
put again under a stored handle is left as it is, as the ``Archive`` protocol says).

Run:  TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/cliff_fingerprint.py
      (prints one digest per set and one over both; ``--expect HEX`` exits 1 on a mismatch)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import xxhash

from agentcompact import ArchivedItem, Budget, Engine, MemoryArchive, StrategySettings, get_dialect
from agentcompact.trajectory import load

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "trajectories"
SETS = (("claude-code", lambda: sorted((DATA / "claude-code").glob("*-*-*-*-*.jsonl")), 60_000),
        ("mini-swe-agent",
         lambda: sorted((DATA / "mini-swe-agent-pr816-deepseek").rglob("*.traj.json")), 30_000))


class _Recording(MemoryArchive):
    """A memory archive that feeds every item it stores, in order, into a digest."""

    def __init__(self, h: xxhash.xxh3_128) -> None:
        super().__init__()
        self._h = h

    def put_many(self, items: Iterable[ArchivedItem]) -> None:
        items = list(items)
        stored, new = self._scopes.get("", {}), set()
        for item in items:
            if item.handle not in stored and item.handle not in new:
                new.add(item.handle)
                self._h.update(orjson.dumps([item.handle, item.text, item.skim]))
        super().put_many(items)


def call_points(messages: list[Any], dialect: Any) -> list[int]:
    return [i for i in range(1, len(messages) + 1)
            if i == len(messages) or (dialect.is_model_output(messages[i])
                                      and not dialect.is_model_output(messages[i - 1]))]


def session_digest(messages: list[Any], dialect_name: str, trigger: int,
                   h: xxhash.xxh3_128, settings: dict[str, Any] | None = None) -> int:
    """Feed every output of one session into ``h``; returns the number of calls."""
    dialect = get_dialect(dialect_name)
    archive = _Recording(h)
    engine = Engine(strategy=StrategySettings("cliff",
                                              options={**(settings or {}), "archive": archive}),
                    dialect=dialect_name, budget=Budget(trigger_tokens=trigger))
    points = call_points(messages, dialect)
    for c in points:
        result = engine.compact(messages[:c])
        h.update(orjson.dumps(result.messages, option=orjson.OPT_SORT_KEYS))
        h.update(orjson.dumps([result.tokens_after, result.head_len, result.cut]))
        for event in result.events:
            h.update(orjson.dumps([event.level, event.tokens_after, event.cut, event.head_len,
                                   event.fallback, event.error,
                                   [(d.index, d.role, d.action, d.tokens, d.kind)
                                    for d in event.dropped]]))
    return len(points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--expect", help="the overall digest this run must reproduce")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=JSON",
                        help="a cliff strategy setting (repeatable)")
    args = parser.parse_args()
    settings = {name: json.loads(value) for name, value in
                (item.split("=", 1) for item in args.set)}
    if not DATA.is_dir():
        raise SystemExit(f"shared data absent: {DATA}")
    overall = xxhash.xxh3_128()
    for name, files, trigger in SETS:
        h = xxhash.xxh3_128()
        calls = 0
        for path in files():
            for traj in load(path):
                calls += session_digest(traj.messages, traj.dialect, trigger, h, settings)
        print(f"{name:15} {calls:5d} calls  {h.hexdigest()}")
        overall.update(h.digest())
    print(f"{'all':15} {'':11} {overall.hexdigest()}")
    if args.expect and args.expect != overall.hexdigest():
        print("MISMATCH: the outputs changed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
