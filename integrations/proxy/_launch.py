"""``agentcompact run [proxy options] -- CMD…``: one command for a user.

Starts the proxy on a free loopback port, points the command at it and runs the command in
the foreground; when it exits, the proxy is torn down and the command's exit status is
returned. The command is pointed at the proxy by ``ANTHROPIC_BASE_URL`` (Claude Code, the
Anthropic SDKs), ``OPENAI_BASE_URL`` (the OpenAI SDKs), ``GOOGLE_GEMINI_BASE_URL`` (Gemini
CLI, the Google Gen AI SDKs) and, when the command is ``codex``, ``-c`` overrides defining a
``model_providers.agentcompact`` entry with ``wire_api = "responses"`` (Codex reads no
base-URL variable for its own provider).

The proxy's per-request log lines go to ``--log-file`` (mode 0600) when given, else
nowhere: a terminal UI owns the screen. Warnings go to the log file, or to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentcompact.errors import AgentCompactError

from ._cli import _add_arguments, build_config, start_up

__all__ = ["add_parser", "child_command", "child_env", "gemini_auth_hint", "run"]

log = logging.getLogger("agentcompact.proxy")
#: the ``model_providers`` entry ``run`` defines for Codex
CODEX_PROVIDER = "agentcompact"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to an ``argparse`` sub-parsers object; returns the new parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="run a command (claude, codex, …) with the proxy in front of it",
        description="Start the compaction proxy on a free loopback port, point CMD at it "
                    "(ANTHROPIC_BASE_URL, OPENAI_BASE_URL, GOOGLE_GEMINI_BASE_URL; for codex "
                    "a model_providers "
                    "override), run CMD in the foreground and stop the proxy after. The "
                    "exit status is CMD's. Example: agentcompact run --trigger 150000 -- claude")
    _add_arguments(p)
    for action in p._actions:  # the same flag as the proxy's, with run's own default
        if action.dest == "port":
            action.help = "port (default 0: any free port)"
    p.add_argument("--log-file", metavar="PATH",
                   help="write the proxy's log (one JSON line per request) here (mode 0600)")
    p.add_argument("--codex-env-key", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable Codex reads its API key from (default "
                        "OPENAI_API_KEY)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    p.set_defaults(func=run)
    return p


def child_env(base_url: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: the caller's, with the providers' base URLs set to the
    proxy (``OPENAI_BASE_URL`` with ``/v1``, as the OpenAI SDKs expect; the Gemini SDKs add
    their API version themselves)."""
    env = dict(os.environ if environ is None else environ)
    env["ANTHROPIC_BASE_URL"] = base_url
    env["OPENAI_BASE_URL"] = f"{base_url}/v1"
    env["GOOGLE_GEMINI_BASE_URL"] = base_url
    return env


def child_command(argv: Sequence[str], base_url: str, codex_env_key: str = "OPENAI_API_KEY"
                  ) -> list[str]:
    """``argv``, with ``-c`` overrides after ``codex`` pointing Codex at the proxy."""
    out = list(argv)
    if out and Path(out[0]).name in ("codex", "codex.exe"):
        prefix = f"model_providers.{CODEX_PROVIDER}"
        overrides = {f"{prefix}.name": "agentcompact proxy",
                     f"{prefix}.base_url": f"{base_url}/v1",
                     f"{prefix}.wire_api": "responses",
                     f"{prefix}.env_key": codex_env_key,
                     "model_provider": CODEX_PROVIDER}
        flags = [x for key, value in overrides.items() for x in ("-c", f'{key}="{value}"')]
        out[1:1] = flags
    return out


def run(args: argparse.Namespace) -> int:
    """Run the command behind a proxy; returns the command's exit status."""
    command = list(getattr(args, "command", None) or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("agentcompact run: no command given (agentcompact run [options] -- CMD …)",
              file=sys.stderr)
        return 2
    if args.port is None:
        args.port = 0
    if args.log_requests is None:
        args.log_requests = args.log_file is not None
    _setup_logging(getattr(args, "log_level", "INFO"), args.log_file)
    try:
        server = _start(args)
        start_up(server.proxy.config.budget.trigger, args)
    except AgentCompactError as exc:
        print(f"agentcompact run: {exc}", file=sys.stderr)
        return 2
    try:
        print(f"agentcompact: proxy on {server.base_url} (agentcompact watch --url "
              f"{server.base_url})", file=sys.stderr)
        hint = gemini_auth_hint(command)
        if hint:
            print(hint, file=sys.stderr)
        return _foreground(child_command(command, server.base_url, args.codex_env_key),
                           child_env(server.base_url))
    finally:
        server.stop()
        _summary(server)


def gemini_auth_hint(argv: Sequence[str], home: Path | None = None,
                     cwd: Path | None = None) -> str | None:
    """One line for a Gemini CLI run in ``-p`` mode whose settings select no auth type:
    with ``GOOGLE_GEMINI_BASE_URL`` set, Gemini CLI (0.61) then picks its ``gateway``
    auth, which its ``-p`` mode refuses ("Invalid auth method selected")."""
    if not argv or Path(argv[0]).name not in ("gemini", "gemini.cmd"):
        return None
    if not any(a in ("-p", "--prompt") or a.startswith("--prompt=") for a in argv[1:]):
        return None
    home = Path.home() if home is None else home
    cwd = Path.cwd() if cwd is None else cwd
    for settings in (home / ".gemini" / "settings.json", cwd / ".gemini" / "settings.json"):
        try:
            if "selectedType" in settings.read_text(encoding="utf-8", errors="replace"):
                return None
        except OSError:
            continue
    return ('agentcompact run: Gemini CLI selects no auth type here; if it answers "Invalid '
            'auth method selected", set "security": {"auth": {"selectedType": '
            '"gemini-api-key"}} in ~/.gemini/settings.json (GEMINI_API_KEY stays the key)')


class _Running:
    """The proxy's server thread and its state."""

    def __init__(self, server: Any, proxy: Any) -> None:
        self.server, self.proxy = server, proxy
        self.base_url: str = server.base_url

    def stop(self) -> None:
        self.server.stop()


def _start(args: argparse.Namespace) -> _Running:
    from .._threaded_server import ThreadedServer
    from ._app import create_app

    config = build_config(args)
    app = create_app(config)
    return _Running(ThreadedServer(app, config.host, config.port).start(), app.proxy)


def _foreground(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` and wait; Ctrl-C reaches it (same process group) and is waited out."""
    try:
        child = subprocess.Popen(argv, env=env)
    except OSError as exc:
        print(f"agentcompact run: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    while True:
        try:
            code = child.wait()
            break
        except KeyboardInterrupt:
            continue  # the child got the same SIGINT; its exit decides
    return code if code >= 0 else 128 - code


def _summary(server: _Running) -> None:
    stats = server.proxy.stats.snapshot()
    print(f"agentcompact: {stats['handled']} requests, {stats['compactions']} compactions, "
          f"{stats['tokens_saved']:,} tokens saved, {stats['fallbacks']} fallbacks, "
          f"{stats['errors']} errors", file=sys.stderr)


def _setup_logging(level: str, path: str | None) -> None:
    logger = logging.getLogger("agentcompact")
    if path is not None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        handler: logging.Handler = logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8"))
        logger.setLevel(level.upper())
    else:
        handler = logging.StreamHandler(sys.stderr)
        logger.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
