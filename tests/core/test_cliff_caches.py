"""The cliff strategy's speed-ups change nothing it renders.

Renderings are kept across calls (``_BlockCache``), levels are skipped on lower bounds of
the sizes (``_min_chars``) and the message's tokens are summed from counts of its
renderings (``_counted``), the history's per-message facts, calls and turns are derived
on from the last call's (``History.facts``, ``History.tool_index``) and the engine hands its
pins over (``CompactionRequest.pins``): each test compares against the plain computation
(a fresh strategy or history, the rendered text, one count of the whole text).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcompact import Budget, Engine, get_dialect, hookimpl, new_plugin_manager, split_turns
from agentcompact._archive import MemoryArchive
from agentcompact._history import History, HistoryCache, history_of
from agentcompact._tokens import MessageMeter, TiktokenCounter
from agentcompact.dialects._base import Part
from agentcompact.strategies import CompactionRequest, Rendered
from agentcompact.strategies._cliff import (
    DEFAULT_LEVELS,
    CliffStrategy,
    _BlockCache,
    _call_key,
    _collect,
    _Context,
    _min_chars,
    _TextCache,
)

from .histories import build

LINES = ["ok", "", "  indented line", "Traceback (most recent call last):",
         "FAILED tests/test_app.py::test_x - AssertionError", "E   assert 1 == 2",
         "exit code 1", "x" * 90, "a line of ordinary output 12345", "/usr/bin/env: no such",
         "    at frame (file.js:10:5)", "\t", "Error: boom", "y" * 700]


@st.composite
def texts(draw: Any) -> str:
    if draw(st.booleans()):
        return "\n".join(draw(st.lists(st.sampled_from(LINES), max_size=120)))
    return draw(st.sampled_from("abc ./\n")) * draw(st.integers(0, 25_000))


@st.composite
def histories(draw: Any) -> list[dict[str, Any]]:
    """openai_chat histories: calls (some re-run: superseded), results, assistant and
    user text of any length, with many lines or one."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                  {"role": "user", "content": "Fix the bug."}]
    for k in range(draw(st.integers(2, 12))):
        command = draw(st.sampled_from(["pytest", "ls", "cat a.py", "make"]))
        args = json.dumps({"command": command, "pad": "z" * draw(st.integers(0, 600))})
        msgs.append({"role": "assistant", "content": draw(texts()) or None,
                     "tool_calls": [{"id": f"c{k}", "type": "function",
                                     "function": {"name": "bash", "arguments": args}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": draw(texts())})
        if draw(st.booleans()):
            msgs.append({"role": "user", "content": draw(texts()) or "go on"})
    msgs.append({"role": "assistant", "content": "done"})
    return msgs


def requests(msgs: list[Any], budget: int, name: str = "openai_chat",
             encoding: str = "o200k_base") -> list[CompactionRequest]:
    """One request per cycle: each compacts the turns since the last one (earlier cycles
    carried), over a history that grows, as the engine makes them."""
    dialect = get_dialect(name, new_plugin_manager())
    turns = split_turns(msgs, dialect)
    meter = MessageMeter(TiktokenCounter(encoding), dialect)
    pm = new_plugin_manager()
    out = []
    span_start = turns.head_len
    for k in range(1, len(turns.starts) - 1):
        cut = turns.starts[k]
        end = turns.end(k)
        out.append(CompactionRequest(messages=msgs[:end], dialect=dialect,
                                     head_len=turns.head_len, span_start=span_start, cut=cut,
                                     budget_tokens=budget, meter=meter, pm=pm))
        if k % 2 == 0:
            span_start = cut
    return out


def same(a: Rendered, b: Rendered) -> bool:
    return (a.message, a.tokens, a.level, a.items) == (b.message, b.tokens, b.level, b.items)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=histories(), budget=st.integers(300, 12_000))
def test_a_warm_strategy_archives_what_fresh_ones_do(msgs: list[Any], budget: int) -> None:
    """A strategy that puts only handles it did not put before into its in-memory
    archive ends with the items (handle, text, skim line) that putting everything at
    every compaction gives."""
    warm = CliffStrategy(archive=MemoryArchive())
    every = MemoryArchive()
    for req in requests(msgs, budget):
        warm.compact(req)
        CliffStrategy(archive=every).compact(req)
    assert warm.archive._scopes == every._scopes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=histories(), budget=st.integers(300, 12_000))
def test_a_warm_strategy_renders_as_a_fresh_one(msgs: list[Any], budget: int) -> None:
    warm = CliffStrategy(archive=False)
    for req in requests(msgs, budget):
        assert same(warm.compact(req), CliffStrategy(archive=False).compact(req))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=histories(), budget=st.integers(300, 12_000))
def test_a_warm_strategy_given_fresh_copies_renders_as_a_fresh_one(msgs: list[Any],
                                                                   budget: int) -> None:
    """Each call parses its history afresh (a server): equal messages, other objects, so
    the renderings kept under equal keys are reused with other part objects."""
    warm = CliffStrategy(archive=False)
    for req in requests(msgs, budget):
        copied = replace(req, messages=json.loads(json.dumps(list(req.messages))))
        assert same(warm.compact(copied), CliffStrategy(archive=False).compact(req))


def test_a_carried_call_re_run_later_is_rendered_superseded() -> None:
    """The same carried item renders differently once a later call supersedes its
    result: the cache key holds the superseded state of the refs it names."""
    msgs = build("openai_chat", [(60, [1500], 0), (60, [1500], 0), (60, [200], 0)] * 3)
    calls = [i for i, m in enumerate(msgs) if m.get("tool_calls")]
    first, late = calls[0], calls[-2]
    later = list(msgs)
    later[late] = {**msgs[late], "tool_calls": [{
        **msgs[late]["tool_calls"][0], "function": msgs[first]["tool_calls"][0]["function"]}]}
    warm = CliffStrategy(archive=False)
    seen = set()
    for history in (msgs, later, msgs, later):
        for req in requests(history, 900):
            rendered = warm.compact(req)
            assert same(rendered, CliffStrategy(archive=False).compact(req))
            seen.add((history is later, "superseded" in req.dialect.text_of(rendered.message)))
    assert (True, True) in seen and (False, True) not in seen


def test_new_levels_drop_the_renderings_of_the_old_ones() -> None:
    msgs = build("openai_chat", [(300, [1500, 900], 60), (2500, [3000], 0)] * 4)
    strategy = CliffStrategy(archive=False)
    reqs = requests(msgs, 2_000)
    for req in reqs:
        strategy.compact(req)
    strategy.levels = tuple(replace(level, result_keep=100, call_args_max=50)
                            for level in DEFAULT_LEVELS)
    fresh = CliffStrategy(archive=False, levels=strategy.levels)
    for req in reqs:
        assert same(strategy.compact(req), fresh.compact(req))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=histories(), pinned=st.booleans())
