"""Fixtures for the LLM strategies: a loopback upstream simulator, histories, a hook log."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentcompact import CompactionEvent, SummaryCall, hookimpl, new_plugin_manager
from agentcompact._markers import COMPACTION_HEADER, SUMMARY_HEADER
from agentcompact.testing import RunningServer, Script, UpstreamSim, serve
from agentcompact.testing import digest_reply as digest_reply
from tests.tool_loop import Call, Step, tool_loop

WORDS = ("the build of src/app.py failed with FileNotFoundError at line 42 so we ran make "
         "test again and pytest reported 3 errors in tests/test_io.py ").split()


def words(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i) % len(WORDS)] for i in range(n))


def history(turns: int, result_words: int = 300, *, start: int = 0,
            human_every: int = 0) -> list[dict[str, Any]]:
    """A chat history (``tests.tool_loop``): system + task, then ``turns`` tool turns;
    turn ``k`` carries the marker ``TURN<k>`` in its call, result and (when
    ``human_every``) a user message."""
    steps = [Step([Call(f"call_{k}", "bash", {"cmd": f"make TURN{k}"},
                        f"TURN{k} output: " + words(result_words, k))],
                  f"Step TURN{k}: run make.",
                  human=f"User note TURN{k}: keep going." if human_every
                  and k % human_every == human_every - 1 else None)
             for k in range(start, start + turns)]
    return tool_loop("openai_chat", steps, system="You are a coding agent.",
                     task=None if start else "Fix the failing build. Never touch setup.cfg.")


def grow(msgs: list[dict[str, Any]], turns: int, **kw: Any) -> list[dict[str, Any]]:
    first = sum(1 for m in msgs if m["role"] == "assistant")
    return msgs + history(turns, start=first, **kw)


class HookLog:
    """Collects compaction events and summarizer calls."""

    def __init__(self) -> None:
        self.events: list[CompactionEvent] = []
        self.calls: list[SummaryCall] = []

    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        self.events.append(event)

    @hookimpl
    def agentcompact_log_summary_call(self, call: SummaryCall) -> None:
        self.calls.append(call)


@pytest.fixture
def log() -> HookLog:
    return HookLog()


@pytest.fixture
def pm(log: HookLog) -> Any:
    manager = new_plugin_manager()
    manager.register(log, name="test-log")
    return manager


@pytest.fixture
def sim() -> Iterator[Callable[..., RunningServer]]:
    """``sim(script=None, **UpstreamSim kwargs)`` starts a simulator on loopback."""
    servers: list[RunningServer] = []

    def start(script: Script | None = None, **kwargs: Any) -> RunningServer:
        server = serve(UpstreamSim(script or Script(then=digest_reply), **kwargs)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def client(server: RunningServer, **extra: Any) -> dict[str, Any]:
    return {"base_url": f"{server.base_url}/v1", "model": "sim-summarizer",
            "api_key": "sk-test", "max_retries": 0, **extra}


def prompt_of(request: Any) -> str:
    """All text the summarizer was sent in one recorded request."""
    return "\n".join(str(m.get("content")) for m in request.body["messages"])


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content)


def assert_clean_prompts(server: RunningServer) -> None:
    """Summarizer prompts hold original messages only: never one of our compactions."""
    for request in server.requests:
        text = prompt_of(request)
        assert SUMMARY_HEADER not in text and COMPACTION_HEADER not in text
        assert "agentcompact:" not in text
