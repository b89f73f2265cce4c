"""An ``on_compaction`` observer that raises (#36 item 12). The compaction is validated
and stored before observers run, so it stands: the call returns it, the caller sends it,
the store and every other observer (a recorder) see the same one compaction. Before, the
raise escaped ``compact``: the caller forwarded the history unchanged while the store
kept the entry, and the next call reused it with no compaction counted anywhere."""

from __future__ import annotations

import logging
import traceback

import pytest

from agentcompact import (
    Budget,
    CompactionEvent,
    Engine,
    InMemoryPrefixStore,
    hookimpl,
    new_plugin_manager,
)

from .histories import build

PLAN = [(60, [1500, 200], 0), (40, [3000], 80), (0, [800, 800, 800], 0)] * 8
SECRET = "SECRET-item12"


class Raising:
    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        raise RuntimeError(f"observer broke on {SECRET}")


class Recording:
    def __init__(self) -> None:
        self.events: list[CompactionEvent] = []

    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        self.events.append(event)


@pytest.mark.parametrize("recorder_first", [True, False])
def test_a_raising_observer_cannot_undo_a_stored_compaction(
        recorder_first: bool, caplog: pytest.LogCaptureFixture) -> None:
    pm = new_plugin_manager()
    recording = Recording()
    # pluggy calls the last registered first: the recorder runs after the raising
    # observer in one order, before it in the other
    for plugin in ((Raising(), recording) if recorder_first else (recording, Raising())):
        pm.register(plugin)
    store = InMemoryPrefixStore()
    engine = Engine("cliff", "openai_chat", Budget(3000), plugins=pm, store=store)
    msgs = build("openai_chat", PLAN)
    msgs[1]["content"] = SECRET + " " + msgs[1]["content"]
    with caplog.at_level(logging.WARNING, logger="agentcompact"):
        first = engine.compact(msgs)
    assert first.compacted and first.modified and first.tokens_after <= 3000
    assert len(recording.events) == len(first.events) >= 1
    assert recording.events[-1] is first.event
    assert len(store) >= 1  # what is stored is what was returned
    warnings = [r for r in caplog.records if "agentcompact_on_compaction" in r.getMessage()]
    assert len(warnings) == 1 and "RuntimeError" in warnings[0].getMessage()
    assert SECRET not in caplog.text
    assert not any(r.exc_info for r in caplog.records)
    # the next call reuses the stored compaction: the same prefix, nothing new
    nxt = msgs + [{"role": "user", "content": "one more"}]
    again = engine.compact(nxt)
    assert not again.compacted and again.modified
    assert again.messages[:len(first.messages)] == first.messages
    assert len(recording.events) == len(first.events)


def test_the_warning_is_once_per_plugin_and_names_no_content(
        caplog: pytest.LogCaptureFixture) -> None:
    pm = new_plugin_manager()
    pm.register(Raising(), name="broken-observer")
    engine = Engine("cliff", "openai_chat", Budget(3000), plugins=pm)
    with caplog.at_level(logging.WARNING, logger="agentcompact"):
        for k in range(3):
            msgs = build("openai_chat", PLAN)
            msgs[1]["content"] = f"{SECRET} {k} " + msgs[1]["content"]
            assert engine.compact(msgs).compacted
    lines = [r.getMessage() for r in caplog.records
             if "agentcompact_on_compaction" in r.getMessage()]
    assert len(lines) == 1 and "broken-observer" in lines[0]
    assert SECRET not in "".join(traceback.format_stack()) + caplog.text


async def test_the_async_path_keeps_the_compaction_too() -> None:
    pm = new_plugin_manager()
    recording = Recording()
    pm.register(recording)
    pm.register(Raising())
    engine = Engine("cliff", "openai_chat", Budget(3000), plugins=pm)
    result = await engine.acompact(build("openai_chat", PLAN))
    assert result.compacted and recording.events[-1] is result.event


def test_observers_without_failures_see_each_event_once(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    pm = new_plugin_manager()
    a, b = Recording(), Recording()
    pm.register(a)
    pm.register(b)
    result = Engine("cliff", "openai_chat", Budget(3000), plugins=pm).compact(
        build("openai_chat", PLAN))
    assert a.events == b.events == result.events and len(result.events) >= 1
    assert not caplog.records
