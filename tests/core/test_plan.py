"""The history, the planner and the check, called directly (no Engine).

``History`` is built by ``HistoryCache`` from a ``MessageMeter``; ``plan`` and ``check``
are pure functions of the history, the entry in force, the budget and the pins. The last
tests hold the engine to them: its compaction cuts where ``plan`` says.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentcompact import Budget, Engine, get_dialect, new_plugin_manager, split_turns
from agentcompact._check import check, safe_render, validity
from agentcompact._history import History, HistoryCache
from agentcompact._pins import PinLookup
from agentcompact._plan import State, plan
from agentcompact._tokens import MessageMeter, TiktokenCounter
from agentcompact.strategies import CompactionRequest
from agentcompact.strategies._base import Rendered

from .histories import build, call_points

DIALECTS = ["openai_chat", "anthropic", "openai_responses", "gemini"]
PLAN = [(60, [1500, 200], 0), (40, [3000], 80), (0, [800, 800, 800], 0)] * 8


def history_of(name: str, msgs: list[Any]) -> tuple[History, PinLookup]:
    dialect = get_dialect(name)
    meter = MessageMeter(TiktokenCounter(), dialect)
    cache = HistoryCache(meter)
    history = cache.resolve(cache.extend(msgs))
    return history, PinLookup(new_plugin_manager(), dialect, meter.counter)


@pytest.mark.parametrize("name", DIALECTS)
def test_history_facts_match_a_fresh_derivation(name: str) -> None:
    """A history grown call by call (and one whose message changed) has the counts,
    prefix sums and turn starts derived afresh from its messages."""
    msgs = build(name, PLAN)
    dialect = get_dialect(name)
    meter = MessageMeter(TiktokenCounter(), dialect)
    cache = HistoryCache(meter)
    for c in range(1, len(msgs) + 1, 5):
        history = cache.resolve(cache.extend(msgs[:c]))
        assert history.tokens == [meter.count(m) for m in msgs[:c]]
        assert history.prefix[-1] == sum(history.tokens) and len(history.prefix) == c + 1
        assert history.turn_starts() == split_turns(msgs[:c], dialect).starts
        assert history.turn_starts(c // 2) == split_turns(msgs[: c // 2], dialect).starts
    changed = [*msgs[:10], build(name, PLAN[:1], task="Another task.")[0], *msgs[11:]]
    again = cache.resolve(cache.extend(changed))
    assert again.turn_starts() == split_turns(changed, dialect).starts
    assert again.chain[:10] == history.chain[:10] and again.chain[10] != history.chain[10]


@pytest.mark.parametrize("name", DIALECTS)
def test_plan_cuts_at_a_turn_start_and_fits_the_target(name: str) -> None:
    history, pins = history_of(name, build(name, PLAN))
    budget = Budget(8000)
    n = len(history)
    p = plan(history, None, budget, pins)
    assert p is not None
    starts = history.turn_starts()
    assert p.head_len == starts[0] and p.span_start == starts[0]
    assert p.cut in starts and p.head_len < p.cut <= n
    assert budget.min_recent_turns <= p.recent_turns <= budget.recent_turns
    assert p.before == history.prefix[n] + history.fixed
    # what is kept besides the message fits the target, leaving the message its budget
    kept = history.prefix[p.head_len] + history.prefix[n] - history.prefix[p.cut]
    assert kept + p.budget_tokens <= p.target and p.budget_tokens > 0
    assert plan(history, None, budget, pins) == p  # a pure function of its arguments


def test_plan_keeps_min_recent_turns() -> None:
    history, pins = history_of("openai_chat", build("openai_chat", PLAN[:1]))
    assert plan(history, None, Budget(100, min_recent_turns=1, recent_turns=1), pins) is None


@pytest.mark.parametrize("name", DIALECTS)
def test_check_accepts_the_safe_cut_and_names_an_oversized_message(name: str) -> None:
    history, pins = history_of(name, build(name, PLAN))
    budget = Budget(8000)
    p = plan(history, None, budget, pins)
    assert p is not None
    ok = check(history, p, safe_render(history, p, pins), budget=budget, pins=pins,
               rung="safe", name="safe", trusted=True)
    assert ok.problem is None and ok.entry is not None and ok.entry.cut == p.cut
    sent = State(ok.entry).messages_at(history, len(history))
    assert validity(history, sent, len(history)) is None
    assert State(ok.entry).tokens_at(history, len(history)) <= budget.trigger
    big = history.dialect.text_message("x " * (8 * p.budget_tokens + 400))
    over = check(history, p, Rendered(big, 0), budget=budget, pins=pins, rung="strategy",
                 name="third-party", trusted=False)
    assert over.problem is not None and "over its budget" in over.problem
    # the next plan starts where the entry in force cut
    more = build(name, PLAN * 2)
    later, _ = history_of(name, more)
    following = plan(later, ok.entry, budget, pins)
    assert following is not None and following.span_start == p.cut


@pytest.mark.parametrize("name", DIALECTS)
def test_the_engine_cuts_where_plan_says(name: str) -> None:
    """Called at each turn, the engine's first compaction is the plan of that history."""
    msgs = build(name, PLAN)
    engine = Engine("cliff", name, Budget(8000))
    for c in call_points(msgs, engine.dialect):
        result = engine.compact(msgs[:c])
        if result.compacted:
            break
    assert result.compacted and result.event is not None
    history, pins = history_of(name, msgs[:c])
    p = plan(history, None, Budget(8000), pins, floor_tokens=engine.strategy.min_budget_tokens)
    assert p is not None
    assert (result.head_len, result.cut) == (p.head_len, p.cut)
    assert result.event.tokens_before == p.before


def test_strategies_get_the_history() -> None:
    """The request carries the engine's history: its facts are the request's messages'."""
    seen: list[CompactionRequest] = []

    class Seeing:
        name = "seeing"

        def compact(self, request: CompactionRequest) -> Rendered:
            seen.append(request)
            text = "[compacted]"
            return Rendered(request.dialect.text_message(text), 8)

    msgs = build("openai_chat", PLAN)
    Engine(Seeing(), "openai_chat", Budget(8000)).compact(msgs)
    assert seen
    request = seen[0]
    history = request.history
    assert history is not None and history.messages[: len(request.messages)] == list(
        request.messages)
    assert history.turn_starts(len(request.messages)) == split_turns(
        request.messages, request.dialect).starts
