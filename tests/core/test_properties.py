"""Property tests over random histories in all three dialects."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcompact import Budget, Engine, new_plugin_manager, validate
from agentcompact._markers import COMPACTION_HEADER
from agentcompact._tokens import MessageMeter

from .histories import build, call_points

turn = st.tuples(
    st.integers(0, 400),
    st.lists(st.integers(0, 3000), max_size=3),
    st.sampled_from([0, 0, 0, 60]),
)
plans = st.lists(turn, min_size=1, max_size=18)
dialects = st.sampled_from(["openai_chat", "anthropic", "openai_responses", "gemini"])
budgets = st.tuples(st.integers(800, 6000), st.floats(0.2, 1.0))


def make(dialect: str, trigger: int, share: float) -> Engine:
    return Engine("cliff", dialect, Budget(trigger, max(1, int(trigger * share))),
                  plugins=new_plugin_manager())


def dumps(messages: list[Any]) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in messages]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dialect=dialects, plan=plans, budget=budgets)
def test_incremental_invariants(dialect: str, plan: Any, budget: tuple[int, float]) -> None:
    msgs = build(dialect, plan)
    frozen = copy.deepcopy(msgs)
    engine = make(dialect, *budget)
    sources = [json.dumps(m, ensure_ascii=False) for m in msgs] + [
        p.text for m in msgs for p in engine.dialect.parts(m)]
    previous: list[str] = []
    for c in call_points(msgs, engine.dialect):
        result = engine.compact(msgs[:c])
        validate(result.messages, engine.dialect)  # tool pairs whole, role order
        sent = dumps(result.messages)
        if not result.compacted and previous:
            assert sent[: len(previous)] == previous  # byte-stable between cliffs
        previous = sent
        for m in result.messages:
            if engine.dialect.is_synthetic(m):
                body = engine.dialect.text_of(m)
                assert body.count(COMPACTION_HEADER) == 1  # never a compaction of one
    assert msgs == frozen  # input never mutated
    again = make(dialect, *budget).compact(msgs)
    assert dumps(again.messages) == previous  # deterministic; replay = incremental
    del sources


@settings(max_examples=40, deadline=None)
@given(dialect=dialects, plan=plans, budget=budgets)
def test_verbatim_provenance(dialect: str, plan: Any, budget: tuple[int, float]) -> None:
    from agentcompact.strategies._cliff import render_segments

    msgs = build(dialect, plan)
    engine = make(dialect, *budget)
    result = engine.compact(msgs)
    if not result.compacted:
        return
    texts = [p.text or p.name for m in msgs for p in engine.dialect.parts(m)]
    texts += [p.name for m in msgs for p in engine.dialect.parts(m)]
    synthetic = engine.dialect.text_of(result.messages[result.head_len])
    from agentcompact.strategies import CompactionRequest

    req = CompactionRequest(msgs, engine.dialect, result.head_len, result.head_len, result.cut,
                            10**9, MessageMeter(engine.counter, engine.dialect), engine.pm)
    for level in range(3):
        for verbatim, piece in render_segments(req, level):
            if verbatim and piece:
                assert any(piece in t for t in texts)
    assert synthetic.startswith(COMPACTION_HEADER)
