"""Scripted tool-using sessions for the real coding CLIs (Claude Code, Codex CLI, Gemini CLI).

A :class:`ToolLoop` is a responder: the simulated model asks the CLI to read one file per
step (``Read`` for Claude Code; Codex's ``exec`` tool, or its ``exec_command`` function
with older models; Gemini CLI's ``read_file``), then answers with a final text. The step
comes from the newest tool result the request carries (each file opens with its own
marker), not from a counter, so a retried request, or a history the proxy compacted, gets
the right next step. A request asking for JSON by a schema (Gemini CLI's model routing)
gets a value of that schema. :func:`claude_command`, :func:`codex_command` and
:func:`gemini_command` build the command line and environment that point each CLI at a
base URL, with a dummy key and a private home directory.

Nothing here talks to a real provider; the CLIs are found on ``PATH`` or through
``AGENTCOMPACT_CLI_BIN`` (the folder ``.ci/run`` installs them into).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._gemini_wire import json_schema_of, schema_sample
from ._script import Reply, ToolCall

__all__ = [
    "CLI_BIN_ENV",
    "DUMMY_ANTHROPIC_KEY",
    "DUMMY_GEMINI_KEY",
    "DUMMY_OPENAI_KEY",
    "CliCommand",
    "ToolLoop",
    "claude_command",
    "codex_command",
    "find_cli",
    "gemini_command",
    "write_step_files",
]

#: environment variable naming the folder holding the ``claude`` and ``codex`` executables
CLI_BIN_ENV = "AGENTCOMPACT_CLI_BIN"
DUMMY_ANTHROPIC_KEY = "sk-ant-agentcompact-dummy-0000"
DUMMY_OPENAI_KEY = "sk-agentcompact-dummy-0000"
DUMMY_GEMINI_KEY = "AIza-agentcompact-dummy-0000"
FINAL_TEXT = "All steps done."
_MARK = re.compile(r"STEP-(\d+)-OF-(\d+)")
_WORDS = ("alpha", "bravo", "delta", "kilo", "lima", "oscar", "romeo", "sierra", "tango",
          "zulu", "quartz", "ember", "cobalt", "fjord", "glyph", "haze", "ivory", "jolt")


def write_step_files(folder: Path, steps: int, size: int) -> list[Path]:
    """``steps`` files of about ``size`` bytes of varied words, each opening with its step
    marker (``STEP-<i>-OF-<n>``); returns their paths."""
    paths = []
    for i in range(steps):
        lines = [f"STEP-{i}-OF-{steps}"]
        n = 0
        while sum(len(x) + 1 for x in lines) < size:
            digest = hashlib.sha256(f"{i}:{n}".encode()).digest()
            lines.append(" ".join(_WORDS[b % len(_WORDS)] + str(b) for b in digest[:12]))
            n += 1
        path = folder / f"step{i:03d}.txt"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, Sequence):
        return [t for v in value for t in _texts(v)]
    return []


def _results(body: Mapping[str, Any]) -> list[Any]:
    """The tool results of a request, oldest first (Anthropic blocks, Responses items,
    Gemini function responses)."""
    found: list[Any] = []
    for item in body.get("messages") or body.get("input") or body.get("contents") or []:
        if not isinstance(item, dict):
            continue
        found.extend(p["functionResponse"].get("response") for p in item.get("parts") or []
                     if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict))
        if str(item.get("type", "")).endswith("_call_output"):
            found.append(item.get("output"))
        content = item.get("content")
        if item.get("role") == "user" and isinstance(content, list):
            found.extend(b.get("content") for b in content
                         if isinstance(b, dict) and b.get("type") == "tool_result")
    return found


def newest_step(body: Mapping[str, Any]) -> int | None:
    """The step marker in the newest tool result of ``body`` (``None``: no step yet)."""
    results = _results(body)
    if not results:
        return None
    for text in _texts(results[-1]):
        m = _MARK.search(text)
        if m:
            return int(m.group(1))
    return None


def _offers(body: Mapping[str, Any], name: str) -> bool:
    """True when a tool called ``name`` is among the request's tools (``tools`` or a
    Responses ``additional_tools`` item, namespaces included; Gemini's
    ``functionDeclarations``)."""
    pending = list(body.get("tools") or [])
    for item in body.get("input") or []:
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            pending.extend(item.get("tools") or [])
    while pending:
        tool = pending.pop()
        if not isinstance(tool, dict):
            continue
        if tool.get("name") == name:
            return True
        pending.extend(tool.get("tools") or [])
        pending.extend(tool.get("functionDeclarations") or [])
    return False


@dataclass
class ToolLoop:
    """The model side of an ``len(files)``-step session: read file ``i`` at step ``i``.

    ``calls`` records, per step, how many requests asked for it (a step asked twice was
    retried by the CLI); ``side`` counts requests without tools (titles, summaries).
    """

    files: list[Path]
    calls: dict[int, int] = field(default_factory=dict)
    side: int = 0
    finals: int = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        schema = json_schema_of(body)
        if schema is not None:  # a side request asking for JSON (Gemini CLI's routing)
            self.side += 1
            return Reply(json.dumps(schema_sample(schema)))
        if not body.get("tools") and not _offers(body, "exec"):
            self.side += 1
            return Reply("Reading files step by step.")
        last = newest_step(body)
        step = 0 if last is None else last + 1
        if step >= len(self.files):
            self.finals += 1
            return Reply(FINAL_TEXT)
        self.calls[step] = self.calls.get(step, 0) + 1
        return self._call(body, str(self.files[step]))

    @staticmethod
    def _call(body: dict[str, Any], path: str) -> Reply:
        if _offers(body, "Read"):  # Claude Code
            return Reply.tool("Read", {"file_path": path})
        if _offers(body, "read_file"):  # Gemini CLI
            return Reply.tool("read_file", {"file_path": path})
        if _offers(body, "exec_command"):  # Codex, models offered the function itself
            return Reply.tool("exec_command", {"cmd": f"cat {path}"})
        command = json.dumps(f"cat {path}")
        source = f"const r = await tools.exec_command({{cmd: {command}}});\ntext(r.output);"
        return Reply.calling(ToolCall("exec", source, custom=True))  # Codex's exec (JS)


@dataclass(frozen=True)
class CliCommand:
    """A command line and the environment to run it with (nothing inherited but ``PATH``)."""

    argv: list[str]
    env: dict[str, str]


def find_cli(name: str) -> str | None:
    """The ``claude`` / ``codex`` / ``gemini`` executable: in ``$AGENTCOMPACT_CLI_BIN``, else
    on PATH."""
    folder = os.environ.get(CLI_BIN_ENV)
    if folder:
        candidate = Path(folder) / name
        if candidate.exists():
            return str(candidate)
    return shutil.which(name)


def _base_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "LANG": "C.UTF-8", "NO_COLOR": "1"}


def claude_command(executable: str, base_url: str, home: Path, prompt: str,
                   model: str | None = None) -> CliCommand:
    """``claude -p`` reading files with ``Read`` against ``base_url`` (the proxy)."""
    argv = [executable, "-p", prompt, "--output-format", "stream-json", "--verbose",
            "--allowedTools", "Read"]
    if model:
        argv += ["--model", model]
    env = {**_base_env(home), "ANTHROPIC_BASE_URL": base_url,
           "ANTHROPIC_API_KEY": DUMMY_ANTHROPIC_KEY,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    return CliCommand(argv, env)


def codex_config(base_url: str, model: str | None = None) -> str:
    """A ``config.toml`` with a ``model_providers`` block (``wire_api = "responses"``)
    pointing Codex at ``base_url`` (``…/v1``), its key read from ``AGENTCOMPACT_SIM_KEY``."""
    lines = ['model_provider = "agentcompact"']
    if model:
        lines.append(f'model = "{model}"')
    lines += ["", "[model_providers.agentcompact]", 'name = "agentcompact proxy"',
              f'base_url = "{base_url}"', 'wire_api = "responses"',
              'env_key = "AGENTCOMPACT_SIM_KEY"']
    return "\n".join(lines) + "\n"


def codex_command(executable: str, base_url: str, home: Path, prompt: str,
                  model: str | None = None) -> CliCommand:
    """``codex exec`` against ``base_url`` (``…/v1``) through a private ``CODEX_HOME``."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = home / "config.toml"
    config.write_text(codex_config(base_url, model))
    config.chmod(0o600)
    argv = [executable, "exec", "--skip-git-repo-check", prompt]
    env = {**_base_env(home), "CODEX_HOME": str(home), "AGENTCOMPACT_SIM_KEY": DUMMY_OPENAI_KEY}
    return CliCommand(argv, env)


#: Gemini CLI's settings for a run against a base URL with an API key: the auth type
#: selected (with ``GOOGLE_GEMINI_BASE_URL`` set and none selected, 0.61 picks its
#: ``gateway`` auth, which ``-p`` refuses), no usage statistics sent anywhere
GEMINI_SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}},
                   "privacy": {"usageStatisticsEnabled": False}}


def gemini_command(executable: str, base_url: str, home: Path, prompt: str,
                   model: str | None = None) -> CliCommand:
    """``gemini -p --yolo`` against ``base_url`` (``GOOGLE_GEMINI_BASE_URL``), with a private
    ``HOME`` holding ``.gemini/settings.json`` (API-key auth) and a dummy key."""
    folder = home / ".gemini"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    settings = folder / "settings.json"
    settings.write_text(json.dumps(GEMINI_SETTINGS))
    settings.chmod(0o600)
    argv = [executable, "-p", prompt, "--yolo", "--skip-trust"]
    if model:
        argv += ["--model", model]
    env = {**_base_env(home), "GOOGLE_GEMINI_BASE_URL": base_url,
           "GEMINI_API_KEY": DUMMY_GEMINI_KEY}
    return CliCommand(argv, env)
