"""The integration guides' examples, executed: every ```python block of docs/langgraph.md,
docs/llamaindex.md and docs/sdk.md runs as its own script against the upstream simulator
(``OPENAI_BASE_URL`` points at it). ```py blocks are illustrative and not run."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentcompact.testing import Reply, RunningServer, Script, serve

pytestmark = pytest.mark.network

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("langgraph.md", "llamaindex.md", "sdk.md")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
TOOL_TURNS = 4  # tool calls before each final answer


def examples() -> list[Any]:
    found = []
    for page in PAGES:
        for n, code in enumerate(BLOCK.findall((DOCS / page).read_text())):
            found.append(pytest.param(code, id=f"{page}-{n}"))
    return found


def agent_model() -> Script:
    """Calls ``read_file`` when tools are offered, every fifth answer is final text."""
    counter = itertools.count()

    def answer(body: dict[str, Any]) -> Reply:
        k = next(counter)
        if body.get("tools") and k % (TOOL_TURNS + 1) != TOOL_TURNS:
            return Reply.tool("read_file", {"path": f"src/module_{k}.py"})
        return Reply(f"done ({k})")

    return Script(then=answer)


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serve_sim() as running:
        yield running


def serve_sim() -> RunningServer:
    from agentcompact.testing import UpstreamSim

    return serve(UpstreamSim(agent_model()))


def test_every_guide_has_an_example() -> None:
    for page in PAGES:
        assert BLOCK.findall((DOCS / page).read_text()), page


@pytest.mark.parametrize("code", examples())
def test_doc_example_runs(code: str, server: RunningServer, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url + "/v1", "OPENAI_API_KEY": "x",
           "PYTHONWARNINGS": "error::DeprecationWarning:__main__"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip()
    assert any(r.path == "/v1/chat/completions" for r in server.requests)
