"""What one cliff compaction carries to the next changes nothing it renders.

A history arriving at once is compacted by replaying every threshold crossing; the cliff
strategy starts each from the items of earlier cycles the last one collected, keyed,
rendered and sized (``agentcompact.strategies._cliff_carry``), and the engine finds loop
starts and pins from what it found for the shorter history. Each test compares against
the computation from scratch: a fresh strategy, ``_turns.loop_start``, a fresh pin lookup.
"""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcompact import Budget, Engine, get_dialect, hookimpl, new_plugin_manager
from agentcompact._archive import ArchivedItem, MemoryArchive
from agentcompact._history import HistoryCache
from agentcompact._pins import PinLookup
from agentcompact._tokens import CharEstimateCounter, MessageMeter
from agentcompact._turns import loop_start
from agentcompact.strategies import CompactionRequest, Rendered
from agentcompact.strategies._cliff import CliffStrategy, _Block, _Entry
from agentcompact.strategies._cliff_carry import Carry

COMMANDS = ("pytest -q", "ls src", "cat src/app.py", "make", "git diff")


class Recording(MemoryArchive):
    """Notes every batch put into it (a subclass: the strategy puts every original)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[tuple[str, str, str]]] = []

    def put_many(self, items: Any, scope: str = "") -> None:
        items = list(items)
        self.batches.append([(i.handle, i.text, i.skim) for i in items])
        super().put_many(items, scope)


class Compared(CliffStrategy):
    """Compacts as a cliff strategy and checks each compaction against a fresh one (no
    carry, empty caches); counts the compactions that started from a fitting carry."""

    def __init__(self, **options: Any) -> None:
        super().__init__(archive=Recording(), **options)
        self.options, self.carried, self.compactions = options, 0, 0
        self.stored = MemoryArchive()
        self.mismatches: list[str] = []

    def compact(self, request: CompactionRequest) -> Rendered:
        facts, carry = self._facts(request), self._carry
        if facts is not None and carry is not None and carry.items and carry.fits(
                request.messages, request.dialect, request.head_len, request.span_start,
                facts):
            self.carried += 1
        got = super().compact(request)
        fresh = CliffStrategy(archive=Recording(), **self.options)
        want = fresh.compact(request)
        # a carried compaction offers the archive only what earlier ones did not: what it
        # stores, in order, is what the fresh compactions' batches store
        self.stored.put_many(ArchivedItem(*i) for i in fresh.archive.batches[-1])
        # noted, not asserted: the engine turns a strategy's exception into a fallback
        for what, a, b in (("message", (got.message, got.tokens, got.level),
                            (want.message, want.tokens, want.level)),
                           ("report", got.items, want.items),
                           ("archive", list(self.archive._scopes.get("", {}).values()),
                            list(self.stored._scopes.get("", {}).values())),
                           ("carry", view(self._carry), view(fresh._carry))):
            if a != b:
                self.mismatches.append(f"compaction {self.compactions}: {what}")
        self.compactions += 1
        return got


def view(carry: Carry | None) -> Any:
    """A carry's values, comparable across strategies (renderings by their content)."""
    if carry is None:
        return None

    def value(v: Any) -> Any:
        if isinstance(v, _Block):
            return (v.full, v.skim, v.archived, v.skimmed, v.cut, v.alone, v.call_refs)
        if isinstance(v, _Entry):
            return None  # by what it renders, in the block columns
        return v
    groups = carry.groups
    return (carry.head_len, carry.upto, carry.facts, carry.measured, carry.rates,
            [(i.index, i.role, i.parts, i.pinned, i.carried, i.override, i.pos, i.lean,
              i.unpinned) for i in carry.items],
            [getattr(groups, name) for name in groups.__slots__], carry.call_items,
            carry.refs, carry.superseded, carry.reported,
            [(d.index, d.role, d.action, d.tokens, d.kind) for d in carry.report],
            {name: [value(v) for v in values] for name, values in carry.columns.items()})


def text(rng: random.Random, n: int) -> str:
    lines = ["ok", "FAILED tests/test_app.py::test_x", "E   assert 1 == 2", "x" * 90,
             "a line of output 12345", "Error: boom"]
    out = "\n".join(rng.choice(lines) for _ in range(n // 20 + 1))
    return out[:n] if n else ""


def history(seed: int, turns: int, result: int = 900) -> list[Any]:
    """Anthropic turns: thinking, text, one or two calls (often re-running an earlier
    command: superseded later), their results, sometimes user text beside the results
    (two items of one message) or a user message of its own (it ends the tool loop)."""
    rng = random.Random(seed)
    msgs: list[Any] = [{"role": "user", "content": "Fix the bug. PIN the plan."}]
    commands = list(COMMANDS)
    for t in range(turns):
        calls = []
        for j in range(rng.randint(1, 2)):
            # an earlier command re-run (supersedes its calls, of any earlier cycle)
            command = rng.choice(commands) if rng.random() < 0.4 else f"cat f{t}_{j}.py"
            commands.append(command)
            calls.append({"type": "tool_use", "id": f"t{t}_{j}", "name": "bash",
                          "input": {"command": command}})
        msgs.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"step {t}", "signature": f"s{t}"},
            *([{"type": "text", "text": text(rng, rng.randint(5, 2_500))}]
              if rng.random() < 0.7 else []),
            *calls]})
        blocks: list[Any] = [{"type": "tool_result", "tool_use_id": c["id"],
                              "content": text(rng, rng.randint(0, 2 * result))} for c in calls]
        if rng.random() < 0.2:
            blocks.append({"type": "text", "text": "PIN this: " + text(rng, 80)
                           if rng.random() < 0.3 else "also check the logs"})
        msgs.append({"role": "user", "content": blocks})
        if rng.random() < 0.1:
            msgs.append({"role": "user", "content": "keep going " + text(rng, 200)})
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": "On it."}]})
            msgs.append({"role": "user", "content": "go"})
    return msgs


