"""The built-in rules plugin pins rule-like user text; users can turn it off; the floor
keeps carried human text when a large kept tool output leaves no room."""

from __future__ import annotations

from typing import Any

import pytest

from agentcompact import Budget, Engine, StrategySettings, expand, new_plugin_manager
from agentcompact._archive import MemoryArchive, handle_of
from agentcompact.plugins.rules import PLUGIN_NAME, is_rule
from tests.core.histories import build

RULE = "Never touch the vendor/ folder, and keep every reply under 200 words."


@pytest.mark.parametrize(("text", "expected"), [
    (RULE, True), ("You must not push to main.", True), ("do not run the migrations", True),
    ("at most 3 retries", True), ("Thanks, that looks good.", False),
    ("Never " + "x" * 3_000, False),  # a long paste is history, not a rule
])
def test_rule_shapes(text: str, expected: bool) -> None:
    assert is_rule(text) is expected


def history_with_rule() -> list[Any]:
    msgs = build("openai_chat", [(200, [1500], 0)] * 3 + [(100, [300], 60)] * 2
                 + [(200, [1500], 0)] * 12)
    msgs.insert(4, {"role": "user", "content": RULE})
    return msgs


def sent_text(engine: Engine, msgs: list[Any]) -> str:
    return "\n".join(engine.dialect.text_of(m) for m in engine.compact(msgs).messages)


def test_rule_pinned_by_default_and_off_when_unregistered() -> None:
    msgs = history_with_rule()
    pm = new_plugin_manager()
    assert pm.has_plugin(PLUGIN_NAME)
    # human text carried is dropped last; a tiny target drops it unless pinned
    budget = Budget(3000, 400, recent_turns=1)
    strategy = {"human_floor_tokens": 0}
    assert RULE in sent_text(Engine(StrategySettings("cliff", options=strategy), "openai_chat",
                                    budget, plugins=pm), msgs)
    off = new_plugin_manager()
    off.unregister(name=PLUGIN_NAME)
    assert RULE not in sent_text(Engine(StrategySettings("cliff", options=strategy), "openai_chat",
                                        budget, plugins=off), msgs)


def test_environment_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTCOMPACT_PIN_RULES", "0")
    assert not new_plugin_manager().has_plugin(PLUGIN_NAME)
    monkeypatch.setenv("AGENTCOMPACT_PIN_RULES", "1")
    assert new_plugin_manager().has_plugin(PLUGIN_NAME)


def test_floor_keeps_human_text_when_a_kept_result_is_huge() -> None:
    """A 15k-token tool result in the kept turn: earlier human text keeps its room and the
    huge result is truncated (its handle expands to the original) instead."""
    msgs = build("openai_chat", [(200, [1500], 80)] * 10 + [(100, [60_000], 0)])
    pm = new_plugin_manager()
    pm.unregister(name=PLUGIN_NAME)  # the floor alone, no pins
    archive = MemoryArchive()
    engine = Engine(StrategySettings("cliff", options={"archive": archive}), "openai_chat",
                    Budget(12_000, 6_000, recent_turns=1), plugins=pm)
    result = engine.compact(msgs)
    text = "\n".join(engine.dialect.text_of(m) for m in result.messages)
    humans = [m["content"] for m in msgs[2:] if m["role"] == "user"]
    assert humans and all(h in text for h in humans)
    huge = msgs[-1]["content"]
    assert huge not in text and f"expand {handle_of(huge)}" in text
    assert expand(archive, handle_of(huge), 0, 10**6).text == huge
    assert result.tokens_after <= 6_000 * 1.1


def test_newest_turn_stays_whole_over_the_target_while_the_trigger_is_met() -> None:
    """The target is a goal: a newest tool result above it (not above the trigger) is sent
    whole, and the compaction message keeps its floor for earlier human text."""
    msgs = build("openai_chat", [(200, [1500], 80)] * 14 + [(100, [36_000], 0)])
    pm = new_plugin_manager()
    pm.unregister(name=PLUGIN_NAME)  # the floor alone, no pins
    engine = Engine("cliff", "openai_chat", Budget(16_000, 6_000, recent_turns=1), plugins=pm)
    newest = engine.count(msgs[-1:])
    assert 6_000 < newest < 13_000 and engine.count(msgs) > 16_000  # over the target
    result = engine.compact(msgs)
    assert result.compacted and result.messages[-1] == msgs[-1]  # not truncated
    text = engine.dialect.text_of(result.messages[result.head_len])
    humans = [m["content"] for m in msgs[2:] if m["role"] == "user"]
    assert humans and all(h in text for h in humans)
    assert 6_000 < result.tokens_after <= 16_000
