"""pytest plugin for agentcompact plugin authors (entry point ``pytest11``).

Fixtures:

- ``agentcompact_pm``: a fresh plugin manager with the built-in dialects and strategies,
  and no installed plugins; register your plugin on it and pass it as ``plugins=``.
- ``agentcompact_engine``: a factory ``(strategy="cliff", dialect="openai_chat",
  **kwargs) -> Engine`` bound to ``agentcompact_pm``.
- ``agentcompact_events``: a list that receives every ``CompactionEvent`` fired through
  ``agentcompact_pm``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy
import pytest

from ._engine import Engine
from ._events import CompactionEvent
from ._hookspecs import hookimpl
from ._pluginmanager import new_plugin_manager

__all__ = ["agentcompact_engine", "agentcompact_events", "agentcompact_pm"]


@pytest.fixture
def agentcompact_pm() -> pluggy.PluginManager:
    """A fresh, isolated plugin manager (built-ins only)."""
    return new_plugin_manager()


@pytest.fixture
def agentcompact_events(agentcompact_pm: pluggy.PluginManager) -> list[CompactionEvent]:
    """Every compaction event fired through ``agentcompact_pm``."""
    events: list[CompactionEvent] = []

    class Collector:
        @hookimpl
        def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
            events.append(event)

    agentcompact_pm.register(Collector(), name="agentcompact-test-collector")
    return events


@pytest.fixture
def agentcompact_engine(agentcompact_pm: pluggy.PluginManager) -> Callable[..., Engine]:
    """Build engines bound to ``agentcompact_pm``."""

    def make(strategy: Any = "cliff", dialect: Any = "openai_chat", **kwargs: Any) -> Engine:
        kwargs.setdefault("plugins", agentcompact_pm)
        return Engine(strategy=strategy, dialect=dialect, **kwargs)

    return make
