"""Fixtures shared by the integration tests: a plugin manager that collects what the
integrations log (model calls) and what the engine reports (compaction events)."""

from __future__ import annotations

from typing import Any

import pytest

from agentcompact import Budget, CompactionEvent, ModelCall, hookimpl, new_plugin_manager


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


_METERS: dict[str, Any] = {}
_KEYS = {"openai_chat": "messages", "openai_responses": "input", "anthropic": "messages"}


def sent_tokens(body: dict[str, Any], dialect: str = "openai_chat") -> int:
    """Tokens of what the provider received in ``body`` (messages, system / instructions
    and tool schemas), counted the way the engine counts (tiktoken o200k)."""
    from agentcompact import Engine

    meter = _METERS.get(dialect)
    if meter is None:
        meter = _METERS[dialect] = Engine(dialect=dialect, budget=Budget(trigger_tokens=10**9))
    messages = body.get(_KEYS[dialect])
    count = meter.count(messages) if isinstance(messages, list) else 0
    return int(count + meter.fixed_tokens(body))


def largest_request(server: Any, path: str, dialect: str = "openai_chat") -> int:
    """The largest request ``server`` received on ``path``, in tokens (see sent_tokens)."""
    sizes = [sent_tokens(r.body, dialect) for r in server.requests if r.path == path]
    assert sizes, f"no request reached {path}"
    return max(sizes)
