"""Where the tokens of the context go right after each cliff compaction.

Replays the shared Claude Code sessions (canaries planted at one depth, as
``fidelity_canaries.py`` does) through a default cliff engine at a 60k trigger and, at
every call that compacted, splits the context sent into the head, the compaction message
(by block: assistant text, kept tool results, user text, result notes on call lines, skim
lines) and the kept turns; prints the mean over those calls, in tokens (o200k), and the
kept turns at the calls that only folded (``Engine`` fold: the newest turn's large tool
outputs truncated once the agent has read them).

Run:  TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/cliff_breakdown.py
      [--target N] [--sessions N] [--depth 0.5]
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fidelity_canaries as fc  # noqa: E402

from agentcompact import Budget, Engine, MemoryArchive, StrategySettings, get_dialect  # noqa: E402
from agentcompact._tokens import MessageMeter, TiktokenCounter  # noqa: E402
from agentcompact.trajectory import load  # noqa: E402

_SKIM = re.compile(r"\[turn \d+ · [^\n]*?expand ac-[0-9a-f]{12}\]")
_NOTE = re.compile(r" ?\[→ [^\n]*?expand ac-[0-9a-f]{12}\]")
_BLOCKS = ("user", "assistant", "tool result")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=int, default=None, help="default: the Budget's")
    parser.add_argument("--sessions", type=int, default=len(fc.CLAUDE))
    parser.add_argument("--depth", type=float, default=0.5)
    args = parser.parse_args()
    dialect = get_dialect("anthropic")
    counter = TiktokenCounter()
    meter = MessageMeter(counter, dialect)

    def count(text: str) -> int:
        return counter.count_texts([text])[0] if text else 0

    total: dict[str, float] = defaultdict(float)
    n = folds = 0
    for path in fc.CLAUDE[: args.sessions]:
        messages = copy.deepcopy(load(path)[0].messages)
        fc.plant(messages, args.depth, "x")
        engine = Engine(strategy=StrategySettings("cliff", options={"archive": MemoryArchive()}),
                        dialect="anthropic",
                        budget=Budget(trigger_tokens=60_000, target_tokens=args.target))
        for c in fc.call_points(messages, dialect):
            result = engine.compact(messages[:c])
            out = result.messages
            at = next((i for i, m in enumerate(out) if dialect.is_synthetic(m)), None)
            if at is None or not result.compacted:
                continue
            tokens = meter.measure(out).tokens
            if all(e.reason == "fold" for e in result.events):  # the call after, once read
                folds += 1
                total["kept turns, folded"] += sum(tokens[at + 1:])
                continue
            total["head"] += sum(tokens[:at])
            total["compaction message"] += tokens[at]
            total["kept turns"] += sum(tokens[at + 1:])
            text = dialect.text_of(out[at])
            total["  skim lines"] += count("\n".join(_SKIM.findall(text)))
            total["  result notes"] += count("".join(_NOTE.findall(text)))
            for block in _NOTE.sub("", _SKIM.sub("", text)).split("\n\n["):
                label = block.split("]", 1)[0].lstrip("[")
                total[f"  {label if label in _BLOCKS else 'other'}"] += count(block)
            n += 1
    print(f"{n} compactions; mean tokens right after one:")
    for key in ("head", "compaction message", "  assistant", "  tool result", "  user",
                "  result notes", "  skim lines", "  other", "kept turns"):
        print(f"{key:22} {total[key] / max(n, 1):8,.0f}")
    print(f"{folds} folds (the call after a compaction whose newest turn held a large tool "
          f"output); kept turns after one: {total['kept turns, folded'] / max(folds, 1):,.0f}")


if __name__ == "__main__":
    main()
