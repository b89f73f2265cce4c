"""Regression tests of the engine's invariants (issue #12), one per behaviour: the engine
keeps them itself, for any strategy."""

from __future__ import annotations

import copy
import json
import logging
import traceback
from typing import Any

import pytest

from agentcompact import (
    DEFAULT_TARGET_FLOOR,
    DEFAULT_TARGET_SHARE,
    Budget,
    CompactionEvent,
    Engine,
    InMemoryPrefixStore,
    OverBudgetError,
    PluginError,
    ValidationError,
    get_dialect,
    hookimpl,
    new_plugin_manager,
    validate,
)
from agentcompact._turns import thinking_loop_error
from agentcompact.dialects import OpenAIChatDialect
from agentcompact.errors import DialectError
from agentcompact.strategies import CompactionRequest, Rendered
from tests.tool_loop import Call, Step, tool_loop

from .histories import build

PLAN = [(60, [1500, 200], 0), (40, [3000], 80), (0, [800, 800, 800], 0)] * 8
SECRET = "SECRET-7c1f"


def pm_with(*plugins: Any) -> Any:
    pm = new_plugin_manager()
    for plugin in plugins:
        pm.register(plugin)
    return pm


class Events:
    def __init__(self) -> None:
        self.seen: list[CompactionEvent] = []

    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        self.seen.append(event)


