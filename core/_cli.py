"""The ``agentcompact`` command: ``demo``, ``plugins``, ``replay``, ``export``, ``proxy``,
``run`` (a command behind a proxy), ``watch`` (a live view of a proxy), ``mcp``, ``store``
(the prefix store and archive: ``stats``, ``prune``).

Subcommands that need an extra are listed always; running one without its extra says
which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["main"]

# subcommand -> (module with add_parser(subparsers) and run(args), extra that provides it,
# the one-line help). Only the module of the command being run is imported, so
# ``agentcompact --help`` imports no extra (tests/core/test_cli.py checks the help lines
# against each module's own).
_EXTERNAL = {
    "replay": ("agentcompact.replay._cli", None,
               "replay recorded agent sessions through compaction strategies, side by side"),
    "export": ("agentcompact.trajectory._export_cli", "export",
               "export runs as RL training rows (Parquet/JSONL)"),
    "proxy": ("agentcompact.integrations.proxy._cli", "proxy",
              "run the transparent compaction proxy"),
    "run": ("agentcompact.integrations.proxy._launch", "proxy",
            "run a command (claude, codex, …) with the proxy in front of it"),
    "watch": ("agentcompact.integrations.proxy._watch", "proxy",
              "live view of a running proxy's sessions"),
    "mcp": ("agentcompact.integrations._mcp_server", "mcp",
            "serve expand/search_dropped over an archive (MCP, stdio)"),
    "store": ("agentcompact.stores._cli", None,
              "show or bound the prefix store and archive (stats, prune)"),
}


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ._demo import run_demo

    report = run_demo(trigger=args.trigger, turns=args.turns)
    table = Table(title=f"cliff compaction on a built-in {args.turns}-turn agent session")
    table.add_column("figure")
    table.add_column("agentcompact cliff", justify="right")
    table.add_column("full history", justify="right")
    table.add_row("model calls", str(report.calls), str(report.calls))
    table.add_row("compactions", str(report.compactions), "0")
    table.add_row("peak context (o200k tokens)", f"{report.peak_tokens:,}",
                  f"{report.full_peak_tokens:,}")
    table.add_row("trigger", f"{report.trigger:,}", "-")
    table.add_row("cached-prefix share", f"{report.cached_share:.1%}",
                  f"{report.full_cached_share:.1%}")
    table.add_row("input cost with prompt caching", f"{report.cost_ratio:.2f}×", "1.00×")
    table.add_row("engine time per call", f"{report.engine_ms_per_call:.2f} ms", "-")
    Console().print(table)
    return 0


def _plugins(args: argparse.Namespace) -> int:
    from ._pluginmanager import get_plugin_manager, registry

    pm = get_plugin_manager()
    reg = registry(pm)
    for name, plugin in pm.list_name_plugin():
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        print(f"{name}: {', '.join(hooks)}")
    print(f"strategies: {', '.join(reg.strategy_names())}")
    print(f"dialects: {', '.join(reg.dialect_names())}")
    return 0


def _missing(name: str, extra: str | None, error: Exception) -> Callable[[Any], int]:
    def run(args: argparse.Namespace) -> int:
        hint = f"pip install 'agentcompact[{extra}]'" if extra else "reinstall agentcompact"
        print(f"agentcompact {name} is unavailable ({error}); {hint}", file=sys.stderr)
        return 2
    return run


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (every other subcommand is
    listed by its help line)."""
    parser = argparse.ArgumentParser(prog="agentcompact", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run cliff compaction on a built-in long session")
    demo.add_argument("--trigger", type=int, default=60_000, help="trigger in tokens")
    demo.add_argument("--turns", type=int, default=160, help="turns in the session")
    demo.set_defaults(run=_demo)
    plugins = sub.add_parser("plugins", help="list plugins, strategies and dialects")
    plugins.set_defaults(run=_plugins)
    for name, (module, extra, help_line) in _EXTERNAL.items():
        if name != command:
            sub.add_parser(name, help=help_line)
            continue
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            sub.add_parser(name, help=f"(needs extra {extra!r})").set_defaults(
                run=_missing(name, extra, exc))
            continue
        mod.add_parser(sub)
        sub.choices[name].set_defaults(run=mod.run)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word not starting with ``-``)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
