"""Drive a real coding CLI through the proxy against the upstream simulator, and keep
everything the assertions read: the simulator's recorded requests, the proxy's log lines,
its status page, its ``--debug-dir`` dumps (the client's own bodies) and the CLI's output."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from agentcompact import Budget, new_plugin_manager
from agentcompact.integrations.proxy import ProxyConfig, ThreadedServer, create_app
from agentcompact.integrations.proxy._wire import dialect_for
from agentcompact.testing import RecordedRequest, Script, UpstreamSim, serve
from agentcompact.testing._clis import (
    CliCommand,
    ToolLoop,
    claude_command,
    codex_command,
    gemini_command,
    write_step_files,
)

PROMPT = "Read the step files one by one, then say you are done."


@dataclass
class CliRun:
    """What one CLI session left behind."""

    cli: str
    returncode: int
    stdout: str
    stderr: str
    loop: ToolLoop
    requests: list[RecordedRequest]
    log_lines: list[dict[str, Any]]
    log_text: str
    status: dict[str, Any]
    dumps: list[dict[str, Any]] = field(default_factory=list)
    debug_dir: Path | None = None
    #: ``agentcompact watch --once`` against the proxy after the session
    watch: str = ""

    @property
    def dialect_requests(self) -> list[RecordedRequest]:
        """The requests the proxy compacts (``/v1/messages``, ``/v1/responses``,
        ``…:generateContent``, ``…:streamGenerateContent``)."""
        return [r for r in self.requests if r.method == "POST" and dialect_for(r.path)]

    @property
    def proxy_lines(self) -> list[dict[str, Any]]:
        return [line for line in self.log_lines if line.get("event") == "proxy_request"]


@contextmanager
def _captured(logger_name: str) -> Iterator[io.StringIO]:
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(logger_name)
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield buffer
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def run_cli(cli: str, executable: str, tmp: Path, *, steps: int, trigger: int,
            model: str | None = None, file_bytes: int = 6000, timeout: float = 300.0
            ) -> CliRun:
    """One ``steps``-step session of ``cli`` (``claude``, ``codex`` or ``gemini``) through a
    proxy with ``trigger``; the proxy dumps every body into ``tmp/debug``."""
    work, home, debug = tmp / "work", tmp / "home", tmp / "debug"
    work.mkdir()
    home.mkdir(mode=0o700)
    loop = ToolLoop(write_step_files(work, steps, file_bytes))
    sim = UpstreamSim(Script(then=loop))
    with _captured("agentcompact") as logs, serve(sim) as upstream:
        config = ProxyConfig(port=0, budget=Budget(trigger), anthropic_upstream=upstream.base_url,
                             openai_upstream=upstream.base_url,
                             gemini_upstream=upstream.base_url, debug_dir=str(debug))
        app = create_app(config, plugins=new_plugin_manager())
        with ThreadedServer(app) as proxy:
            command = _command(cli, executable, proxy.base_url, home, model)
            done = subprocess.run(command.argv, env=command.env, cwd=work, capture_output=True,
                                  text=True, timeout=timeout, check=False)
            status = httpx.get(f"{proxy.base_url}/agentcompact/status", timeout=10).json()
            watch = subprocess.run([sys.executable, "-m", "agentcompact._cli", "watch", "--once",
                                    "--url", proxy.base_url], capture_output=True, text=True,
                                   env={**os.environ, "COLUMNS": "200"}, timeout=60,
                                   check=False)
        requests = upstream.requests
    text = logs.getvalue()
    lines = [orjson.loads(x) for x in text.splitlines() if x.startswith("{")]
    dumps = [orjson.loads(p.read_bytes()) for p in sorted(debug.glob("*-in.json"))]
    return CliRun(cli, done.returncode, done.stdout, done.stderr, loop, requests, lines, text,
                  status, dumps, debug, watch.stdout)


def _command(cli: str, executable: str, base_url: str, home: Path, model: str | None
             ) -> CliCommand:
    if cli == "claude":
        return claude_command(executable, base_url, home, PROMPT, model)
    if cli == "gemini":
        return gemini_command(executable, base_url, home, PROMPT, model)
    return codex_command(executable, f"{base_url}/v1", home / "codex", PROMPT, model)
