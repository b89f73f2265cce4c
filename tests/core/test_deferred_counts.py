"""Counts deferred by the bound: a call whose bound (``MessageMeter.bound``: a byte per token
at most for messages never counted) is under the trigger compacts nothing and tokenizes
nothing; its token figures are counted when read. Every figure must be the number an
engine counting at once gives, read at once or many calls later, and the calls that do
compact must be the same ones with the same output."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentcompact import Budget, CompactionResult, Engine, get_dialect, hookimpl, new_plugin_manager
from agentcompact._tokens import TiktokenCounter
from agentcompact.trajectory import load

from ..conftest import TRAJECTORIES, needs_shared_data


class EagerCounter(TiktokenCounter):
    """The same counts, no byte bound declared: the engine counts every message at once."""

    at_most_utf8_bytes = False


class CountingCounter(TiktokenCounter):
    """The same counts, remembering the texts it tokenized."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        self.texts += texts
        return super().count_texts(texts)


FIELDS = [f.name for f in dataclasses.fields(CompactionResult) if f.name != "events"]


def _figures(result: CompactionResult) -> dict[str, Any]:
    out = {name: getattr(result, name) for name in FIELDS if name != "event"}
    event = result.event
    out["event"] = None if event is None else (event.tokens_before, event.tokens_after,
                                               event.fallback, event.level)
    return out


def _call_points(messages: list[Any], dialect: Any) -> list[int]:
    return [i for i in range(1, len(messages) + 1)
            if i == len(messages) or (dialect.is_model_output(messages[i])
                                      and not dialect.is_model_output(messages[i - 1]))]


def _replay(path: Path, trigger: int, read_every: int) -> tuple[int, int]:
    """Both engines over every call of the session at ``path``; the deferring one's
    results read every ``read_every`` calls (all of them then, the older ones too)."""
    traj = load(path)[0]
    dialect = get_dialect(traj.dialect)
    lazy = Engine(strategy="cliff", dialect=traj.dialect, budget=Budget(trigger_tokens=trigger))
    eager = Engine(strategy="cliff", dialect=traj.dialect, counter=EagerCounter(),
                   budget=Budget(trigger_tokens=trigger))
    unread: list[tuple[CompactionResult, dict[str, Any]]] = []
    deferred = compactions = 0
    for k, c in enumerate(_call_points(traj.messages, dialect)):
        got = lazy.compact(traj.messages[:c])
        want = eager.compact(traj.messages[:c])
        assert got.messages == want.messages, (path.name, c)
        deferred += type(got) is not CompactionResult
        compactions += want.compacted
        unread.append((got, _figures(want)))
        if k % read_every == 0:
            for result, figures in unread:
                assert _figures(result) == figures, (path.name, c)
            unread.clear()
    for result, figures in unread:
        assert _figures(result) == figures, path.name
    return deferred, compactions


@needs_shared_data("trajectories", "mini-swe-agent-pr816-deepseek")
@pytest.mark.parametrize("read_every", [1, 7])
def test_figures_equal_counting_at_once_on_real_sessions(read_every: int) -> None:
    paths = sorted((TRAJECTORIES / "mini-swe-agent-pr816-deepseek").rglob("*.traj.json"))[:3]
    paths += sorted((TRAJECTORIES / "claude-code").glob("*-*-*-*-*.jsonl"))[:1]
    deferred = compactions = 0
    for path in paths:
        d, c = _replay(path, 12_000, read_every)
        deferred, compactions = deferred + d, compactions + c
    assert compactions >= 5 and deferred >= 50  # both paths taken, many times


def test_nothing_is_tokenized_until_a_figure_is_read() -> None:
    counter = CountingCounter()
    engine = Engine(strategy="cliff", dialect="openai_chat", counter=counter,
                    budget=Budget(trigger_tokens=10_000))
    history = [{"role": "system", "content": "You are terse."},
               {"role": "user", "content": "first question, " * 40}]
    first = engine.compact(history)
    history = [*history, {"role": "assistant", "content": "an answer " * 30},
               {"role": "user", "content": "a second question"}]
    second = engine.compact(history)
    assert counter.texts == []
    eager = Engine(strategy="cliff", dialect="openai_chat", counter=EagerCounter(),
                   budget=Budget(trigger_tokens=10_000))
    assert second.tokens_after == eager.compact(history).tokens_after
    assert len(counter.texts) == 4  # each message once, in one batch
    assert first.tokens_before == eager.count(history[:2])  # read after the next call
    assert len(counter.texts) == 4  # already counted
    assert not second.over_budget and not second.compacted and not second.modified


