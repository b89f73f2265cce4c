from __future__ import annotations

from typing import Any

import pytest

from agentcompact import Budget, Engine, get_dialect, hookimpl, new_plugin_manager
from agentcompact._tokens import MessageMeter, TiktokenCounter
from agentcompact.strategies import CompactionRequest
from agentcompact.strategies._cliff import DEFAULT_LEVELS, CliffStrategy, render_segments

from .histories import build

DIALECTS = ["openai_chat", "anthropic", "openai_responses", "gemini"]
PLAN = [(60, [1500, 200], 0), (2500, [3000], 80), (0, [800, 800, 800], 0)] * 4


def request(name: str, msgs: list[Any], span_start: int | None = None, budget: int = 10**6,
            pm: Any = None, level: int = 0) -> CompactionRequest:
    d = get_dialect(name, new_plugin_manager())
    from agentcompact import split_turns

    turns = split_turns(msgs, d)
    return CompactionRequest(
        messages=msgs, dialect=d, head_len=turns.head_len,
        span_start=turns.head_len if span_start is None else span_start,
        cut=turns.starts[-2], budget_tokens=budget,
        meter=MessageMeter(TiktokenCounter(), d), pm=pm or new_plugin_manager(), level=level)


def corpus(name: str, msgs: list[Any]) -> list[str]:
    d = get_dialect(name, new_plugin_manager())
    return [p.text or p.name for m in msgs for p in d.parts(m)] + \
        [p.name for m in msgs for p in d.parts(m) if p.name]


@pytest.mark.parametrize("name", DIALECTS)
@pytest.mark.parametrize("level", [0, 1, 2])
def test_every_non_marker_character_is_quoted(name: str, level: int) -> None:
    msgs = build(name, PLAN)
    texts = corpus(name, msgs)
    segments = render_segments(request(name, msgs), level)
    verbatim = [t for is_verbatim, t in segments if is_verbatim and t]
    assert verbatim
    for piece in verbatim:
        assert any(piece in t for t in texts), piece[:80]


@pytest.mark.parametrize("name", DIALECTS)
def test_rendered_message_is_the_segments(name: str) -> None:
    msgs = build(name, PLAN)
    req = request(name, msgs)
    rendered = CliffStrategy().compact(req)
    assert rendered.level == 0
    text = req.dialect.text_of(rendered.message)
    assert text == "".join(t for _, t in render_segments(req, 0))


def test_long_results_truncated_head_and_tail_not_dropped() -> None:
    msgs = build("openai_chat", PLAN)
    rendered = CliffStrategy().compact(request("openai_chat", msgs))
    text = rendered.message["content"]
    long_result = msgs[4]["content"]  # the 1500-char result
    assert long_result[:100] in text and long_result[-50:] in text
    assert "chars omitted" in text
    assert any(i.action == "truncated" for i in rendered.items)


def test_escalates_when_over_budget() -> None:
    msgs = build("anthropic", PLAN)
    req = request("anthropic", msgs, budget=400)
    rendered = CliffStrategy(newest_share=None).compact(req)
    assert rendered.level == len(DEFAULT_LEVELS) - 1 and rendered.tokens <= 400
    assert any(i.action == "dropped" for i in rendered.items)


def test_packs_newest_first_when_over_budget() -> None:
    """The default packing: over budget, the newest items keep level 1's rendering and the
    oldest are left out, where escalating would render every item at the last level."""
    msgs = build("anthropic", PLAN)
    req = request("anthropic", msgs, budget=600)
    packed = CliffStrategy(archive=False).compact(req)
    escalated = CliffStrategy(archive=False, newest_share=None).compact(req)
    assert packed.level == 1 and packed.tokens <= 600 and escalated.level > 1
    text = req.dialect.text_of(packed.message)
    newest = next(i for i in range(len(msgs) - 1, -1, -1) if any(
        p.kind == "tool_result" and len(p.text) > 300 for p in req.dialect.parts(msgs[i]))
        and i < req.cut)
    result = next(p.text for p in req.dialect.parts(msgs[newest]) if p.kind == "tool_result")
    assert result[:20] in text  # its head, cut at level 1 (a skim line at the last level)
    assert result[:20] not in req.dialect.text_of(escalated.message)
    assert packed.items[0].action == "dropped"  # the oldest went first


def test_carries_earlier_human_messages_forward() -> None:
    msgs = build("openai_chat", PLAN)
    humans = [m["content"] for m in msgs[2:] if m["role"] == "user"]
    # span starts late: earlier cycles were compacted before; their human text stays
    req = request("openai_chat", msgs, span_start=20)
    text = CliffStrategy().compact(req).message["content"]
    early = [h for i, h in enumerate(humans) if msgs.index(next(
        m for m in msgs if m.get("content") == h)) < 20]
    assert early and all(h in text for h in early)
    off = CliffStrategy(carry_forward_human=False).compact(req).message["content"]
    assert not any(h in off for h in early)


def test_pinned_message_verbatim() -> None:
    pm = new_plugin_manager()

    class Pin:
        @hookimpl
        def agentcompact_pin(self, message: Any, index: int, dialect: Any) -> bool:
            return index == 4

    pm.register(Pin())
    msgs = build("openai_chat", PLAN)
    text = CliffStrategy().compact(request("openai_chat", msgs, pm=pm, budget=800)).message[
        "content"]
    assert msgs[4]["content"] in text