class Orphaning:
    """A third-party strategy whose message answers a tool call nobody issued."""

    name = "orphaning"

    def compact(self, request: CompactionRequest) -> Rendered:
        message = {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_nobody", "content": "x"}]}
        return Rendered(message, 10)


def test_store_only_after_validation() -> None:
    events = Events()
    store = InMemoryPrefixStore()
    e = Engine(Orphaning(), "anthropic", Budget(3000), store=store, plugins=pm_with(events))
    msgs = build("anthropic", PLAN)
    first = e.compact(msgs)
    assert first.compacted and events.seen[-1].fallback == "cliff"
    assert "orphan" in (events.seen[-1].error or "")
    stored = [entry.message for entry, _ in store._data.values()]
    assert stored and all("toolu_nobody" not in json.dumps(m) for m in stored)
    again = Engine(Orphaning(), "anthropic", Budget(3000), store=store).compact(msgs)
    assert again.messages == first.messages
    validate(again.messages, e.dialect, allow_pending=True)


def test_store_keys_include_the_settings_and_the_episode() -> None:
    store = InMemoryPrefixStore()
    msgs = build("openai_chat", PLAN)
    small = Engine("cliff", "openai_chat", Budget(4000), store=store,
                   plugins=new_plugin_manager())
    assert small.compact(msgs).compacted
    large = Engine("cliff", "openai_chat", Budget(10**6), store=store,
                   plugins=new_plugin_manager())
    r = large.compact(msgs)
    assert not r.modified and r.messages == msgs  # not the 4k engine's compaction
    same = Engine("cliff", "openai_chat", Budget(4000), store=store,
                  plugins=new_plugin_manager())
    assert same.fingerprint() == small.fingerprint() != large.fingerprint()
    events = Events()
    rollout = Engine("cliff", "openai_chat", Budget(4000), store=store,
                     plugins=pm_with(events), episode_id="ep-0")
    assert rollout.compact(msgs).compacted and events.seen
    rollout.compact(msgs)  # episode 0 again: the stored prefix, no new compaction
    n = len(events.seen)
    rollout.compact(msgs)
    assert len(events.seen) == n
    assert rollout.new_episode("ep-1") == "ep-1"
    r1 = rollout.compact(msgs)  # episode 1 compacts afresh, reported with its id
    assert r1.compacted and len(events.seen) > n and events.seen[-1].episode_id == "ep-1"


def _thinking_loop(steps: int) -> list[Any]:
    """One user prompt, then a long tool loop whose first assistant message alone carries
    signed thinking (as without interleaved thinking)."""
    return tool_loop("anthropic", [
        Step([Call(f"t{k}", "bash", {"cmd": f"step {k}"}, "output " * 300)],
             thinking="plan " * 50 if k == 0 else None, signature="sig")
        for k in range(steps)], task="Fix the bug.")


def test_thinking_is_not_cut_out_of_a_tool_loop() -> None:
    msgs = _thinking_loop(30)
    e = Engine("cliff", "anthropic", Budget(3000), plugins=new_plugin_manager())
    r = e.compact(msgs)
    assert thinking_loop_error(msgs, len(msgs), r.messages, e.dialect) is None
    validate(r.messages, e.dialect, allow_pending=True)
    # the cut never lands inside the loop on a message without thinking
    assert r.cut == 0 or r.cut <= 1 or r.messages[len(r.messages) - (len(msgs) - r.cut)][
        "content"][0]["type"] == "thinking"
    # with thinking on every step (interleaved), cutting inside the loop is fine
    for m in msgs[3::2]:
        m["content"].insert(0, {"type": "thinking", "thinking": "t", "signature": "s"})
    r2 = Engine("cliff", "anthropic", Budget(3000), plugins=new_plugin_manager()).compact(msgs)
    assert r2.compacted and r2.tokens_after < r2.tokens_original


def test_thinking_loop_rule_names_the_bad_shape() -> None:
    msgs = _thinking_loop(3)
    d = Engine(dialect="anthropic", plugins=new_plugin_manager()).dialect
    bad = [msgs[0], {"role": "user", "content": "[agentcompact: earlier turns compacted]"},
           *msgs[3:]]
    assert "without its thinking block" in (thinking_loop_error(msgs, len(msgs), bad, d) or "")


class PinRule:
    @hookimpl
    def agentcompact_pin(self, message: Any, index: int, dialect: Any) -> bool:
        return "RULE-42" in dialect.text_of(message)


def test_carried_text_is_carried_on_verbatim_in_rewrite_mode() -> None:
    msgs = build("openai_chat", PLAN[:6])
    msgs.insert(4, {"role": "user", "content": "RULE-42: never push to main."})
    e = Engine("cliff", "openai_chat", Budget(3000), plugins=pm_with(PinRule()))
    first = e.compact(msgs)
    assert first.compacted
    assert any("RULE-42" in str(m.get("content")) for m in first.messages)
    compaction = next(m for m in first.messages if e.dialect.is_synthetic(m))
    # a harness keeps what it sent (LangGraph mode="rewrite") and grows it
    grown = first.messages + build("openai_chat", PLAN)[len(build("openai_chat", [])):]
    second = Engine("cliff", "openai_chat", Budget(3000), plugins=new_plugin_manager()
                    ).compact(grown)
    assert second.compacted
    assert any(m is compaction for m in second.messages)  # carried, not re-rendered
    assert sum("RULE-42" in str(m.get("content")) for m in second.messages) >= 1


class Recording:
    """A strategy that needs at least 600 tokens and records what it was given."""

    name = "recording"
    min_budget_tokens = 600

    def __init__(self) -> None:
        self.budgets: list[int] = []

    def compact(self, request: CompactionRequest) -> Rendered:
        self.budgets.append(request.budget_tokens)
        if request.budget_tokens < self.min_budget_tokens:
            raise RuntimeError("budget too small")
        text = "[agentcompact: earlier turns compacted]\n\nsummary"
        return Rendered(request.dialect.text_message(text), 12)


def test_room_is_made_for_the_strategy_before_falling_back() -> None:
    msgs = build("openai_chat", [(60, [2000], 0), (60, [2000], 0)] * 8)
    strategy = Recording()
    events = Events()
    e = Engine(strategy, "openai_chat", Budget(6000), plugins=pm_with(events))
    r = e.compact(msgs)
    assert r.compacted and strategy.budgets and min(strategy.budgets) >= 600
    assert all(ev.fallback is None for ev in events.seen)


def test_strict_mode_refuses_even_when_nothing_was_modified() -> None:
    class Never:
        @hookimpl
        def agentcompact_should_compact(self, tokens: int) -> bool:
            return False

    msgs = build("openai_chat", PLAN)
    e = Engine("cliff", "openai_chat", Budget(3000), strict=True, plugins=pm_with(Never()))
    with pytest.raises(OverBudgetError) as info:
        e.compact(msgs)
    assert info.value.tokens > info.value.limit == 3000


def test_no_history_in_tracebacks() -> None:
    msgs = build("openai_chat", [(10, [100], 0)])
    msgs[-1]["content"] = SECRET + " x" * 40000
    e = Engine("cliff", "openai_chat", Budget(2000), strict=True, plugins=new_plugin_manager())
    with pytest.raises(OverBudgetError) as info:
        e.compact(msgs)
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert SECRET not in "".join(traceback.format_exception(info.value))

    class Raising:
        @hookimpl
        def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
            raise RuntimeError("observer broke")

    msgs = build("openai_chat", PLAN)
    msgs[1]["content"] = SECRET
    e = Engine("cliff", "openai_chat", Budget(3000), plugins=pm_with(Raising()))
    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append  # type: ignore[method-assign]
    logging.getLogger("agentcompact").addHandler(handler)
    try:
        assert e.compact(msgs).compacted  # a raising observer is warned about (#36)
    finally:
        logging.getLogger("agentcompact").removeHandler(handler)
    assert logged and all(SECRET not in r.getMessage() and r.exc_info is None for r in logged)


def test_foreign_error_messages_are_withheld_from_events_and_logs(
        caplog: pytest.LogCaptureFixture) -> None:
    class Leaky:
        name = "leaky"

        def compact(self, request: CompactionRequest) -> Rendered:
            raise ValueError(f"could not parse {request.dialect.text_of(request.messages[1])}")

    events = Events()
    msgs = build("openai_chat", PLAN)
    msgs[1]["content"] = SECRET
    with caplog.at_level(logging.WARNING, logger="agentcompact"):
        e = Engine(Leaky(), "openai_chat", Budget(3000), plugins=pm_with(events))
        e.compact(msgs)
        e.compact(msgs + [{"role": "user", "content": "more"}])
    assert events.seen and all(SECRET not in (ev.error or "") for ev in events.seen)
    assert "leaky: ValueError" in (events.seen[0].error or "")
    warnings = [r for r in caplog.records if r.name == "agentcompact"]
    assert len(warnings) == 1  # once per engine
    assert SECRET not in warnings[0].getMessage()


@pytest.mark.parametrize("odd", ["surrogate", "deep"])
def test_an_odd_message_does_not_disable_a_session(odd: str) -> None:
    msgs = build("openai_chat", PLAN)
    if odd == "surrogate":
        msgs[5] = {**msgs[5], "content": "broken \ud800 text"}
    else:
        deep: Any = {"leaf": 1}
        for _ in range(300):
            deep = {"x": [deep]}
        msgs[5] = {**msgs[5], "meta": deep}
    e = Engine("cliff", "openai_chat", Budget(3000), plugins=new_plugin_manager())
    r = e.compact(msgs)
    assert r.compacted and r.tokens_after <= 3000
    again = e.compact(msgs + [{"role": "assistant", "content": "ok"}])
    assert again.messages[: len(r.messages)] == r.messages  # the session goes on


def test_an_orphan_at_the_head_does_not_disable_compaction() -> None:
    msgs = build("openai_chat", PLAN)
    msgs.insert(2, {"role": "tool", "tool_call_id": "call_gone", "content": "stale"})
    events = Events()
    e = Engine("cliff", "openai_chat", Budget(3000), plugins=pm_with(events))
    r = e.compact(msgs)
    assert r.compacted and r.tokens_after <= 3000
    assert all(ev.error is None for ev in events.seen)
    assert r.messages[2] is msgs[2]  # the input's problem is kept, not made worse


class IgnoresPins:
    name = "ignores-pins"

    def compact(self, request: CompactionRequest) -> Rendered:
        text = "[agentcompact: earlier turns compacted]\n\nnothing kept"
        return Rendered(request.dialect.text_message(text), 12)


def test_the_engine_honours_pins_for_any_strategy() -> None:
    msgs = build("openai_chat", PLAN)
    msgs.insert(4, {"role": "user", "content": "RULE-42: keep the tests green."})
    events = Events()
    e = Engine(IgnoresPins(), "openai_chat", Budget(3000), plugins=pm_with(PinRule(), events))
    r = e.compact(msgs)
    assert r.compacted
    assert any("RULE-42: keep the tests green." in str(m.get("content")) for m in r.messages)
    assert events.seen[0].fallback == "cliff" and "pinned message 4" in (
        events.seen[0].error or "")


def test_hook_contracts_are_enforced() -> None:
    class Maybe:
        @hookimpl
        def agentcompact_should_compact(self, tokens: int) -> Any:
            return "yes"

    e = Engine("cliff", "openai_chat", Budget(3000), plugins=pm_with(Maybe()))
    with pytest.raises(PluginError, match="should_compact returned a str"):
        e.compact(build("openai_chat", PLAN))


def test_instructions_in_the_span_are_kept_verbatim_in_order() -> None:
    msgs = build("openai_chat", PLAN)
    dev1 = {"role": "developer", "content": "Use tabs."}
    dev2 = {"role": "system", "content": "Reply in English."}
    msgs.insert(6, dev1)
    msgs.insert(20, dev2)
    e = Engine("cliff", "openai_chat", Budget(3000), plugins=new_plugin_manager())
    r = e.compact(msgs)
    assert r.compacted
    at = [i for i, m in enumerate(r.messages) if m is dev1 or m is dev2]
    assert len(at) == 2 and r.messages[at[0]] is dev1 and at[0] < at[1]
    synthetic = next(i for i, m in enumerate(r.messages) if e.dialect.is_synthetic(m))
    assert at[1] < synthetic  # kept between the head and the compaction message
    validate(r.messages, e.dialect, allow_pending=True)


class Opaque(OpenAIChatDialect):
    name = "opaque_chat"  # type: ignore[misc]

    def is_opaque(self, message: Any) -> bool:
        return message.get("role") == "user" and "blob" in message


def test_opaque_items_are_kept_and_counted_by_their_json() -> None:
    msgs = build("openai_chat", PLAN)
    blob = {"role": "user", "content": "", "blob": {"tools": ["t" * 40] * 100}}
    msgs.insert(6, blob)
    d = Opaque()
    e = Engine("cliff", d, Budget(3000), plugins=new_plugin_manager())
    assert e.count([blob]) > 1000  # its real size, not a placeholder
    r = e.compact(msgs)
    assert r.compacted and any(m is blob for m in r.messages)


def test_a_kept_message_keeps_its_tool_calls_paired() -> None:
    """An opaque message (a block no dialect models) kept verbatim in the span that
    issues a tool call: its result is kept with it. Rendering the result into the
    compaction text left the kept call unanswered before the compaction message, which
    passed as "pending" and was stored; the next call sent it (Anthropic refuses it)."""
    msgs = build("anthropic", PLAN)
    server = {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_kept", "name": "bash", "input": {"cmd": "ls"}},
        {"type": "x_future_block", "payload": {"note": "not modelled"}}]}
    answer = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_kept", "content": "src tests"}]}
    at = next(i for i in range(4, len(msgs)) if msgs[i]["role"] == "assistant")
    msgs[at:at] = [server, answer]
    events = Events()
    e = Engine("cliff", "anthropic", Budget(3000), plugins=pm_with(events))
    validate(msgs, e.dialect)
    r = e.compact(msgs)
    assert r.compacted and any(m is server for m in r.messages)
    assert any(m is answer for m in r.messages)
    assert events.seen and all(ev.error is None for ev in events.seen)
    validate(r.messages, e.dialect, allow_pending=True)
    after = msgs + [{"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    validate(e.compact(after).messages, e.dialect, allow_pending=True)  # the stored prefix


@pytest.mark.parametrize("dialect", ["openai_chat", "anthropic"])
def test_a_call_followed_by_a_message_that_does_not_answer_it_is_refused(dialect: str
                                                                         ) -> None:
    """``allow_pending`` lets a history end with calls not yet run, never have a message
    after them that answers none (both providers want the results first)."""
    if dialect == "anthropic":
        call: dict[str, Any] = {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}]}
        text: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    else:
        call = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "bash",
                                                              "arguments": "{}"}}]}
        text = {"role": "user", "content": "hi"}
    task = {"role": "user", "content": "Fix it."}
    d = get_dialect(dialect)
    validate([task, call], d, allow_pending=True)
    with pytest.raises(ValidationError, match=r"issued by message 1 has no result before "
                                              r"message 2"):
        validate([task, call, text], d, allow_pending=True)


