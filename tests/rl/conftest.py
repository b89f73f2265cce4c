"""tests/rl without the ``rl`` / ``export`` extras: modules that need torch (or pyarrow, which
``agentcompact.rl`` itself imports) are not collected when it is missing, so the suite
skips them cleanly instead of failing at collection."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_HERE = Path(__file__).parent


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ValueError:  # in sys.modules as None: blocked
        return True


def _needs_torch(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    return "import torch" in text or 'importorskip("torch")' in text or path.name == "test_docs.py"


collect_ignore: list[str] = []
if _missing("pyarrow") or _missing("numpy"):
    collect_ignore = [p.name for p in _HERE.glob("test_*.py")]
elif _missing("torch"):
    collect_ignore = [p.name for p in _HERE.glob("test_*.py") if _needs_torch(p)]
