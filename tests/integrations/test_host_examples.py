"""The host frameworks' first examples (examples/*.py), run as written: each starts its own
stand-in model (the upstream simulator) and must finish its 30-step tool loop within its
trigger. docs/hosts.md shows each example file verbatim, after its ``<!-- example: -->``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.network, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {  # example file: (guide, the module it needs)
    "litellm_callback.py": ("hosts.md", "litellm"),
    "openai_agents_filter.py": ("hosts.md", "agents"),
    "pydantic_ai_capability.py": ("hosts.md", "pydantic_ai"),
    "adk_callback.py": ("hosts.md", "google.adk"),
}
REPORT = re.compile(r"^(\d+) model calls, \w+ request (\d+) tokens \(trigger (\d+)\)", re.M)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_guide_shows_the_example(name: str) -> None:
    guide = (ROOT / "docs" / EXAMPLES[name][0]).read_text()
    shown = re.search(rf"^<!-- example: examples/{re.escape(name)} -->\n```python\n(.*?)^```",
                      guide, re.M | re.S)
    assert shown and shown.group(1) == (ROOT / "examples" / name).read_text()


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_within_its_trigger(name: str, tmp_path: Path) -> None:
    if not _installed(EXAMPLES[name][1]):
        pytest.skip(f"{EXAMPLES[name][1]} is not installed")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
           "TIKTOKEN_CACHE_DIR": os.environ.get("TIKTOKEN_CACHE_DIR", ""), "NO_PROXY": "*"}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == "All steps read."
    found = REPORT.search(done.stdout)
    assert found, done.stdout
    calls, tokens, trigger = map(int, found.groups())
    assert calls == 31 and tokens <= trigger
