"""The HTML report renders offline in headless Chromium, without console errors, with plots."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agentcompact.replay import render_html, replay, write_html
from agentcompact.trajectory import Trajectory

from .test_figures import SESSION, WordCounter

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--enable-logging=stderr", "--v=0"]


def _long_session(turns: int = 40) -> Trajectory:
    """The built session stretched: many turns, so compaction and plots have shape."""
    messages = [SESSION[0]]
    for k in range(turns):
        call, result = SESSION[1], SESSION[2]
        messages.append({**call, "content": [
            call["content"][0], {**call["content"][1], "id": f"t{k}"}]})
        messages.append({"role": "user", "content": [
            {**result["content"][0], "tool_use_id": f"t{k}",
             "content": f"line {k} of src/mod_{k}.py " + "word " * (20 + k % 7)}]})
    messages.append(SESSION[5])
    return Trajectory(source="long", format="anthropic", dialect="anthropic", messages=messages)


def _chromium(tmp: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *_FLAGS, f"--user-data-dir={tmp / 'profile'}", *extra, url],
        capture_output=True, text=True, timeout=120, check=False)


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    report = replay([_long_session()], ["none", "window", "cliff"], trigger=600,
                    counter=WordCounter(), price="anthropic")
    path = tmp_path_factory.mktemp("report") / "replay.html"
    write_html(report, path)
    return path


def test_report_is_self_contained(report_html: Path) -> None:
    text = report_html.read_text(encoding="utf-8")
    assert "<script" not in text
    assert not re.search(r"""(?:src|href)=["']?(?:https?:)?//""", text)
    assert text.count("<svg") == 3  # size, cumulative cost, cache share
    assert text.count("<polyline") == 9  # three strategies on each plot
    assert "trigger 600" in text and "Compaction record" in text


@needs_chromium
def test_console_errors_are_caught(tmp_path: Path) -> None:
    """The detection itself works: a page that logs an error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom')</script></body></html>")
    result = _chromium(tmp_path, bad.as_uri(), "--dump-dom")
    assert any("boom" in line for line in _console(result.stderr))


@needs_chromium
def test_report_renders_in_chromium(report_html: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    result = _chromium(tmp_path, report_html.as_uri(), f"--screenshot={shot}",
                       "--window-size=1200,900")
    assert shot.exists() and shot.stat().st_size > 10_000, result.stderr[-2000:]
    assert _console(result.stderr) == []
    dom = _chromium(tmp_path, report_html.as_uri(), "--dump-dom")
    assert dom.stdout.count("<polyline") == 9
    assert _console(dom.stderr) == []
    _assert_plots_drawn(shot)
    keep = Path(__file__).resolve().parents[2] / ".pytest_cache" / "replay-report.png"
    keep.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, keep)  # for a human to look at


def _assert_plots_drawn(shot: Path) -> None:
    """The strategies' line colours are on screen (plots drawn, not blank boxes)."""
    image = pytest.importorskip("PIL.Image").open(shot).convert("RGB")
    colours = {c for _, c in image.getcolors(maxcolors=1 << 24)}
    for hex_colour in ("#1f77b4", "#d62728", "#2ca02c"):  # none, window, cliff
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        assert any(sum(abs(a - b) for a, b in zip(c, rgb)) < 40 for c in colours), hex_colour


def test_render_html_escapes_sources() -> None:
    traj = Trajectory(source="<script>x</script>", format="anthropic", dialect="anthropic",
                      messages=SESSION)
    html = render_html(replay([traj], ["none"], trigger=40, counter=WordCounter()))
    assert "<script>x" not in html and "&lt;script&gt;x" in html
