"""A long history arriving at once (the proxy's first request of a resumed session): the
engine replays every threshold crossing, and the cliff strategy's caches keep what it
rendered for the items carried from crossing to crossing, however long the history. They
were bounded at 8,192 entries: past that (4,000 turns), every crossing of the replay
emptied them and rendered the whole history again (56 s of CPU at 8,000 turns, against
10 s now; ``benchmarks/proxy_faults.py`` prints the figures)."""

from __future__ import annotations

from typing import Any

import pytest

import agentcompact.strategies._cliff as cliff
from agentcompact import Budget, Engine
from tests.integrations.proxy.histories import anthropic_history


def replay(strategy: cliff.CliffStrategy, messages: list[Any]) -> Any:
    engine = Engine(strategy, "anthropic", Budget(trigger_tokens=20_000), counter="chars")
    return engine.compact(messages)


def test_a_replay_renders_each_item_about_once_past_the_caches_first_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    renders = [0]
    render = cliff._render

    def counted(*args: Any, **kwargs: Any) -> Any:
        renders[0] += 1
        return render(*args, **kwargs)

    monkeypatch.setattr(cliff, "_render", counted)
    messages = anthropic_history(400, result_tokens=300)
    small = cliff.CliffStrategy()  # caches whose first bounds the history exceeds
    small._texts = cliff._TextCache(max_entries=64, max_chars=20_000)
    small._blocks = cliff._BlockCache(small.levels, max_entries=64, max_chars=20_000)
    result = replay(small, messages)
    assert len(result.events) >= 8  # crossings replayed
    assert renders[0] <= 2 * len(messages)  # was 5 a message: each crossing rendered all
    monkeypatch.setattr(cliff, "_render", render)
    same = replay(cliff.CliffStrategy(), messages)  # the caches change nothing
    assert same.messages == result.messages
    assert [e.dropped for e in same.events] == [e.dropped for e in result.events]


class CountingCounter:
    """A real counter (chars/4) that counts the texts it is given."""

    name = "chars/4"
    at_most_utf8_bytes = True

    def __init__(self) -> None:
        self.texts = 0

    def count_texts(self, texts: list[str]) -> list[int]:
        self.texts += len(texts)
        return [(len(t) + 3) // 4 for t in texts]


def test_the_token_meter_keeps_a_history_longer_than_its_first_bound() -> None:
    """The proxy's per-session meters started at 8,192 messages: a history longer than
    that evicted its own first messages and counted them again at every compaction."""
    from agentcompact import get_dialect
    from agentcompact._tokens import MessageMeter

    counter = CountingCounter()
    meter = MessageMeter(counter, get_dialect("anthropic"), max_entries=64)
    messages = anthropic_history(100, result_tokens=20)
    first = meter.measure(messages).tokens
    assert counter.texts == len(messages)
    assert meter.measure(messages).tokens == first
    assert counter.texts == len(messages)  # nothing counted again
