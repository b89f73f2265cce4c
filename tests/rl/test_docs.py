"""Every ```python block of docs/rl-math.md runs (``python notest`` blocks need a trainer)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "rl-math.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.M | re.S)


def test_the_page_has_runnable_examples() -> None:
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_doc_example_runs(code: str) -> None:
    exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})