def test_default_target_accounts_for_the_fixed_part() -> None:
    b = Budget(30_000)
    assert b.target == int(30_000 * DEFAULT_TARGET_SHARE)
    assert b.target_for(20_000) == 20_000 + 10_000 // 2  # the floor, at most half the rest
    assert Budget(12_000).target == DEFAULT_TARGET_FLOOR  # the floor, not 0.26 x 12k
    assert b.target_for(40_000) == 40_000
    assert Budget(30_000, 9_000).target_for(20_000) == 9_000
    # a fixed part above a quarter of the trigger: the newest tool result stays whole
    msgs = build("openai_chat", [(60, [1500], 0)] * 12)
    newest = copy.deepcopy(msgs[-1])
    e = Engine("cliff", "openai_chat", Budget(6000), plugins=new_plugin_manager())
    r = e.compact(msgs, fixed_tokens=3000)
    assert r.compacted and r.messages[-1] == newest
    assert r.events and all(ev.tokens_after <= e.budget.target_for(3000) + 50
                            for ev in r.events)


def test_newest_turn_is_truncated_only_after_older_kept_turns() -> None:
    msgs = build("openai_chat", [(60, [1500], 0)] * 6)
    msgs[-1] = {**msgs[-1], "content": "NEWEST " + "line\n" * 600}
    msgs[-3] = {**msgs[-3], "content": "OLDER " + "line\n" * 2500}
    e = Engine("cliff", "openai_chat", Budget(5000, 2200, min_recent_turns=2, recent_turns=2),
               plugins=new_plugin_manager())
    r = e.compact(msgs)
    assert r.compacted
    assert "chars omitted" in r.messages[-3]["content"]
    assert r.messages[-1] is msgs[-1]  # older kept turn truncated first: that was enough


