"""Skim and expand: every part a compaction leaves out has a handle whose expansion is
byte-identical to the original; handles and skim lines are byte-stable."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcompact import Budget, Engine, StrategySettings, expand, new_plugin_manager
from agentcompact._archive import MemoryArchive, SQLiteArchive, handle_of
from tests.core.histories import build, call_points
from tests.integrations.conftest import Collector

turn = st.tuples(st.integers(0, 900), st.lists(st.integers(0, 4000), max_size=3),
                 st.sampled_from([0, 0, 0, 80, 3000]))
plans = st.lists(turn, min_size=2, max_size=16)
dialects = st.sampled_from(["openai_chat", "anthropic", "openai_responses", "gemini"])


def expanded(archive: Any, handle: str) -> str:
    pages, offset = [], 0
    while True:
        page = expand(archive, handle, offset, 1_000)
        pages.append(page.text)
        if page.next_offset is None:
            return "".join(pages)
        offset = page.next_offset


def test_a_result_named_on_its_calls_line_expands_when_its_own_item_shows_it() -> None:
    """Packing renders items at other levels: a call at a lean level names its result's
    handle while the result's own, newer item is shown at a richer one; the handle still
    expands (found by the handles test's search)."""
    plan = [(0, [], 0), (0, [0], 3000), (0, [994], 80), (900, [130], 3000), (170, [], 0),
            (179, [40], 3000)]
    archive = MemoryArchive()
    engine = Engine(StrategySettings("cliff", options={"archive": archive}), "openai_chat",
                    Budget(2903, 1451), plugins=new_plugin_manager())
    msgs = build("openai_chat", plan)
    d = engine.dialect
    named = 0
    for c in call_points(msgs, d):
        sent = "\n".join(d.text_of(m) for m in engine.compact(msgs[:c]).messages)
        for handle in set(re.findall(r"\[→ [^]]* expand (ac-[0-9a-f]{12})\]", sent)):
            assert archive.get(handle) is not None, handle
            named += 1
    assert named


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dialect=dialects, plan=plans, trigger=st.integers(600, 5000),
       share=st.floats(0.1, 0.6))
def test_every_part_left_out_expands_byte_identical(dialect: str, plan: Any, trigger: int,
                                                    share: float) -> None:
    pm = new_plugin_manager()
    seen = Collector()
    pm.register(seen)
    archive = MemoryArchive()
    engine = Engine(StrategySettings("cliff", options={"archive": archive}), dialect,
                    Budget(trigger, max(1, int(trigger * share))), plugins=pm)
    msgs = build(dialect, plan)
    d = engine.dialect
    checked = 0
    for c in call_points(msgs, d):
        seen.events.clear()
        result = engine.compact(msgs[:c])
        sent = "\n".join(d.text_of(m) for m in result.messages)
        handles = set(re.findall(r"ac-[0-9a-f]{12}", sent))
        for event in seen.events:
            for item in event.dropped:
                for part in d.parts(msgs[item.index]):
                    if not part.text or part.kind == "thinking" or part.text in sent:
                        continue
                    handle = handle_of(part.text)
                    assert expanded(archive, handle) == part.text  # verbatim, every byte
                    if item.action != "dropped" and event is seen.events[-1]:
                        assert handle in handles, (item, part.kind)
                    checked += 1
    assert checked >= 0  # histories under the trigger leave nothing out


def _compaction_text(engine: Engine, msgs: list[Any]) -> str:
    result = engine.compact(msgs)
    assert result.compacted
    return str(engine.dialect.text_of(result.messages[result.head_len]))


def test_skim_lines_are_byte_stable_across_a_restart(tmp_path: Path) -> None:
    plan = [(300, [2500, 900], 0), (200, [4000], 0), (0, [700], 60)] * 5
    msgs = build("anthropic", plan)
    path = tmp_path / "archive.sqlite"
    first = _compaction_text(Engine(StrategySettings("cliff", options={"archive": str(path)}),
                                    "anthropic", Budget(6000, 2500),
                                    plugins=new_plugin_manager()), msgs)
    handles = re.findall(r"ac-[0-9a-f]{12}", first)
    assert handles
    SQLiteArchive(path).close()  # the process's connection goes: the next one is new
    again = Engine(StrategySettings("cliff", options={"archive": str(path)}), "anthropic",
                   Budget(6000, 2500), plugins=new_plugin_manager())
    assert _compaction_text(again, msgs) == first  # same bytes: same prompt-cache prefix
    reopened = SQLiteArchive(path)
    for handle in handles:
        item = reopened.get(handle)
        assert item is not None and handle_of(item.text) == handle


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(dialect=dialects, plan=plans, trigger=st.integers(600, 5000),
       share=st.floats(0.1, 0.6))
def test_a_tenants_handles_expand_in_its_scope_only(dialect: str, plan: Any, trigger: int,
                                                   share: float) -> None:
    """On a shared archive every handle a tenant's engine sends — skim lines, the
    engine's truncation markers, folds — is keyed by the tenant and expands to the
    original in the tenant's view only (#36)."""
    from agentcompact import tenant_of

    shared = MemoryArchive()
    mine, other = shared.for_tenant(tenant_of("sk-mine")), shared.for_tenant(tenant_of("x"))
    engine = Engine(StrategySettings("cliff", options={"archive": mine}), dialect,
                    Budget(trigger, max(1, int(trigger * share))), plugins=new_plugin_manager())
    msgs = build(dialect, plan)
    d = engine.dialect
    texts = {p.text for m in msgs for p in d.parts(m) if p.text}
    for c in call_points(msgs, d):
        result = engine.compact(msgs[:c])
        sent = "\n".join(d.text_of(m) for m in result.messages)
        for handle in set(re.findall(r"ac-[0-9a-f]{12}", sent)):
            original = expanded(mine, handle)
            assert original in texts and mine.handle_of(original) == handle  # type: ignore[attr-defined]
            assert handle_of(original) != handle  # keyed, not the content digest
            assert other.get(handle) is None and shared.get(handle) is None
