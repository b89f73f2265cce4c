"""tests/rl without the ``rl`` / ``export`` extras: the modules that need torch skip, with
the reason shown by ``pytest -rs``, when torch is missing (``tox -e py``; ``tox -e rl`` runs
them); all of tests/rl skips without pyarrow or numpy, which ``agentcompact.rl`` imports."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).parent
NEEDS_TORCH = "needs torch (the rl extra): tox -e rl runs it"
NEEDS_ARRAYS = "needs pyarrow and numpy (the export and rl extras): tox -e py runs it"


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ValueError:  # in sys.modules as None: blocked
        return True


def _needs_torch(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    return "import torch" in text or 'importorskip("torch")' in text or path.name == "test_docs.py"


def _skip_reason(path: Path) -> str | None:
    if _missing("pyarrow") or _missing("numpy"):
        return NEEDS_ARRAYS
    if _missing("torch") and _needs_torch(path):
        return NEEDS_TORCH
    return None


class _Skipped(pytest.Module):
    """A test module that is not imported: it reports one skip with its reason."""

    reason = ""

    def _getobj(self) -> Any:
        pytest.skip(self.reason, allow_module_level=True)


def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    reason = _skip_reason(module_path) if module_path.name.startswith("test_") else None
    if reason is None:
        return None
    module = _Skipped.from_parent(parent, path=module_path)
    module.reason = reason
    return module

