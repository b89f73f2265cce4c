from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcompact._cli import main


def test_demo_prints_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--turns", "60", "--trigger", "20000"]) == 0
    out = capsys.readouterr().out
    assert "compactions" in out and "cached-prefix share" in out and "×" in out


def test_demo_explains_each_figure_shows_an_excerpt_and_what_next(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "demo.json"
    assert main(["demo", "--turns", "60", "--trigger", "20000", "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines if str(saved) not in line) <= 80
    for figure in ("model calls", "compactions", "peak context", "trigger",
                   "cached-prefix share", "input cost", "engine time"):
        assert any(line.startswith(f"{figure}: ") for line in lines), figure
    kept = next(line for line in lines if line.startswith("  kept      user"))
    assert "Fix the failing order tests" in kept
    assert any(line.startswith("  compacted user      [agentcompact: earlier turns compacted]")
               for line in lines)
    assert "agentcompact replay ~/.claude/projects --report replay.html" in out
    assert "``" not in out
    session = json.loads(saved.read_text())
    assert session[0]["role"] == "user" and len(session) == 122
    assert main(["replay", str(saved), "--strategy", "cliff", "--trigger", "20000",
                 "--quiet"]) == 0


def test_help_texts_carry_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["demo", "--help"], ["replay", "--help"], ["export", "--help"]):
        with pytest.raises(SystemExit):
            if main(argv) == 2:  # export without its extra: the one line naming it
                raise SystemExit(2)
        out = capsys.readouterr().out
        assert "``" not in out and ":class:" not in out, argv


def test_demo_stays_under_trigger_and_costs_less() -> None:
    from agentcompact._demo import run_demo

    report = run_demo(trigger=20000, turns=60)
    assert report.compactions >= 1
    assert report.peak_tokens <= 20000 < report.full_peak_tokens
    assert report.cost_ratio < 1.0


def test_plugins_lists_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "cliff" in out and "anthropic" in out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "demo" in capsys.readouterr().out


_EXTRAS = ("aiohttp", "pyarrow", "torch", "transformers", "starlette", "uvicorn", "ray",
           "redis", "mcp", "langgraph", "llama_index", "openai", "anthropic", "httpx")


def test_help_imports_no_extra() -> None:
    """``agentcompact --help`` lists every subcommand without importing any extra."""
    import subprocess
    import sys

    code = ("import sys\nfrom agentcompact._cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({_EXTRAS!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "proxy" in out and "export" in out and "mcp" in out
    assert out.strip().splitlines()[-1] == "[]"


def _help_lines(command: str | None) -> dict[str, str | None]:
    import argparse

    from agentcompact._cli import build_parser

    parser = build_parser(command)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in action._choices_actions}


def test_help_lines_match_each_subcommands_own() -> None:
    """The static help line of each lazily imported subcommand is the one its module
    registers (where its extra is installed)."""
    from agentcompact._cli import _EXTERNAL

    listed = _help_lines(None)
    for name in _EXTERNAL:
        own = _help_lines(name)[name]
        if own is not None and own.startswith("(needs extra"):
            continue
        assert listed[name] == own, name


def test_subcommand_without_its_extra_says_which(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "agentcompact.integrations._mcp_server", None)
    assert main(["mcp"]) == 2
    assert "agentcompact[mcp]" in capsys.readouterr().err
