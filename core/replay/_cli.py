"""``agentcompact replay PATH...``: replay recorded sessions through strategies side by side.

    agentcompact replay ~/.claude/projects --strategy cliff,window,none \\
        --trigger 100000 --report replay.html --json replay.json

PATH is a session file or a folder (walked recursively): Claude Code ``*.jsonl``, Codex
rollouts, mini-swe-agent / SWE-agent trajectories, tau-bench results, plain message JSON.
Also runnable as ``python -m agentcompact.replay._cli``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .._pluginmanager import registry
from ..errors import AgentCompactError
from ..trajectory._loaders import Trajectory, iter_trajectories
from ._baselines import BASELINES, LLM_STRATEGIES
from ._codex import is_codex_rollout, load_codex_rollout
from ._replay import ReplayReport, count_calls, replay

__all__ = ["add_parser", "default_strategies", "load_sessions", "main", "run"]

_SUFFIXES = (".jsonl", ".json", ".traj")
_HELP = "replay recorded agent sessions through compaction strategies, side by side"
_DESCRIPTION = """\
Replay recorded agent sessions through compaction strategies, side by side: calls,
compactions, peak context, prompt-cache share, cost, recall of needed context.

  agentcompact replay ~/.claude/projects --report replay.html
  agentcompact replay runs/ --strategy none,window,cliff --trigger 100000 --json out.json

PATH is a session file or a folder (walked recursively): Claude Code *.jsonl, Codex
rollouts, mini-swe-agent / SWE-agent trajectories, tau-bench results, plain message JSON.
See docs/replay.md for the figures."""


def default_strategies() -> list[str]:
    """Baselines, every registered strategy, the peer, and the LLM strategies."""
    registered = [n for n in registry().strategy_names() if n not in LLM_STRATEGIES]
    registered.sort(key=lambda n: (n != "cliff", n))
    return ["none", "window", *registered, "cliffcompaction", *LLM_STRATEGIES]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``replay`` subcommand to an ``argparse`` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "replay", help=_HELP, description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(parser)
    parser.set_defaults(run=run)
    return parser


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="session files or folders")
    parser.add_argument("--strategy", default=None,
                        help="comma-separated: none, window, cliffcompaction and registered "
                             "strategies (default: all; LLM ones need --summarizer-url)")
    parser.add_argument("--trigger", type=int, default=100_000,
                        help="compact when the context is over this many tokens (100000)")
    parser.add_argument("--target", type=int, default=None,
                        help="tokens to compact down to (default: half the trigger)")
    parser.add_argument("--price", default=None,
                        help="anthropic, openai or a JSON/TOML price file (default: by dialect)")
    parser.add_argument("--model", default=None, help="model row of the price table")
    parser.add_argument("--dialect", default=None,
                        help="dialect of plain message files (default: guessed)")
    parser.add_argument("--counter", default=None,
                        help="token counter: tiktoken (o200k_base, default), tiktoken:ENC, "
                             "hf:PATH, chars")
    parser.add_argument("--report", metavar="HTML", help="write the HTML report here")
    parser.add_argument("--json", metavar="JSON", dest="json_out",
                        help="write every figure as JSON here")
    parser.add_argument("--summarizer-url", default=None,
                        help="OpenAI-compatible base URL (with /v1) for summary/parallel")
    parser.add_argument("--summarizer-model", default=None, help="summarizer model name")
    parser.add_argument("--summarizer-window", type=int, default=None, metavar="TOKENS",
                        help="the summarizer model's context window (prompts are fitted to "
                             "it; default 32,000 or AGENTCOMPACT_SUMMARIZER_WINDOW)")
    parser.add_argument("--summarizer-timeout", type=float, default=None, metavar="S",
                        help="seconds per summarizer attempt (default 60 or "
                             "AGENTCOMPACT_SUMMARIZER_TIMEOUT); the API key comes from "
                             "AGENTCOMPACT_SUMMARIZER_API_KEY")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def load_sessions(paths: list[str], dialect: str | None = None,
                  on_skip: Any = None) -> list[Trajectory]:
    """Trajectories from files and folders (walked recursively, sorted).

    Codex rollouts are read by :mod:`.codex` (checked first: their lines would otherwise
    pass for Responses items), every other file by
    :func:`agentcompact.trajectory.iter_trajectories`. ``on_skip(path, reason)`` hears
    about files left out.
    """
    files: list[Path] = []
    for item in map(Path, paths):
        if item.is_dir():
            files.extend(sorted(p for p in item.rglob("*")
                                if p.is_file() and p.name.endswith(_SUFFIXES)))
        else:
            files.append(item)  # a missing file is reported by iter_trajectories
    out: list[Trajectory] = []
    others: list[Path] = []
    for file in files:
        if not is_codex_rollout(file):
            others.append(file)
            continue
        try:
            out.append(load_codex_rollout(file))
        except AgentCompactError as exc:
            if on_skip is not None:
                on_skip(file, str(exc))
    out.extend(iter_trajectories(others, dialect=dialect, strict=False, on_skip=on_skip))
    return out


def _si(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def _tables(report: ReplayReport) -> list[Table]:
    """Two tables that each fit 80 columns: what it costs, and what the model keeps."""
    totals = report.totals()
    base = totals.get("none", {}).get("cost_usd")
    cost = _new_table(f"replay of {len(report.trajectories)} sessions · trigger "
                      f"{report.trigger:,} · prices {report.price.model}",
                      ("calls", "compact.", "peak", "input", "cached", "cost", "×none"))
    kept = _new_table("what the model still sees",
                      ("recall", "+expand", "user rules", "ms/call", "errors"))
    for name, t in totals.items():
        cost.add_row(escape(name), f"{t['calls']:,}", f"{t['compactions']:,}",
                     _si(t["peak_tokens"]), _si(t["total_input_tokens"]),
                     f"{t['cached_share']:.1%}", f"${t['cost_usd']:,.2f}",
                     f"{t['cost_usd'] / base:.2f}" if base else "–")
        expand = t.get("recall_with_expand")
        rules = t.get("user_rules", {}).get("survival")
        kept.add_row(escape(name), _share(t["recall"]), _share(expand), _share(rules),
                     f"{t['ms_per_call']:.2f}",
                     f"[red]{t['errors']:,}[/red]" if t["errors"] else "0")
    return [cost, kept]


def _new_table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=escape(title), box=box.SIMPLE_HEAD, pad_edge=False,
                  title_justify="left")
    table.add_column("strategy", overflow="fold", max_width=18)
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    return table


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


_LEGEND = ("peak: largest context sent · cached: share of input tokens read from the "
           "provider's prompt cache · ×none: cost against sending every history in full · "
           "recall: needed items still in context · +expand: or one expand away · user "
           "rules: rule-like user messages kept · see docs/replay.md")


def _fail(line: str, status: int = 2) -> int:
    print(f"agentcompact replay: {line}", file=sys.stderr)
    return status


def _missing_paths(paths: list[str]) -> str | None:
    """One line naming the first path that is not there (a broken link says so)."""
    for name in paths:
        path = Path(name).expanduser()
        if path.exists():
            continue
        if path.is_symlink():
            return (f"{name} is a broken symbolic link (to {os.readlink(path)}); give a "
                    "session file or a folder of them")
        return (f"{name}: no such file or folder; give a session file or a folder of them "
                "(e.g. ~/.claude/projects)")
    return None


def _errors(report: ReplayReport) -> dict[str, list[str]]:
    """Per strategy, the calls on which it failed and fell back (to cliff, for the LLM
    strategies), so a table that looks like cliff's is never a silent fallback."""
    out: dict[str, list[str]] = {}
    for traj in report.trajectories:
        for name, run in traj.runs.items():
            out.setdefault(name, []).extend(f"{traj.source}: {e}" for e in run.errors)
    return {name: errors for name, errors in out.items() if errors}


