"""Fixtures shared by the integration tests: a plugin manager that collects what the
integrations log (model calls) and what the engine reports (compaction events)."""

from __future__ import annotations

from typing import Any

import pytest

from agentcompact import CompactionEvent, ModelCall, hookimpl, new_plugin_manager


class Collector:
    def __init__(self) -> None:
        self.calls: list[ModelCall] = []
        self.events: list[CompactionEvent] = []

    @hookimpl
    def agentcompact_log_model_call(self, call: ModelCall) -> None:
        self.calls.append(call)

    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        self.events.append(event)


@pytest.fixture
def collector() -> Collector:
    return Collector()


@pytest.fixture
def pm(collector: Collector) -> Any:
    pm = new_plugin_manager()
    pm.register(collector)
    return pm
