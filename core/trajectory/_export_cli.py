"""``agentcompact export``: runs and trajectory files → segment rows for RL training.

RUN may be a recorded run (a folder holding ``events.jsonl``, or such a file) or a
trajectory file / folder the loaders read (Claude Code, SWE-agent, mini-swe-agent,
tau-bench, plain message lists); those are converted to events first
(``agentcompact.trajectory._importers``), so existing runs become training data without
re-running them. ``cli.py`` wires ``add_parser`` / ``run``; ``python -m
agentcompact.trajectory._export_cli`` runs it on its own.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import AgentCompactError
from .export import (
    ADVANTAGES,
    DEFAULT_MASKED_STOP_REASONS,
    MAX_AUTO_WORKERS,
    UNREWARDED,
    ExportOptions,
    export_runs,
)

__all__ = ["add_parser", "main", "run"]

logger = logging.getLogger(__name__)
_DESCRIPTION = ("Export recorded runs (a folder holding events.jsonl) and agent trajectory "
                "files (Claude Code, SWE-agent, mini-swe-agent, tau-bench, message lists) as "
                "one RL training row per compaction segment, for verl, TRL and SkyRL. See "
                "docs/rl-export.md.")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
               ) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "export", help="export runs as RL training rows (Parquet/JSONL)",
        description=_DESCRIPTION,
    )
    configure(p)
    return p


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run folder / events.jsonl, or trajectory file / folder")
    p.add_argument("--out", required=True, type=Path, help="output folder (new or empty)")
    p.add_argument("--tokenizer", required=True,
                   help="the trainer's tokenizer: Hugging Face name or local path")
    p.add_argument("--format", dest="fmt", choices=("parquet", "jsonl"), default="parquet")
    p.add_argument("--advantage", choices=ADVANTAGES, default="grpo",
                   help="advantage estimator (gae-* use V=0: no critic; default grpo)")
    p.add_argument("--rows-per-shard", type=int, default=10_000,
                   help="segment rows per shard (cut at group boundaries)")
    p.add_argument("--summary-trained", action="store_true", default=None,
                   help="treat every summary as written by the policy (mask 1, SUPO-style)")
    p.add_argument("--mask-stop-reasons", default=",".join(sorted(DEFAULT_MASKED_STOP_REASONS)),
                   help="comma-separated stop reasons whose episodes get mask_episode")
    p.add_argument("--gamma", type=float, default=1.0, help="GAE discount (gae-* modes)")
    p.add_argument("--lam", type=float, default=1.0, help="GAE lambda (gae-* modes)")
    p.add_argument("--messages", action="store_true",
                   help="store each segment's chat messages in messages_json (debugging)")
    p.add_argument("--keep-events", type=Path, default=None,
                   help="write the events converted from trajectory files here")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes exporting episodes (the rows are the same for any N); "
                   f"default: the available CPUs, at most {MAX_AUTO_WORKERS}, fewer for a "
                   "small export; 1: all in this process")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="export the episodes on Ray Data (extra 'ray'): ADDRESS of a cluster "
                   "(auto, ray://host:10001); alone: RAY_ADDRESS, else a local Ray. The run "
                   "logs must be at the same path on every node")
    p.add_argument("--no-prompts", action="store_true",
                   help="leave prompt_json / tools_json out (verl's parquet needs them)")
    p.add_argument("--recompute-logprobs", metavar="MODEL", default=None,
                   help="fill rollout_logprobs with this Hugging Face causal LM (name or path) "
                   "where the server reported none")
    p.add_argument("--recompute-device", default="cpu", help="device of --recompute-logprobs")
    p.add_argument("--recompute-batch-tokens", type=int, default=16384,
                   help="tokens per forward pass of --recompute-logprobs")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="longest trainable row (prompt + response tokens); rows are never "
                   "truncated: see --overlong")
    p.add_argument("--overlong", choices=("mask", "drop"), default="mask",
                   help="an episode with a row over --max-tokens: mask it (zero loss, kept) "
                   "or drop it (not written); counted in the manifest")
    p.add_argument("--unrewarded", choices=UNREWARDED, default="mask-group",
                   help="an episode without a reward: mask its whole group (zero loss) or "
                   "drop it (not written, left out of its group's statistics); never counted "
                   "as reward 0; counted in the manifest")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _options(args: argparse.Namespace) -> ExportOptions:
    reasons = frozenset(r.strip() for r in args.mask_stop_reasons.split(",") if r.strip())
    return ExportOptions(
        fmt=args.fmt, advantage=args.advantage, rows_per_shard=args.rows_per_shard,
        summary_trained=args.summary_trained, mask_stop_reasons=reasons, gamma=args.gamma,
        lam=args.lam, keep_messages=args.messages,
        progress=not args.no_progress and sys.stderr.isatty(), workers=args.workers,
        keep_prompts=not args.no_prompts, recompute_logprobs=args.recompute_logprobs,
        recompute_device=args.recompute_device,
        recompute_batch_tokens=args.recompute_batch_tokens, max_tokens=args.max_tokens,
        overlong=args.overlong, unrewarded=args.unrewarded,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``agentcompact export``; returns the exit status (0 ok, 1 error)."""
    empty = next((run for run in args.runs if _holds_nothing(Path(run))), None)
    if empty is not None:
        print(f"agentcompact export: error: {empty} holds no run: give a folder with the "
              "recorder's events.jsonl, or trajectory files (.jsonl, .json, .traj)",
              file=sys.stderr)
        return 1
    try:
        if args.ray is not None:
            from .ray_export import export_runs_ray

            manifest = export_runs_ray(args.runs, args.out, args.tokenizer, _options(args),
                                       address=args.ray or None,
                                       keep_events=args.keep_events)
        else:
            manifest = export_runs(args.runs, args.out, args.tokenizer, _options(args),
                                   keep_events=args.keep_events)
    except AgentCompactError as exc:
        print(f"agentcompact export: error: {exc}", file=sys.stderr)
        return 1
    c = manifest["counts"]
    if not c["episodes"]:
        print(f"agentcompact export: error: no episodes in {', '.join(args.runs)}: the files "
              "hold no model call (a run is what the recorder writes, or an agent's "
              "trajectory)", file=sys.stderr)
        return 1
    print(f"exported {c['segments']} segments of {c['episodes']} episodes in {c['groups']} "
          f"groups ({c['loss_tokens']} loss tokens) to {args.out}")
    for torn in manifest["sources"]["torn_tails"]:
        print(f"warning: {torn}", file=sys.stderr)
    return 0


def _holds_nothing(path: Path) -> bool:
    """A folder with neither an ``events.jsonl`` nor any trajectory file in it."""
    if not path.is_dir() or (path / "events.jsonl").is_file():
        return False
    return not any(p.is_file() and p.name.endswith((".jsonl", ".json", ".traj"))
                   for p in path.rglob("*"))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentcompact.trajectory._export_cli RUN... --out DIR --tokenizer T``."""
    parser = argparse.ArgumentParser(prog="agentcompact export", description=_DESCRIPTION)
    configure(parser)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
