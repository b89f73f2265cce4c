"""Shared test fixtures: where the shared data lives, offline tiktoken."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: ../shared/data beside the project root (CI lays it there); absent in a user's clone.
SHARED_DATA = Path(os.environ.get("AGENTCOMPACT_SHARED_DATA", ROOT.parent / "shared" / "data"))
TRAJECTORIES = SHARED_DATA / "trajectories"
QWEN_TOKENIZER = SHARED_DATA / "tokenizers" / "qwen2.5-coder-0.5b-instruct"

if "TIKTOKEN_CACHE_DIR" not in os.environ and (SHARED_DATA / "tiktoken").is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED_DATA / "tiktoken")


def needs_shared_data(*parts: str) -> pytest.MarkDecorator:
    """Skip unless ``../shared/data/<parts>`` exists."""
    path = SHARED_DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"shared data absent: {path}")


@pytest.fixture(autouse=True)
def _private_state_dir(monkeypatch: pytest.MonkeyPatch,
                       tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each test's proxies keep their default store (``AGENTCOMPACT_STATE_DIR``) in a
    folder of their own, never in ``~/.agentcompact`` nor shared with another test (the
    folder is made only when a store opens it)."""
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("AGENTCOMPACT_STATE_DIR", str(base / f"state-{next(_STATE_DIRS)}"))


_STATE_DIRS = itertools.count()


@pytest.fixture(autouse=True)
def _fresh_backend_health() -> Iterator[None]:
    """A failing store location is left alone for ``retry_after`` by every store of the
    process on it (``agentcompact.stores._shared``): each test starts with every location
    healthy, as a process would, not with what an earlier test's outage left."""
    from agentcompact.stores import _shared

    with _shared._lanes_lock:
        _shared._lanes.clear()
    yield


@pytest.fixture(autouse=True)
def _loggers_restored() -> Iterator[None]:
    """What a test leaves on the root and ``agentcompact`` loggers is undone after it: the
    CLIs add a handler on the stream that is stderr when they run (a test's captured
    stream, closed after it), verl's import configures the root logger and SkyRL routes it
    through loguru."""
    import logging

    saved = [(lg, list(lg.handlers), lg.level)
             for lg in (logging.getLogger(), logging.getLogger("agentcompact"))]
    yield
    for logger, handlers, level in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