def test_thinking_kept_capped_by_default_left_out_by_a_level_without_it() -> None:
    from dataclasses import replace

    from agentcompact.strategies._cliff import DEFAULT_LEVELS

    msgs = build("anthropic", PLAN)
    assert "[thinking]" in "".join(
        t for _, t in render_segments(request("anthropic", msgs), 0))
    levels = (replace(DEFAULT_LEVELS[0], thinking_max=0), *DEFAULT_LEVELS[1:])
    drops = CliffStrategy(levels=levels, archive=False)
    assert "[thinking]" not in "".join(
        t for _, t in render_segments(request("anthropic", msgs), 0, drops))
    assert "[thinking]" in "".join(
        t for _, t in render_segments(request("anthropic", msgs), 1, drops))


def test_render_message_hook_overrides_with_quotes() -> None:
    pm = new_plugin_manager()

    class Quote:
        @hookimpl
        def agentcompact_render_message(self, message: Any, dialect: Any, settings: Any) -> Any:
            if message.get("role") == "tool":
                return [message["content"][:10]]
            return None

    pm.register(Quote())
    msgs = build("openai_chat", PLAN)
    engine = Engine("cliff", "openai_chat", Budget(8000, 6000), plugins=pm)
    r = engine.compact(msgs)
    text = r.messages[r.head_len]["content"]
    last_tool = max(i for i in range(r.cut) if msgs[i]["role"] == "tool")
    head = msgs[last_tool]["content"]
    assert f"[tool result]\n{head[:10]}\n" in text and f"[tool result]\n{head[:11]}" not in text


def test_grading_by_age_leans_the_oldest_items_and_keeps_the_level() -> None:
    # the rule without packing (newest_share=None): over budget at level 1, the oldest
    # items take the last level's rendering, the newest keep level 1 (their long results
    # cut to head and tail, not skim lines)
    msgs = build("openai_chat", PLAN)
    top = len(DEFAULT_LEVELS) - 1
    at_1 = CliffStrategy(grade_by_age=False).compact(request("openai_chat", msgs, level=1))
    at_top = CliffStrategy().compact(request("openai_chat", msgs, level=top))
    assert at_1.level == 1 and at_top.tokens < at_1.tokens
    budget = (at_1.tokens + at_top.tokens) // 2
    graded = CliffStrategy(newest_share=None).compact(
        request("openai_chat", msgs, budget=budget))
    uniform = CliffStrategy(grade_by_age=False).compact(
        request("openai_chat", msgs, budget=budget))
    assert graded.level == 1 and uniform.level > 1
    assert graded.tokens <= budget and uniform.tokens <= budget
    text, flat = graded.message["content"], uniform.message["content"]
    req = request("openai_chat", msgs)
    span = [i for i in range(req.span_start, req.cut) if msgs[i]["role"] == "tool"
            and len(msgs[i]["content"]) > DEFAULT_LEVELS[1].result_keep]
    newest, oldest = msgs[span[-1]]["content"], msgs[span[0]]["content"]
    head = DEFAULT_LEVELS[1].result_max // 2  # a character cut keeps half head, half tail
    assert newest[:head] in text and newest[:head] not in flat  # level 1 keeps its head
    assert oldest[:head] not in text  # ... the oldest went lean
    assert "earlier items omitted" not in text  # nothing left out whole


@pytest.mark.parametrize("name", DIALECTS)
def test_a_strategy_reused_across_calls_renders_as_a_fresh_one(name: str) -> None:
    # handles, truncations and parts are kept across calls: the output must not depend on it
    msgs = build(name, PLAN)
    warm = CliffStrategy(archive=False)
    for budget in (10**6, 3_000, 900, 3_000):
        req = request(name, msgs, budget=budget)
        first = warm.compact(req)
        fresh = CliffStrategy(archive=False).compact(request(name, msgs, budget=budget))
        again = warm.compact(req)
        assert req.dialect.text_of(first.message) == req.dialect.text_of(fresh.message) \
            == req.dialect.text_of(again.message)
        assert first.level == fresh.level == again.level


def test_a_cap_cuts_only_what_costs_more_than_its_marker() -> None:
    # a cut marker names a handle (~19 tokens): a text over its cap by fewer characters than
    # that stays whole; one far over it is cut, marked, and archived under its handle
    from agentcompact._archive import MemoryArchive, handle_of
    from agentcompact.strategies._cliff import _SLACK, CliffLevel

    near = "".join(f"near{i:03d} " for i in range(20))[:150]  # 50 over its cap of 100
    assert 150 - 100 < _SLACK
    far = "".join(f"far{i:03d} " for i in range(60))
    msgs: list[Any] = []
    for k, text in enumerate([near, far, "ok", "ok"]):
        msgs += [{"role": "user", "content": f"step {k}"}, {"role": "assistant", "content": text}]
    msgs.append({"role": "user", "content": "go on"})
    archive = MemoryArchive()
    strategy = CliffStrategy(levels=(CliffLevel(assistant_max=100),), archive=archive)
    req = request("openai_chat", msgs)
    assert req.cut > 3  # both long texts are in the span
    text = strategy.compact(req).message["content"]
    assert near in text and handle_of(near) not in text
    assert far not in text and f"expand {handle_of(far)}" in text
    assert far[:40] in text and far[-40:] in text
    found = archive.get(handle_of(far))
    assert found is not None and found.text == far