def test_lower_bounds_never_exceed_the_rendering(msgs: list[Any], pinned: bool) -> None:
    """``_min_chars`` of every item at every level is at most the characters of its
    rendering there (the level skip relies on it)."""
    strategy = CliffStrategy(archive=False)
    for req in requests(msgs, 10**6):
        items = _collect(req, True, True)
        if pinned:
            items = [replace(it, pinned=not it.carried) for it in items]
        texts = _TextCache()
        context = _Context.of(req, items, texts)
        for item in items:
            for level in range(len(DEFAULT_LEVELS)):
                caps = strategy._caps(item, level)
                block = strategy._block(req, context, item, level)
                assert _min_chars(context, item, caps) <= len(block.text("full"))


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=histories(), budget=st.integers(300, 12_000))
def test_message_tokens_are_the_count_of_its_text(encoding: str, msgs: list[Any],
                                                  budget: int) -> None:
    strategy = CliffStrategy(archive=False)
    for req in requests(msgs, budget, encoding=encoding):
        rendered = strategy.compact(req)
        text = req.dialect.text_of(rendered.message)
        assert rendered.tokens == req.meter.count_text_message(text)


pieces = st.lists(st.sampled_from(list("ab Z9 \n\t\r.,[]{}'\"/-_é中\u0301😀\ud800") +
                                  ["'s", "'LL", "\n\n", "\r\n", "123456", "  "]),
                  max_size=40).map("".join)


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
@settings(max_examples=300, deadline=None)
@given(head=pieces, blocks=st.lists(pieces, min_size=1, max_size=5))
def test_counts_add_up_where_a_line_break_meets_a_bracket(encoding: str, head: str,
                                                          blocks: list[str]) -> None:
    """The premise of ``_SPLIT_COUNTERS``: pieces that start with ``[`` joined by a blank
    line count the sum of their counts (each with the line break that follows it)."""
    counter = TiktokenCounter(encoding)
    texts = [head, *("[" + b for b in blocks)]
    whole = counter.count_texts(["\n\n".join(texts)])[0]
    split = counter.count_texts([t + "\n\n" for t in texts[:-1]] + [texts[-1]])
    assert sum(split) == whole


def test_the_block_cache_is_bounded_by_entries_and_characters() -> None:
    cache = _BlockCache(max_entries=3, max_chars=100)
    first = cache.entry("a", [Part("text", "x" * 40)])
    assert cache.entry("a") is first
    cache.entry("b", [Part("text", "x" * 40)])
    assert cache.entry("a") is first  # 80 characters: kept
    cache.entry("c", [Part("text", "x" * 40)])  # 120: emptied, then holds "c" only
    assert cache.entry("a", [Part("text", "y")]) is not first
    for key in "defg":
        cache.entry(key)
    assert len(cache._entries) <= 3