def test_a_deferred_result_copies_and_pickles_as_a_plain_result_with_its_figures() -> None:
    engine = Engine(strategy="cliff", dialect="openai_chat", budget=Budget(trigger_tokens=5_000))
    history = [{"role": "user", "content": "hello there"}]
    for make in (copy.copy, copy.deepcopy, lambda r: pickle.loads(pickle.dumps(r)),
                 lambda r: dataclasses.replace(r, cut=0)):
        engine = Engine(strategy="cliff", dialect="openai_chat",
                        budget=Budget(trigger_tokens=5_000))
        result = engine.compact(history)
        assert type(result) is not CompactionResult  # deferred
        made = make(result)
        assert made.tokens_after == engine.count(history) > 0
        assert made.tokens_original == made.tokens_before == made.tokens_after
        assert made == result


def test_an_assigned_figure_stays_assigned() -> None:
    engine = Engine(strategy="cliff", dialect="openai_chat", budget=Budget(trigger_tokens=5_000))
    result = engine.compact([{"role": "user", "content": "hello there"}])
    result.tokens_after = 3
    assert result.tokens_after == 3
    assert result.tokens_before == engine.count([{"role": "user", "content": "hello there"}])


def test_a_should_compact_plugin_gets_the_exact_count() -> None:
    seen: list[int] = []

    class Plugin:
        @hookimpl
        def agentcompact_should_compact(self, messages: Any, tokens: int, budget: Any,
                                        dialect: Any) -> None:
            seen.append(tokens)

    pm = new_plugin_manager()
    pm.register(Plugin())
    engine = Engine(strategy="cliff", dialect="openai_chat", plugins=pm,
                    budget=Budget(trigger_tokens=5_000))
    history = [{"role": "user", "content": "hello there, " * 20}]
    result = engine.compact(history)
    assert seen == [engine.count(history)] == [result.tokens_before]


@needs_shared_data("trajectories", "claude-code")
def test_the_meter_defers_only_uncounted_messages_and_counts_them_exactly() -> None:
    from agentcompact._tokens import MessageMeter

    traj = load(sorted((TRAJECTORIES / "claude-code").glob("*-*-*-*-*.jsonl"))[0])[0]
    dialect = get_dialect(traj.dialect)
    messages = traj.messages[:120]
    exact = MessageMeter(TiktokenCounter(), dialect).measure(messages)
    meter = MessageMeter(TiktokenCounter(), dialect)
    meter.measure(messages[:40])
    measured, pending = meter.measure_deferred(messages)
    assert measured.digests == exact.digests
    assert sorted(pending) == [i for i in range(len(messages)) if i >= 40
                               and exact.digests[i] not in exact.digests[:40]]
    for i, count in enumerate(measured.tokens):
        assert count == (0 if i in pending else exact.tokens[i])
    for i, bound in pending.items():
        assert bound >= exact.tokens[i]
    at = sorted(pending)
    assert meter.count_deferred([messages[i] for i in at],
                                [measured.digests[i] for i in at]) == [exact.tokens[i] for i in at]
    assert meter.measure_deferred(messages)[1] == {}  # counted now


def test_a_counter_without_a_byte_bound_counts_at_once() -> None:
    counter = CountingCounter()
    counter.at_most_utf8_bytes = False  # type: ignore[misc]
    engine = Engine(strategy="cliff", dialect="openai_chat", counter=counter,
                    budget=Budget(trigger_tokens=10_000))
    result = engine.compact([{"role": "user", "content": "hello there"}])
    assert len(counter.texts) == 1 and type(result) is CompactionResult


def test_figures_stay_exact_when_views_share_their_lists_across_branches() -> None:
    """A history that grows extends the last view's lists in place; one that forks (an
    edited message, a shorter one, the first branch again) gets lists of its own: every
    result's figures, read at the end, are those an engine counting at once gives."""
    def message(k: int, variant: str = "") -> dict[str, Any]:
        role = "assistant" if k % 2 else "user"
        return {"role": role, "content": f"message {k}{variant} " + "word " * (40 + 13 * k)}

    base = [message(k) for k in range(30)]
    fork = base[:17] + [message(17, " edited")] + [message(k, " fork") for k in range(18, 26)]
    calls = [base[:c] for c in range(2, 24, 3)] + [fork[:c] for c in range(18, 27, 2)]
    calls += [base[:c] for c in (9, 24, 27, 30)] + [fork[:26], base[:30]]
    lazy = Engine(strategy="cliff", dialect="openai_chat", budget=Budget(trigger_tokens=100_000))
    eager = Engine(strategy="cliff", dialect="openai_chat", counter=EagerCounter(),
                   budget=Budget(trigger_tokens=100_000))
    results = [(lazy.compact(history), _figures(eager.compact(history))) for history in calls]
    assert all(type(got) is not CompactionResult for got, _ in results)  # all deferred
    for got, want in reversed(results):
        assert _figures(got) == want
