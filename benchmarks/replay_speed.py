"""Replay speed: replaying the three big Claude Code sessions through every non-LLM strategy,
as a multiple of the floor — tokenizing those sessions once with tiktoken (o200k_base).

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/replay_speed.py [--repeat 5]

Prints the floor, the replay times and their ratios to the floor (best of ``--repeat`` runs,
interleaved so machine load hits both alike), and the median and range of the ratios of
each run to the floor measured just before it (a load burst moves single pairs, not the
median). Loading the files, loading the tiktoken
encoding and the plugin manager happen before timing. The floor is the text extraction
(``dialect.text_of``) plus ``encode_ordinary`` of every message; the pure encode time is
printed too. ``--profile`` writes a cProfile of one replay to ``replay_speed.prof``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("AGENTCOMPACT_SHARED_DATA", ROOT.parent / "shared" / "data"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(DATA / "tiktoken"))

from agentcompact import TiktokenCounter, get_dialect, get_plugin_manager  # noqa: E402
from agentcompact.dialects import Dialect  # noqa: E402  (after the env is set)
from agentcompact.replay import replay  # noqa: E402
from agentcompact.replay._baselines import ContenderSettings, unavailable_reason  # noqa: E402
from agentcompact.trajectory import Trajectory, load  # noqa: E402

SESSIONS = ("258c7280-ae70-4798-800f-63464d01a85d.jsonl",
            "fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl",
            "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl")


def floor(trajs: list[Trajectory], dialect: Dialect, counter: TiktokenCounter
          ) -> tuple[float, float]:
    """(text extraction + encode, encode only) seconds for every message once."""
    encode = counter._enc.encode_ordinary  # noqa: SLF001  (the raw encoder is the floor)
    t0 = time.perf_counter()
    texts = [dialect.text_of(m) for t in trajs for m in t.messages]
    t1 = time.perf_counter()
    for text in texts:
        encode(text)
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1


def timed_replay(trajs: list[Trajectory], strategies: list[str], trigger: int) -> float:
    t0 = time.perf_counter()
    report = replay(trajs, strategies, trigger=trigger, counter=TiktokenCounter())
    elapsed = time.perf_counter() - t0
    assert not report.failures and not report.skipped, (report.failures, report.skipped)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--trigger", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    folder = DATA / "trajectories" / "claude-code"
    if not all((folder / name).exists() for name in SESSIONS):
        print(f"shared data absent: {folder}", file=sys.stderr)
        return 2
    trajs = [load(folder / name)[0] for name in SESSIONS]
    dialect = get_dialect("anthropic")
    counter = TiktokenCounter()
    pm = get_plugin_manager()
    peer = unavailable_reason("cliffcompaction", ContenderSettings(args.trigger, pm=pm)) is None
    ours = ["none", "window", "cliff"]
    runs = {"none,window,cliff": ours}
    if peer:
        runs["+cliffcompaction"] = [*ours, "cliffcompaction"]
    best_floor = best_encode = float("inf")
    best = dict.fromkeys(runs, float("inf"))
    paired: dict[str, list[float]] = {name: [] for name in runs}
    timed_replay(trajs[:1], ["none"], args.trigger)  # warm imports and caches of the code
    for _ in range(args.repeat):
        f, e = floor(trajs, dialect, counter)
        best_floor, best_encode = min(best_floor, f), min(best_encode, e)
        for name, strategies in runs.items():
            if name.startswith("+") and _ > 0:
                continue  # the peer is slow: once is enough
            seconds = timed_replay(trajs, strategies, args.trigger)
            best[name] = min(best[name], seconds)
            paired[name].append(seconds / f)
    tokens = sum(counter.count_texts([dialect.text_of(m) for t in trajs for m in t.messages]))
    calls = sum(1 for t in trajs for _ in t.messages if _.get("role") == "assistant")
    print(f"sessions: 3 Claude Code sessions, {tokens:,} tokens, {calls} assistant messages; "
          f"trigger {args.trigger:,}")
    print(f"floor (text + tiktoken encode, once): {best_floor * 1000:.0f} ms "
          f"(encode alone {best_encode * 1000:.0f} ms)")
    for name, seconds in best.items():
        ratios = sorted(paired[name])
        spread = (f"; per run {statistics.median(ratios):.2f}x median "
                  f"({ratios[0]:.2f}-{ratios[-1]:.2f}x, {len(ratios)} runs)"
                  if len(ratios) > 1 else "")
        print(f"replay [{name}]: {seconds * 1000:.0f} ms = {seconds / best_floor:.2f}x floor"
              f"{spread}")
    if not peer:
        print("cliffcompaction not installed: peer not timed")
    if args.profile:
        cProfile.runctx("timed_replay(trajs, ours, args.trigger)", globals(), locals(),
                        "replay_speed.prof")
        print("profile written to replay_speed.prof")
    return 0


if __name__ == "__main__":
    sys.exit(main())