def run(args: argparse.Namespace) -> int:
    """Run ``agentcompact replay``; returns the exit status."""
    err = Console(stderr=True)
    strategies = ([s.strip() for s in args.strategy.split(",") if s.strip()]
                  if args.strategy else default_strategies())
    unknown = [s for s in strategies if s not in BASELINES and s not in LLM_STRATEGIES
               and s not in registry().strategy_names()]
    if unknown:
        return _fail(f"unknown strategy {', '.join(unknown)}; known: "
                     f"{', '.join(dict.fromkeys([*BASELINES, *registry().strategy_names()]))}")
    missing = _missing_paths(args.paths)
    if missing:
        return _fail(missing)
    sessions = load_sessions(args.paths, args.dialect, on_skip=lambda p, r: err.print(
        f"skipped {escape(str(p))}: {escape(r)}", style="dim", soft_wrap=True))
    if not sessions:
        return _fail(f"no sessions found in {', '.join(args.paths)}: give Claude Code, Codex, "
                     "SWE-agent, mini-swe-agent or tau-bench files, or message lists", 1)
    try:
        report = _replay(args, sessions, strategies)
    except AgentCompactError as exc:
        return _fail(f"replay failed: {exc}")
    out = Console()
    if not out.is_terminal:
        out = Console(width=80)
    for table in _tables(report):
        out.print(table)
    out.print(_LEGEND, style="dim", highlight=False)
    for name, errors in _errors(report).items():
        err.print(f"[yellow]{escape(name)}: {len(errors)} call(s) fell back[/yellow] "
                  f"(first: {escape(errors[0])}); figures include the fallbacks, see --json")
    for name, reason in report.skipped.items():
        err.print(f"skipped {escape(name)}: {escape(reason)}", style="dim", soft_wrap=True)
    for source, error in report.failures.items():
        err.print(f"[red]failed[/red] {escape(str(source))}: {escape(str(error))}")
    _write(args, report, err)
    return 1 if report.failures and not report.trajectories else 0


def _replay(args: argparse.Namespace, sessions: list[Trajectory],
            strategies: list[str]) -> ReplayReport:
    summarizer = {k: v for k, v in (("context_window", args.summarizer_window),
                                    ("timeout", args.summarizer_timeout)) if v is not None}
    options = dict(trigger=args.trigger, target=args.target, price=args.price,
                   model=args.model, counter=args.counter, summarizer_url=args.summarizer_url,
                   summarizer_model=args.summarizer_model, summarizer_options=summarizer)
    if args.quiet:
        return replay(sessions, strategies, **options)
    total = sum(count_calls(t) for t in sessions)
    columns = (TextColumn("replaying"), BarColumn(), MofNCompleteColumn(),
               TextColumn("calls"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("calls", total=total)
        return replay(sessions, strategies, on_call=lambda: progress.advance(task),
                      **options)


def _write(args: argparse.Namespace, report: ReplayReport, err: Console) -> None:
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report.to_dict(), indent=1), encoding="utf-8")
        err.print(f"figures written to {args.json_out}")
    if args.report:
        from ._report import write_html

        write_html(report, args.report)
        err.print(f"report written to {args.report}")


def main(argv: list[str] | None = None) -> int:
    """``python -m agentcompact.replay._cli``."""
    parser = argparse.ArgumentParser(prog="agentcompact replay", description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
