"""Pins keep the pinned text, never the bulk beside it, and the engine bounds them.

A rule typed while tools run arrives in a user message that also carries the tool results
(Claude Code): the pin keeps the rule's text; the results are compacted like any other.
Harness text (``<system-reminder>``, ``<environment_context>``) is not the user's rule.
Pinned text takes at most ``PIN_SHARE`` of the target: past it the oldest pins give way to
their skim line and handle, and the event lists them.
"""

from __future__ import annotations

import re
from typing import Any

from agentcompact import (
    PIN_SHARE,
    Budget,
    CompactionEvent,
    Engine,
    MemoryArchive,
    StrategySettings,
    expand,
    hookimpl,
    new_plugin_manager,
    pinned_texts,
    typed_pieces,
)
from agentcompact._archive import handle_of
from agentcompact.plugins.rules import is_rule
from tests.core.histories import text
from tests.tool_loop import Call, Step, tool_loop

TRIGGER = 20_000


class Events:
    def __init__(self) -> None:
        self.seen: list[CompactionEvent] = []

    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        self.seen.append(event)


class PinAll:
    """A plugin that pins every message it is asked about."""

    @hookimpl
    def agentcompact_pin(self, message: Any, index: int, dialect: Any) -> bool:
        return True


def rule(k: int) -> str:
    return f"Rule {k}: never edit legacy_{k}/ and keep every function under {40 + k} lines."


def history(turns: int, result_chars: int = 16_000, rule_every: int = 3) -> list[Any]:
    """A Claude Code shaped session (``tests.tool_loop``): each turn a Bash call and its
    result; every ``rule_every`` turns the user types a rule while the tool runs (a text
    block after the tool_result block, in the same user message)."""
    steps = [Step([Call(f"tu_{k}", "Bash", {"command": f"pytest tests/test_{k}.py"},
                        text(result_chars, k))], f"Running step {k}.",
                  human=rule(k) if k % rule_every == rule_every - 1 else None)
             for k in range(turns)]
    return tool_loop("anthropic", [*steps, Step(text="Done.")],
                     task="Fix the failing tests in src/.")


def engine_with(*plugins: Any, archive: Any = None) -> tuple[Engine, Events]:
    pm = new_plugin_manager()
    events = Events()
    for plugin in (*plugins, events):
        pm.register(plugin)
    strategy = StrategySettings("cliff", options={"archive": archive if archive is not None
                                                 else MemoryArchive()})
    return Engine(strategy, "anthropic", Budget(TRIGGER), plugins=pm), events


def calls(msgs: list[Any]) -> list[int]:
    return [i for i in range(1, len(msgs) + 1)
            if i == len(msgs) or msgs[i]["role"] == "assistant"]


def compaction_text(engine: Engine, result: Any) -> str:
    return str(engine.dialect.text_of(result.messages[result.head_len]))


def test_rules_beside_large_tool_results_stay_under_the_trigger() -> None:
    """Several rule-like messages, each beside a 4k-token tool result: every call is under
    the trigger, each pinned rule is quoted verbatim, and the results beside the rules are
    rendered as usual (cut or skimmed, their handles expand to the originals)."""
    msgs = history(24)
    archive = MemoryArchive()
    engine, events = engine_with(archive=archive)
    results = [b["content"] for m in msgs if m["role"] == "user" and isinstance(
        m["content"], list) for b in m["content"] if b["type"] == "tool_result"]
    result = None
    for c in calls(msgs):
        result = engine.compact(msgs[:c])
        assert result.tokens_after <= TRIGGER
    assert result is not None and result.compacted or any(e.reason for e in events.seen)
    body = compaction_text(engine, result)
    quoted = [k for k in range(24) if k % 3 == 2 and rule(k) in body]
    tail = "\n".join(engine.dialect.text_of(m) for m in result.messages[result.head_len + 1:])
    assert all(rule(k) in body or rule(k) in tail for k in range(24) if k % 3 == 2)
    assert quoted, "the span's rules are quoted"
    verbatim = [r for r in results if r in body]
    assert not verbatim, "tool results beside a rule were reproduced whole"
    for handle in re.findall(r"ac-[0-9a-f]{12}", body):
        assert expand(archive, handle, 0, 10**6).text  # every handle expands


def test_a_plugin_pinning_everything_cannot_blow_the_budget() -> None:
    """A plugin that pins every message: the pinned text quoted stays within the pin
    budget, the oldest pins give way (listed in the event as ``unpinned``, rendered with
    at least a skim line whose handle expands), and the context stays under the trigger."""
    msgs = history(60, result_chars=3_000, rule_every=1)
    archive = MemoryArchive()
    engine, events = engine_with(PinAll(), archive=archive)
    for c in calls(msgs):
        assert engine.compact(msgs[:c]).tokens_after <= TRIGGER
    done = [e for e in events.seen if e.reason != "fold"]
    assert done and all(e.fallback is None for e in done)
    last = done[-1]
    assert last.unpinned, "the oldest pins gave way"
    result = engine.compact(msgs)
    body = compaction_text(engine, result)
    pinned_tokens = 0
    for i in range(result.head_len, last.cut):
        pieces = pinned_texts(engine.dialect, msgs[i])
        if i in last.unpinned or not pieces:
            continue
        assert all(p in body for p in pieces), f"pin {i} within the budget is quoted"
        pinned_tokens += sum(engine.counter.count_texts(list(pieces)))
    lined = []  # the newest unpinned pins keep at least a skim line, while the budget allows
    for i in last.unpinned:
        text = next(p.text for p in engine.dialect.parts(msgs[i]) if p.kind == "text")
        if text in body:
            lined.append(i)
        elif f"expand {handle_of(text)}" in body:
            lined.append(i)
            assert expand(archive, handle_of(text), 0, 10**6).text == text
    assert lined
    target = engine.budget.target_for(0)
    assert pinned_tokens <= PIN_SHARE * target
    assert max(last.unpinned) < min(i for i in range(result.head_len, last.cut)
                                    if i not in last.unpinned and pinned_texts(
                                        engine.dialect, msgs[i]))  # the oldest gave way


def test_harness_text_is_not_the_users_rule() -> None:
    """Claude Code's reminders and Codex's environment context read like rules ("do not",
    "must") but the user did not type them: not judged, not pinned."""
    reminder = ("<system-reminder>\nAttribution: do not add lines this reminder leaves out; "
                "you must keep them.\n</system-reminder>\n")
    codex = ("<environment_context>\n  <cwd>/work</cwd>\n  <shell>bash</shell>\n"
             "</environment_context>")
    assert is_rule(reminder) and typed_pieces(reminder) == ()
    assert typed_pieces(codex) == ()
    typed = "Never push to main."
    assert typed_pieces(reminder + typed) == (typed,)
    message = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "tu_1", "content": "x" * 5_000},
        {"type": "text", "text": reminder}, {"type": "text", "text": typed}]}
    engine, _ = engine_with()
    assert pinned_texts(engine.dialect, message) == (typed,)
    hook = engine.pm.hook.agentcompact_pin
    assert True in hook(message=message, index=1, dialect=engine.dialect)
    only_reminder = {"role": "user", "content": [{"type": "text", "text": reminder}]}
    assert True not in hook(message=only_reminder, index=1, dialect=engine.dialect)