class PinMarked:
    """Pins the user messages whose text says ``PIN``."""

    @hookimpl
    def agentcompact_pin(self, message: Any, index: int, dialect: Any) -> bool:
        content = message.get("content")
        texts = [content] if isinstance(content, str) else [
            b.get("text", "") for b in content if isinstance(b, dict)]
        return message.get("role") == "user" and any("PIN" in t for t in texts)


def run(msgs: list[Any], trigger: int, pins: bool, **options: Any) -> Compared:
    """The history replayed at once up to two thirds, then growing a turn at a time."""
    pm = new_plugin_manager()
    if pins:
        pm.register(PinMarked())
    strategy = Compared(**options)
    engine = Engine(strategy, "anthropic", Budget(trigger_tokens=trigger), counter="chars",
                    plugins=pm)
    first = len(msgs) * 2 // 3
    engine.compact(msgs[:first])
    for c in range(first + 2, len(msgs) + 1, 2):
        engine.compact(msgs[:c])
    assert strategy.mismatches == []
    return strategy


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 10_000), turns=st.integers(30, 90),
       trigger=st.sampled_from([6_000, 12_000, 20_000]), pins=st.booleans(),
       newest_share=st.sampled_from([0.35, None]))
def test_a_carried_compaction_renders_as_a_fresh_one(seed: int, turns: int, trigger: int,
                                                      pins: bool,
                                                      newest_share: float | None) -> None:
    run(history(seed, turns), trigger, pins, newest_share=newest_share)


def test_a_long_replay_starts_each_crossing_from_the_last() -> None:
    """Crossings of one replay, and of later calls, start from the carry (a call of an
    earlier cycle re-run later is rendered superseded: those items are keyed again)."""
    strategy = run(history(7, 160, result=1_500), 8_000, pins=True)
    assert strategy.compactions >= 10
    assert strategy.carried >= strategy.compactions - 2


def test_a_carry_does_not_fit_another_history() -> None:
    """The same strategy compacting another history (other message objects) starts afresh
    and renders as a fresh strategy."""
    strategy = Compared()
    for seed in (1, 2):
        engine = Engine(strategy, "anthropic", Budget(trigger_tokens=8_000), counter="chars")
        engine.compact(history(seed, 60))
    assert strategy.compactions >= 4 and strategy.mismatches == []


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), turns=st.integers(1, 30))
def test_history_loop_starts_are_those_of_a_scan(seed: int, turns: int) -> None:
    msgs = history(seed, turns)
    dialect = get_dialect("anthropic")
    cache = HistoryCache(MessageMeter(CharEstimateCounter(), dialect))
    rng = random.Random(seed)
    ends = list(range(len(msgs) + 1))
    rng.shuffle(ends)  # filled in any order
    grown = cache.extend(msgs[: len(msgs) // 2])
    for end in ends[:5]:
        if end <= len(grown):
            assert grown.loop_start(end) == loop_start(msgs, dialect, end)
    whole = cache.extend(msgs)  # extends the first (the same objects)
    for end in ends:
        assert whole.loop_start(end) == loop_start(msgs, dialect, end)
    changed = cache.extend([*msgs[:3], *json.loads(json.dumps(msgs[3:]))])
    for end in ends:
        assert changed.loop_start(end) == loop_start(changed.messages, dialect, end)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_pins_found_again_are_those_a_fresh_lookup_finds(seed: int) -> None:
    """Ranges asked in any order, over a growing history and one with other objects,
    give the pins a fresh lookup gives."""
    pm = new_plugin_manager()
    pm.register(PinMarked())
    dialect = get_dialect("anthropic")
    msgs = history(seed, 40)
    lookup = PinLookup(pm, dialect, CharEstimateCounter())
    rng = random.Random(seed)
    for _ in range(12):
        hi = rng.randint(0, len(msgs))
        lo = rng.randint(0, hi)
        view = msgs[:hi] if rng.random() < 0.8 else json.loads(json.dumps(msgs[:hi]))
        want = PinLookup(pm, dialect, CharEstimateCounter()).within(view, lo, hi)
        assert lookup.within(view, lo, hi) == want


def test_a_replay_offers_each_original_to_the_archive_about_once() -> None:
    """Each crossing of a replay offers the archive the originals of what is new to it
    (the new items, those shown or re-rendered, the kept tail), not again those of every
    earlier cycle: the items offered grow with the history, not with its square (the
    offers of all earlier cycles at each crossing were 20 times the items stored here)."""
    archive = Recording()
    engine = Engine(CliffStrategy(archive=archive), "anthropic",
                    Budget(trigger_tokens=6_000), counter="chars")
    engine.compact(history(seed=1, turns=200))
    stored = len(archive._scopes[""])
    offered = sum(map(len, archive.batches))
    assert len(archive.batches) > 10 and offered < 4 * stored, (len(archive.batches),
                                                                offered, stored)