def facts_fields(history: History, end: int) -> tuple[Any, ...]:
    index = history.tool_index(end, _call_key)
    return (index.calls, index.results, index.order, history.turn_starts(end),
            list(history.facts(end)[:end]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=histories(), data=st.data())
def test_facts_built_on_are_the_facts_of_the_whole_history(msgs: list[Any], data: Any) -> None:
    """The per-message facts and the tool index of a history extended from a shorter
    one's (shared, filled on first read, read at several lengths): the same roles, parts,
    calls, results, call order and turn starts as a history made afresh; a history that
    does not extend it (a message replaced, or shorter) keeps what it shares only."""
    dialect = get_dialect("openai_chat", new_plugin_manager())
    meter = MessageMeter(TiktokenCounter("o200k_base"), dialect)
    cache = HistoryCache(meter)
    ends = sorted(data.draw(st.lists(st.integers(0, len(msgs)), max_size=6)))
    history = None
    for end in [*ends, len(msgs)]:
        older, history = history, cache.extend(msgs[:end])
        for at in (data.draw(st.integers(0, end)), end):
            assert facts_fields(history, at) == facts_fields(history_of(msgs[:at], meter), at)
        assert history.turn_starts(end) == split_turns(msgs[:end], dialect).starts
        if older is not None:  # an older history sharing the lists reads what it read
            n = len(older)
            assert facts_fields(older, n) == facts_fields(history_of(msgs[:n], meter), n)
    k = data.draw(st.integers(0, len(msgs) - 1))
    other = [*msgs[:k], {**msgs[k]}, *msgs[k + 1:]]  # equal, but another object
    other[k]["content"] = "replaced"
    if msgs[k].get("tool_calls"):
        other[k]["tool_calls"] = [{**msgs[k]["tool_calls"][0], "id": "new-ref"}]
    for changed in (other, msgs[:k]):
        n = len(changed)
        assert facts_fields(cache.extend(changed), n) == facts_fields(
            history_of(changed, meter), n)


class Pin:
    """Pins every fifth message (index 3, 8, ...) and notes each index it is asked about."""

    def __init__(self, asked: list[int]) -> None:
        self.asked = asked

    @hookimpl
    def agentcompact_pin(self, message: Any, index: int, dialect: Any) -> bool:
        self.asked.append(index)
        return index % 5 == 3


def test_the_engine_hands_the_strategy_its_pins() -> None:
    """``CompactionRequest.pins``: the engine fills it from its plan (every message the
    hook pins, synthetic ones aside, the pins past the pin budget in ``unpinned``),
    ``pinned()`` answers from it without asking the
    hook again, and a request without it asks the hook: the same rendering."""
    pm = new_plugin_manager()
    asked: list[int] = []
    pm.register(Pin(asked))
    seen: list[CompactionRequest] = []

    class Recording(CliffStrategy):
        def compact(self, request: CompactionRequest) -> Rendered:
            seen.append(request)
            before = len(asked)
            rendered = super().compact(request)
            assert len(asked) == before  # answered from ``pins``
            return rendered

    msgs = build("openai_chat", [(300, [1500, 900], 60), (2500, [3000], 0)] * 4)
    engine = Engine(Recording(archive=False), "openai_chat", Budget(8000, 6000), plugins=pm)
    for c in range(2, len(msgs) + 1):
        engine.compact(msgs[:c])
    assert seen and any(req.pins for req in seen)
    for req in seen:
        assert req.pins is not None and not req.pins & req.unpinned  # past the pin budget
        assert req.pins | req.unpinned == {
            i for i in range(req.head_len, len(req.messages))
            if i % 5 == 3 and not req.dialect.is_synthetic(req.messages[i])}
        asking = replace(req, pins=None)
        rendered, before = CliffStrategy(archive=False).compact(req), len(asked)
        assert same(rendered, CliffStrategy(archive=False).compact(asking))
        assert len(asked) > before  # without ``pins``, the hook is asked


def test_the_engine_asks_the_pin_hook_once_per_message() -> None:
    """The engine remembers each message's pin answer (by identity and index): a history
    that grew asks the hook about its new messages only, the same pins as asking every
    message afresh (the ``PinLookup`` of an engine with an empty memo); a plugin registered later
    is asked about every message again (the memo belongs to a plugin set)."""
    pm = new_plugin_manager()
    asked: list[int] = []
    pm.register(Pin(asked))
    msgs = build("openai_chat", [(300, [1500, 900], 60), (2500, [3000], 0)] * 6)
    engine = Engine("cliff", "openai_chat", Budget(8000, 6000), plugins=pm)
    compactions = 0
    for c in range(2, len(msgs) + 1):
        compactions += engine.compact(msgs[:c]).compacted
    assert compactions >= 2
    assert len(asked) == len(set(asked))  # never about one message twice
    fresh = Engine("cliff", "openai_chat", Budget(8000, 6000), plugins=pm)
    assert engine._pins.within(msgs, 1, len(msgs)) == fresh._pins.within(msgs, 1, len(msgs))

    later: list[int] = []

    class Late:
        @hookimpl
        def agentcompact_pin(self, message: Any, index: int, dialect: Any) -> bool:
            later.append(index)
            return index == 4

    pm.register(Late())
    engine.context_tokens(msgs)  # a call notices the new plugin set
    pins = engine._pins.within(msgs, 1, len(msgs))
    assert 4 in pins and later  # the new plugin set is asked