def test_errors_name_the_problem_without_content() -> None:
    events = Events()
    e = Engine(Orphaning(), "anthropic", Budget(3000), plugins=pm_with(events))
    msgs = build("anthropic", PLAN)
    msgs[0]["content"] = SECRET
    e.compact(msgs)
    assert events.seen and SECRET not in (events.seen[0].error or "")
    assert "message" in (events.seen[0].error or "")


class Refusing(OpenAIChatDialect):
    """A provider that refuses every compaction message (its rule, our dialect)."""

    name = "refusing_chat"  # type: ignore[misc]

    def check_order(self, messages: Any) -> None:
        from agentcompact import ValidationError

        for i, m in enumerate(messages):
            if self.is_synthetic(m):
                raise ValidationError(f"refusing_chat: message {i} is refused", i)


def test_every_rung_is_validated_and_a_failed_chain_sends_the_history() -> None:
    events = Events()
    msgs = build("openai_chat", PLAN)
    store = InMemoryPrefixStore()
    e = Engine("cliff", Refusing(), Budget(3000), store=store, plugins=pm_with(events))
    r = e.compact(msgs)
    assert not r.modified and not r.compacted and r.messages == msgs
    event = events.seen[-1]
    assert event.fallback == "none"
    assert "cliff: output failed validation" in (event.error or "")
    assert "safe: output failed validation" in (event.error or "")
    assert len(store) == 0  # nothing invalid was stored


