"""``agentcompact run -- CMD``: the real CLIs behind a proxy it starts and stops, and the
exit status passed through."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from agentcompact.testing import Script, UpstreamSim, serve
from agentcompact.testing._clis import (
    DUMMY_ANTHROPIC_KEY,
    DUMMY_GEMINI_KEY,
    DUMMY_OPENAI_KEY,
    FINAL_TEXT,
    ToolLoop,
    claude_command,
    codex_command,
    find_cli,
    gemini_command,
    write_step_files,
)

from .harness import PROMPT

pytestmark = pytest.mark.network

STEPS = 14
TRIGGER = 30_000


def _agentcompact(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentcompact._cli", *args]


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {**extra}
    for name in ("TIKTOKEN_CACHE_DIR", "PYTHONPATH"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


@pytest.mark.clis
@pytest.mark.parametrize("cli", ["claude", "codex", "gemini"])
def test_run_puts_the_real_cli_behind_a_proxy(cli: str, tmp_path: Path) -> None:
    executable = find_cli(cli)
    if executable is None:
        pytest.skip(f"{cli} CLI not installed (run .ci/run, or set AGENTCOMPACT_CLI_BIN)")
    work, home, log_file = tmp_path / "work", tmp_path / "home", tmp_path / "proxy.log"
    work.mkdir()
    home.mkdir(mode=0o700)
    loop = ToolLoop(write_step_files(work, STEPS, 6000))
    sim = UpstreamSim(Script(then=loop))
    with serve(sim) as upstream:
        if cli == "claude":
            command = claude_command(executable, "http://replaced.invalid", home, PROMPT)
            argv, env = command.argv, command.env
        elif cli == "gemini":  # GOOGLE_GEMINI_BASE_URL: ``run`` points it at the proxy
            command = gemini_command(executable, "http://replaced.invalid", home, PROMPT)
            argv, env = command.argv, command.env
        else:  # no provider configured: ``run`` adds the model_providers override itself
            command = codex_command(executable, "http://unused.invalid/v1", home / "codex",
                                    PROMPT)
            (home / "codex" / "config.toml").write_text("")
            argv, env = command.argv, {**command.env, "OPENAI_API_KEY": DUMMY_OPENAI_KEY}
        done = subprocess.run(
            _agentcompact("run", "--trigger", str(TRIGGER), "--log-file", str(log_file),
                          "--anthropic-upstream", upstream.base_url,
                          "--openai-upstream", upstream.base_url,
                          "--gemini-upstream", upstream.base_url, "--", *argv),
            env=_env(env), cwd=work, capture_output=True, text=True, timeout=300, check=False)
        received = [r for r in upstream.requests if r.method == "POST"]
    assert done.returncode == 0, done.stderr[-2000:]
    assert FINAL_TEXT in done.stdout
    assert sorted(loop.calls) == list(range(STEPS))
    text = log_file.read_text()
    lines = [orjson.loads(x) for x in text.splitlines() if x.startswith('{"event":"proxy_request"')]
    assert len(lines) == len([r for r in received if r.path.endswith((
        "/messages", "/responses", ":generateContent", ":streamGenerateContent"))])
    compactions = sum(1 for line in lines if line["compacted"])
    assert compactions >= 1
    assert f"{compactions} compactions" in done.stderr  # the summary after the run
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    for key in (DUMMY_ANTHROPIC_KEY, DUMMY_OPENAI_KEY, DUMMY_GEMINI_KEY):
        assert key not in text and key not in done.stderr


@pytest.mark.parametrize("code", [0, 3, 7])
def test_run_passes_the_exit_status_through(code: int, tmp_path: Path) -> None:
    script = ("import os, sys; print(os.environ['ANTHROPIC_BASE_URL'], "
              f"os.environ['OPENAI_BASE_URL'], os.environ['GOOGLE_GEMINI_BASE_URL']); "
              f"sys.exit({code})")
    done = subprocess.run(_agentcompact("run", "--", sys.executable, "-c", script),
                          env=_env({"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == code, done.stderr
    anthropic_url, openai_url, gemini_url = done.stdout.split()
    assert anthropic_url.startswith("http://127.0.0.1:") and openai_url == anthropic_url + "/v1"
    assert gemini_url == anthropic_url  # the Gemini SDKs add their API version themselves
    assert "0 requests" in done.stderr  # the proxy was torn down and summed up


def test_run_without_a_command_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(_agentcompact("run"), env=_env({"HOME": str(tmp_path)}),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "no command given" in done.stderr


def test_run_reports_a_command_that_cannot_start(tmp_path: Path) -> None:
    done = subprocess.run(_agentcompact("run", "--", str(tmp_path / "missing")),
                          env=_env({"HOME": str(tmp_path)}), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 127 and "cannot run" in done.stderr


def test_only_codex_gets_the_provider_overrides() -> None:
    from agentcompact.integrations.proxy._launch import child_command

    url = "http://127.0.0.1:5000"
    assert child_command(["claude", "-p", "x"], url) == ["claude", "-p", "x"]
    codex = child_command(["/opt/bin/codex", "exec", "task"], url, "MY_KEY")
    assert codex[0] == "/opt/bin/codex" and codex[-2:] == ["exec", "task"]
    flags = dict(f.split("=", 1) for f in codex[2:-2:2])
    assert flags["model_provider"] == '"agentcompact"'
    assert flags["model_providers.agentcompact.base_url"] == f'"{url}/v1"'
    assert flags["model_providers.agentcompact.wire_api"] == '"responses"'
    assert flags["model_providers.agentcompact.env_key"] == '"MY_KEY"'
    assert codex[1:-2:2] == ["-c"] * 5


def test_gemini_in_prompt_mode_without_an_auth_type_gets_one_line_naming_the_fix(
        tmp_path: Path) -> None:
    from agentcompact.integrations.proxy._launch import gemini_auth_hint

    home, cwd = tmp_path / "home", tmp_path / "work"
    (home / ".gemini").mkdir(parents=True)
    cwd.mkdir()
    hint = gemini_auth_hint(["/usr/bin/gemini", "-p", "go"], home, cwd)
    assert hint is not None and "selectedType" in hint and "\n" not in hint
    assert gemini_auth_hint(["gemini"], home, cwd) is None  # interactive: its own dialog
    assert gemini_auth_hint(["claude", "-p", "go"], home, cwd) is None
    (home / ".gemini" / "settings.json").write_text(
        '{"security": {"auth": {"selectedType": "gemini-api-key"}}}')
    assert gemini_auth_hint(["gemini", "--prompt=go"], home, cwd) is None


def test_run_warns_about_a_trigger_the_harness_prompt_fills(tmp_path: Path) -> None:
    done = subprocess.run(_agentcompact("run", "--trigger", "15000", "--", sys.executable, "-c",
                                        "pass"),
                          env=_env({"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0
    assert "trigger 15000 tokens" in done.stderr and "below 26000" in done.stderr
    quiet = subprocess.run(_agentcompact("run", "--trigger", "150000", "--", sys.executable,
                                         "-c", "pass"),
                           env=_env({"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}),
                           capture_output=True, text=True, timeout=60, check=False)
    assert "trigger" not in quiet.stderr
