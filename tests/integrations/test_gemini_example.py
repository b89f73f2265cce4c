"""docs/gemini.md's first example is examples/gemini_proxy.py, and it runs as written,
offline (the simulator plays the Gemini API, the Google Gen AI SDK is the client)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.network

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gemini_proxy.py"


def test_the_page_shows_the_example_file() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "gemini.md").read_text(),
                        re.M | re.S)
    assert blocks and blocks[0] == EXAMPLE.read_text()


def test_the_example_runs_as_written(tmp_path: Path) -> None:
    pytest.importorskip("google.genai")
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONWARNINGS": "error::DeprecationWarning"}
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "All steps done."
    sent, upstream = map(int, re.findall(r"\d+", lines[1]))
    assert sent == 61 and upstream < sent
    assert lines[2] == "[agentcompact: earlier turns compacted]"
    assert list(tmp_path.iterdir()) == []  # nothing written (an in-memory store)