def test_a_fixed_part_at_the_trigger_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    msgs = build("openai_chat", PLAN)
    e = Engine("cliff", "openai_chat", Budget(3000), plugins=new_plugin_manager())
    with caplog.at_level(logging.WARNING, logger="agentcompact"):
        e.compact(msgs, fixed_tokens=3500)
        e.compact(msgs + [{"role": "user", "content": "more"}], fixed_tokens=3500)
    fixed = [r for r in caplog.records if "fixed part" in r.getMessage()]
    assert len(fixed) == 1 and fixed[0].args[0] >= 3500  # type: ignore[index]


def test_deeply_nested_tool_input_is_rendered_by_cliff_not_the_safe_rung() -> None:
    """A tool_use input nested deeper than orjson takes (> 255 levels) is rendered by cliff's
    own JSON fallback: the compaction does not fall to the safe rung."""
    deep: dict[str, Any] = {}
    cur = deep
    for _ in range(300):
        cur["a"] = {}
        cur = cur["a"]
    msgs: list[Any] = [{"role": "user", "content": "go " * 50}]
    for k in range(40):
        msgs.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"t{k}", "name": "x",
             "input": deep if k == 3 else {"q": 1}}]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{k}", "content": "out " * 300}]})
    result = Engine(dialect="anthropic", budget=Budget(trigger_tokens=8000)).compact(msgs)
    assert result.compacted
    assert result.event is not None and result.event.fallback is None, result.event.error


@pytest.mark.parametrize("bad", [7, None, "a string", ["a", "list"]])
def test_a_non_message_is_named_by_index_and_type_never_content(bad: Any) -> None:
    msgs: list[Any] = []
    for _ in range(12):
        msgs += [{"role": "user", "content": "hi " * 40},
                 {"role": "assistant", "content": "ok " * 40}]
    msgs.insert(5, bad)
    with pytest.raises(DialectError) as info:
        Engine(dialect="openai_chat", budget=Budget(trigger_tokens=300)).compact(msgs)
    text = str(info.value)
    assert text.startswith(f"message 5 ({type(bad).__name__})"), text
    assert "a string" not in text and "hi hi" not in text
