"""``agentcompact rl demo``: the closed-loop CompactionRL demo on a CPU (torch, transformers).

A tiny policy learns to carry a fact through its own summaries: rollouts by the live policy
through the engine's summary strategy (the policy writing its summaries), rows in memory,
PPO/GRPO with the project's loss; the reward curve of each arm (summaries trained, not
trained, cliff) is printed and, with matplotlib, plotted. See docs/rl-loop.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import AgentCompactError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
               ) -> argparse.ArgumentParser:
    """Add the ``rl`` command (``rl demo``) to ``subparsers``; returns its parser."""
    p = subparsers.add_parser("rl", help="closed-loop RL with compaction (demo on a CPU)",
                              description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="rl_command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="train a tiny policy to carry a fact through its own "
                          "summaries; print and plot the reward curves")
    from .demo import ARMS, DemoConfig

    d = DemoConfig()
    demo.add_argument("--seeds", default=",".join(map(str, d.seeds)),
                      help="comma-separated seeds (default %(default)s)")
    demo.add_argument("--arms", default=",".join(d.arms),
                      help=f"comma-separated arms of {', '.join(ARMS)} (default: all)")
    demo.add_argument("--iterations", type=int, default=d.iterations,
                      help="RL iterations per arm (default %(default)s)")
    demo.add_argument("--groups", type=int, default=d.groups,
                      help="tasks per iteration (default %(default)s)")
    demo.add_argument("--samples", type=int, default=d.samples,
                      help="rollouts per task: the GRPO group (default %(default)s)")
    demo.add_argument("--keys", type=int, default=d.keys,
                      help="candidate keys: chance is 1/keys (default %(default)s)")
    demo.add_argument("--threads", type=int, default=d.threads,
                      help="torch threads (default %(default)s: tiny ops gain nothing from "
                      "more, and the machine may be shared)")
    demo.add_argument("--plot", type=Path, default=Path("rl-demo.png"),
                      help="PNG of the reward curves, with matplotlib (default %(default)s)")
    demo.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    demo.add_argument("--json", type=Path, default=None,
                      help="also write the curves as JSON (rewards per iteration per arm)")
    demo.set_defaults(rl_run=_demo)
    return p


def _demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, plot, run_demo

    try:
        config = DemoConfig(
            seeds=tuple(int(s) for s in args.seeds.split(",") if s.strip()),
            arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()),
            iterations=args.iterations, groups=args.groups, samples=args.samples,
            keys=args.keys, threads=args.threads)
    except ValueError:
        print("agentcompact rl demo: error: --seeds takes integers, e.g. 0,1,2",
              file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"agentcompact rl demo needs torch and transformers ({exc}): "
              "pip install 'agentcompact[rl,export]'", file=sys.stderr)
        return 2
    report = run_demo(config, progress=lambda line: print(line, flush=True))
    print(f"\nchance = 1/{config.keys} = {report.chance:.3f}; final = mean reward of the "
          "last quarter of the iterations")
    for arm in config.arms:
        for curve in (c for c in report.curves if c.arm == arm):
            print(f"{arm:8s} seed {curve.seed}: first {curve.rewards[0]:.2f}, final "
                  f"{curve.final:.2f}, {curve.wall_s:.0f} s, {curve.sampled_tokens} tokens "
                  f"sampled, largest micro-batch {curve.peak_batch_tokens} tokens")
    print(f"warm starts: {', '.join(f'{s:.0f} s' for s in report.warm_start_s.values())}; "
          f"total {report.wall_s:.0f} s")
    if args.json is not None:
        args.json.write_text(report.to_json())
        print(f"curves: {args.json}")
    if not args.no_plot:
        if plot(report, args.plot):
            print(f"plot: {args.plot}")
        else:
            print("no plot: matplotlib is not installed (pip install 'agentcompact[plot]')",
                  file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``agentcompact rl COMMAND``; returns the exit status."""
    command = getattr(args, "rl_run", None)
    if command is None:
        print("agentcompact rl: choose a command: demo", file=sys.stderr)
        return 2
    try:
        return int(command(args))
    except AgentCompactError as exc:
        print(f"agentcompact rl: error: {exc}", file=sys.stderr)
        return 1
