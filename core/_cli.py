"""The ``agentcompact`` command: ``demo``, ``plugins``, ``replay``, ``export``, ``proxy``,
``run`` (a command behind a proxy), ``watch`` (a live view of a proxy), ``mcp``, ``store``
(the prefix store and archive: ``stats``, ``prune``), ``rl`` (``rl demo``: closed-loop RL
with compaction).

Subcommands that need an extra are listed always; running one without its extra says
which extra to install. An error is one line naming the problem and the fix; --debug
shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from .errors import AgentCompactError

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
    "rl": ("agentcompact.rl._cli", "rl",
           "closed-loop RL with compaction (demo on a CPU)"),
    "store": ("agentcompact.stores._cli", None,
              "show or bound the prefix store and archive (stats, prune)"),
}


def _demo(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from ._demo import demo_session, run_demo
    from ._demo_view import print_demo

    report = run_demo(trigger=args.trigger, turns=args.turns)
    if args.save:
        with open(args.save, "w", encoding="utf-8") as out:
            json.dump(demo_session(args.turns), out)
    print_demo(report, args.turns, Console())
    if args.save:
        print(f"the session's messages (Anthropic) are in {args.save}")
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


def _missing(name: str, extra: str | None, error: ImportError) -> Callable[[Any], int]:
    def run(args: argparse.Namespace) -> int:
        hint = f"pip install 'agentcompact[{extra}]'" if extra else "reinstall agentcompact"
        what = f"the {extra!r} extra" if extra else "a module it could not import"
        print(f"agentcompact {name} needs {what} (import failed: {_import_failure(error)}); "
              f"{hint}", file=sys.stderr)
        return 2
    return run


def _import_failure(error: ImportError) -> str:
    """``No module named 'pyarrow'``, or the message's first line."""
    return (str(error).splitlines() or [type(error).__name__])[0]


def _add_missing(sub: Any, name: str, extra: str | None, error: ImportError) -> None:
    """A stand-in for a subcommand whose extra is missing: it takes any arguments and
    ``--help`` alike, and says which extra to install."""
    stand_in = sub.add_parser(name, help=f"(needs extra {extra!r})", add_help=False)
    stand_in.add_argument("rest", nargs=argparse.REMAINDER)
    stand_in.set_defaults(run=_missing(name, extra, error), takes_any=True)


_DESCRIPTION = ("Keep long-running LLM agents inside a bounded context window, and turn "
                "their runs into RL training data. Start with: agentcompact demo")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line that points to --help (subcommands inherit the class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (every other subcommand is
    listed by its help line)."""
    parser = _Parser(prog="agentcompact", description=_DESCRIPTION)
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (also accepted after the "
                             "subcommand)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="run cliff compaction on a built-in long session",
        description="Replay a built-in coding-agent session (offline, deterministic) through "
                    "cliff compaction and through no compaction, and compare peak context, "
                    "prompt-cache hits and input cost.")
    demo.add_argument("--trigger", type=int, default=60_000,
                      help="compact when the context exceeds this many tokens (default 60000)")
    demo.add_argument("--turns", type=int, default=160,
                      help="tool-call turns in the session (default 160)")
    demo.add_argument("--save", metavar="JSON",
                      help="also write the session's messages here (agentcompact replay reads "
                           "the file)")
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
            _add_missing(sub, name, extra, exc)
            continue
        mod.add_parser(sub)
        sub.choices[name].set_defaults(run=mod.run)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word not starting with ``-``)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _split_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (anywhere before a ``--``), and whether it was there."""
    end = argv.index("--") if "--" in argv else len(argv)
    kept = [a for a in argv[:end] if a != "--debug"] + argv[end:]
    return kept, len(kept) != len(argv)


def main(argv: list[str] | None = None) -> int:
    """Run ``agentcompact``. An error is one line naming the problem and the fix (exit
    status 2); ``--debug`` shows its traceback instead."""
    argv, debug = _split_debug(sys.argv[1:] if argv is None else list(argv))
    # transformers' import-time advice ("PyTorch was not found…") is noise for a command
    # that only tokenizes; set before any subcommand imports it
    if not os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS"):
        os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    parser = build_parser(_command_of(argv))
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_any", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place a command's error becomes its line
        if debug:
            raise
        print(f"agentcompact {args.command}: {error_line(exc)}", file=sys.stderr)
        return 2


def error_line(exc: BaseException) -> str:
    """One line for ``exc``: the error's own message for agentcompact's errors (they name
    the fix) and for the operating system's (file, permission, port), else its type and a
    pointer to ``--debug`` (an unexpected message may quote content; it is not printed)."""
    if isinstance(exc, AgentCompactError):
        text = " ".join(str(exc).split())
    elif isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename is not None else ""
        text = f"{exc.strerror}{where}"
    else:
        return (f"unexpected {type(exc).__name__}; run again with --debug for the traceback "
                "and report it")
    return text or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
