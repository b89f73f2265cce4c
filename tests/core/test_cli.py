from __future__ import annotations

import pytest

from agentcompact.cli import main


def test_demo_prints_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--turns", "60", "--trigger", "20000"]) == 0
    out = capsys.readouterr().out
    assert "compactions" in out and "cached-prefix share" in out and "×" in out


def test_demo_stays_under_trigger_and_costs_less() -> None:
    from agentcompact.demo import run_demo

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
