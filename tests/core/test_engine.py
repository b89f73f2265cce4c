from __future__ import annotations

import copy
import inspect
import json
from typing import Any

import pytest

from agentcompact import (
    Budget,
    CompactionEvent,
    ConfigError,
    Engine,
    OverBudgetError,
    StrategySettings,
    TiktokenCounter,
    get_dialect,
    hookimpl,
    new_plugin_manager,
    validate,
)
from agentcompact._markers import COMPACTION_HEADER
from agentcompact._tokens import MessageMeter
from agentcompact.strategies import CliffStrategy

from .histories import build, call_points

DIALECTS = ["openai_chat", "anthropic", "openai_responses", "gemini"]
PLAN = [(60, [1500, 200], 0), (40, [3000], 80), (0, [800, 800, 800], 0)] * 8


def engine(dialect: str, trigger: int = 3000, **kw: Any) -> Engine:
    kw.setdefault("plugins", new_plugin_manager())
    return Engine(strategy="cliff", dialect=dialect, budget=Budget(trigger_tokens=trigger), **kw)


def dumps(messages: list[Any]) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in messages]


def test_exact_call_shape() -> None:
    e = Engine(strategy="cliff", dialect="anthropic", budget=Budget(trigger_tokens=60000))
    r = e.compact(build("anthropic", PLAN))
    assert isinstance(r.messages, list) and r.compacted is False and r.event is None
    assert r.tokens_after == r.tokens_before == r.tokens_original


@pytest.mark.parametrize("name", DIALECTS)
def test_under_trigger_passes_through_by_reference(name: str) -> None:
    msgs = build(name, PLAN[:2])
    r = engine(name, trigger=10**6).compact(msgs)
    assert not r.modified and all(a is b for a, b in zip(r.messages, msgs))
    assert len(r.messages) == len(msgs) and r.messages is not msgs


@pytest.mark.parametrize("name", DIALECTS)
def test_compacts_to_target_validly(name: str) -> None:
    msgs = build(name, PLAN)
    e = engine(name, trigger=8000)
    original = copy.deepcopy(msgs)
    r = e.compact(msgs)
    assert r.compacted and r.tokens_original > 8000 >= r.tokens_after
    assert all(event.tokens_after <= e.budget.target for event in r.events)
    validate(r.messages, e.dialect)
    assert e.dialect.is_synthetic(r.messages[r.head_len])
    kept = r.messages[r.head_len + 1 :]
    assert all(a is b for a, b in zip(kept, msgs[r.cut :]))  # kept by reference
    assert msgs == original  # never mutated
    assert e.count(r.messages) == r.tokens_after


@pytest.mark.parametrize("name", DIALECTS)
def test_incremental_prefix_stable_between_cliffs_and_replay_equal(name: str) -> None:
    msgs = build(name, PLAN)
    e = engine(name)
    previous: list[str] = []
    cliffs = 0
    peak = 0
    for c in call_points(msgs, e.dialect):
        r = e.compact(msgs[:c])
        sent = dumps(r.messages)
        peak = max(peak, r.tokens_after)
        if r.compacted:
            cliffs += 1
        elif previous:
            assert sent[: len(previous)] == previous  # byte-stable prefix between cliffs
        previous = sent
        validate(r.messages, e.dialect)
    assert cliffs >= 2 and peak <= 3000
    one_shot = engine(name).compact(msgs)
    assert dumps(one_shot.messages) == previous  # replay gives the incremental result
    assert len(one_shot.events) == cliffs


@pytest.mark.parametrize("name", DIALECTS)
def test_deterministic(name: str) -> None:
    msgs = build(name, PLAN)
    assert dumps(engine(name).compact(msgs).messages) == dumps(engine(name).compact(msgs).messages)


@pytest.mark.parametrize("name", DIALECTS)
def test_never_compacts_a_compaction(name: str) -> None:
    msgs = build(name, PLAN)
    e = engine(name)
    out = e.compact(msgs).messages
    # a framework that rewrites its state feeds our output back, then grows it
    grown = out + build(name, PLAN[:6])[len(build(name, [])):]
    r = engine(name).compact(grown)
    texts = [e.dialect.text_of(m) for m in r.messages]
    # the earlier compaction is carried on verbatim (never re-rendered, never dropped) ...
    earlier = next(m for m in out if e.dialect.is_synthetic(m))
    assert r.compacted and any(m is earlier for m in r.messages)
    # ... and no compaction message quotes another one
    for t in texts:
        assert COMPACTION_HEADER not in t[len(COMPACTION_HEADER):]
    validate(r.messages, e.dialect)


def test_fail_open_to_cliff_and_reported() -> None:
    pm = new_plugin_manager()
    events: list[CompactionEvent] = []

    class Broken:
        name = "broken"

        def compact(self, request: Any) -> Any:
            raise RuntimeError("summarizer exploded")

    class Plugin:
        @hookimpl
        def agentcompact_register_strategies(self, register: Any) -> None:
            register("broken", Broken)

        @hookimpl
        def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
            events.append(event)

    pm.register(Plugin())
    e = Engine(strategy="broken", dialect="openai_chat", budget=Budget(3000), plugins=pm)
    r = e.compact(build("openai_chat", PLAN))
    assert r.compacted and r.tokens_after <= 3000
    assert events and events[-1].fallback == "cliff"
    # the error names the failure by type; a foreign message (it may quote the history) is
    # withheld from events and logs
    assert "broken: RuntimeError" in (events[-1].error or "")
    assert "exploded" not in (events[-1].error or "")
    assert not any("exploded" in e.dialect.text_of(m) for m in r.messages)


def test_cliff_failure_falls_back_to_a_plain_safe_cut() -> None:
    pm = new_plugin_manager()

    class Plugin:
        @hookimpl
        def agentcompact_render_message(self, message: Any, dialect: Any, settings: Any) -> Any:
            return ["text that is not in the message"]

    pm.register(Plugin())
    msgs = build("openai_chat", PLAN)
    r = Engine("cliff", "openai_chat", Budget(3000), plugins=pm).compact(msgs)
    assert r.modified and r.compacted and r.tokens_after <= 3000
    assert r.event is not None and "not quoted from the message" in (r.event.error or "")
    assert r.event.fallback == "safe"
    assert not any("not in the message" in str(m.get("content")) for m in r.messages)
    validate(r.messages, Engine(dialect="openai_chat").dialect, allow_pending=True)


def test_strict_raises_when_over_limit() -> None:
    msgs = build("openai_chat", [(10, [100], 0)])
    msgs[-1]["content"] = "x" * 40000  # one huge result in the only turn
    e = engine("openai_chat", trigger=2000, strict=True)
    with pytest.raises(OverBudgetError) as info:
        e.compact(msgs)
    assert info.value.tokens > info.value.limit == 2000


def test_huge_kept_result_is_truncated_head_and_tail() -> None:
    msgs = build("openai_chat", PLAN[:4])
    msgs[-1] = {**msgs[-1], "content": "HEAD " + "filler line\n" * 3000 + " TAIL"}
    e = Engine("cliff", "openai_chat", Budget(4000, 2000), plugins=new_plugin_manager())
    r = e.compact(msgs)
    assert r.tokens_after <= e.budget.target
    last = r.messages[-1]["content"]
    assert last.startswith("HEAD") and last.endswith("TAIL") and "chars omitted" in last
    again = e.compact(msgs + [{"role": "assistant", "content": "ok"},
                              {"role": "user", "content": "next"}])
    assert dumps(again.messages)[: len(r.messages)] == dumps(r.messages)


def test_force_compacts_harder() -> None:
    msgs = build("openai_chat", PLAN[:6])
    e = engine("openai_chat", trigger=10**6)
    assert not e.compact(msgs).compacted
    r = e.compact(msgs, force=True)
    assert r.compacted and r.event is not None and r.event.reason == "reactive"
    assert r.tokens_after < r.tokens_original


async def test_async_parity() -> None:
    msgs = build("anthropic", PLAN)
    sync = engine("anthropic").compact(msgs)
    asynchronous = await engine("anthropic").acompact(msgs)
    assert dumps(sync.messages) == dumps(asynchronous.messages)


def test_compact_request_body() -> None:
    body = {"model": "claude", "max_tokens": 100, "system": "sys",
            "messages": build("anthropic", PLAN)}
    e = engine("anthropic")
    new, result = e.compact_request(body)
    assert result.compacted and new is not body and new["system"] == "sys"
    assert body["messages"] is not new["messages"]
    small = {"model": "claude", "messages": build("anthropic", PLAN[:1])}
    assert e.compact_request(small)[0] is small


def test_config_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="unknown strategy 'sumary'"):
        Engine(strategy="sumary", plugins=new_plugin_manager())
    with pytest.raises(ConfigError, match="trigger_tokens must be a positive int"):
        Budget(trigger_tokens=0)
    with pytest.raises(ConfigError, match="target_tokens must be in"):
        Budget(trigger_tokens=100, target_tokens=200)
    with pytest.raises(ConfigError, match="min_recent_turns"):
        Budget(trigger_tokens=100, min_recent_turns=4, recent_turns=3)
    with pytest.raises(ConfigError, match="budget must be a Budget, got int"):
        Engine(budget=100, plugins=new_plugin_manager())  # type: ignore[arg-type]  # on purpose
    with pytest.raises(ConfigError, match="messages must be a list"):
        engine("openai_chat").compact("hello")  # type: ignore[arg-type]  # wrong on purpose


def test_engine_takes_only_its_own_parameters() -> None:
    """Budget and strategy settings are objects (``budget=Budget(...)``,
    ``strategy=StrategySettings(...)``): flat names are unknown keywords."""
    pm = new_plugin_manager()
    for flat in ({"trigger_tokens": 5000}, {"model": "m"}, {"max_cached_messages": 2},
                 {"bogus": 1}):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(flat))}'"):
            Engine(plugins=pm, **flat)  # type: ignore[arg-type]  # wrong on purpose
    params = [p for p in inspect.signature(Engine).parameters]
    assert params == ["strategy", "dialect", "budget", "counter", "store", "plugins", "strict",
                      "episode_id"]


def test_strategy_settings_name_the_field() -> None:
    for kwargs, field in (({"name": ""}, "name"), ({"options": [1]}, "options"),
                          ({"options": {1: 2}}, "options"), ({"base_url": "ftp://x"}, "base_url"),
                          ({"model": 3}, "model"), ({"api_key": ""}, "api_key"),
                          ({"summarizer": "gpt"}, "summarizer")):
        with pytest.raises(ConfigError, match=f"StrategySettings.{field}"):
            StrategySettings(**kwargs)
    settings = StrategySettings("summary", options={"timeout": 5}, model="m", api_key="sk-secret")
    assert "sk-secret" not in repr(settings)
    assert settings.factory_kwargs() == {"timeout": 5, "model": "m", "api_key": "sk-secret"}
    with pytest.raises(TypeError):
        settings.options["timeout"] = 6  # type: ignore[index]  # frozen, options too


def test_summarizer_options_name_the_problem() -> None:
    pm = new_plugin_manager()
    with pytest.raises(ConfigError, match="strategy 'cliff' does not take the settings model"):
        Engine(strategy=StrategySettings("cliff", model="gpt-4o-mini"), plugins=pm)
    with pytest.raises(ConfigError, match="model given twice"):
        Engine(strategy=StrategySettings("summary", options={"model": "b"}, model="a"), plugins=pm)
    with pytest.raises(ConfigError, match="StrategySettings.name must be a strategy name, got "
                       "CliffStrategy"):
        StrategySettings(CliffStrategy(), summarizer={"model": "m"})  # type: ignore[arg-type]
    chat = get_dialect("openai_chat")
    with pytest.raises(ConfigError, match="MessageMeter.max_entries must be a positive int"):
        MessageMeter(TiktokenCounter(), chat, max_entries=0)
    with pytest.raises(ConfigError, match="counter: a MessageMeter of dialect 'anthropic'"):
        Engine(counter=MessageMeter(TiktokenCounter(), get_dialect("anthropic")), plugins=pm)
    meter = MessageMeter(TiktokenCounter(), chat, max_entries=2)
    bounded = Engine(counter=meter, dialect=chat, budget=Budget(trigger_tokens=10**6), plugins=pm)
    assert bounded.counter is meter.counter
    msgs = build("openai_chat", PLAN)
    assert bounded.compact(msgs).tokens_before == engine("openai_chat").compact(msgs).tokens_before


def test_shared_store_between_engines() -> None:
    from agentcompact import InMemoryPrefixStore

    store = InMemoryPrefixStore()
    msgs = build("openai_chat", PLAN)
    first = engine("openai_chat", store=store).compact(msgs)
    second = engine("openai_chat", store=store).compact(json.loads(json.dumps(msgs)))
    assert second.modified and not second.compacted  # reused the stored prefix
    assert dumps(second.messages) == dumps(first.messages)


def test_store_sizes_entries_of_non_json_messages() -> None:
    from agentcompact import InMemoryPrefixStore, PrefixEntry

    class Obj:
        def __repr__(self) -> str:
            return "Obj(" + "x" * 50 + ")"

    store = InMemoryPrefixStore()
    store.put("k", PrefixEntry(1, 2, Obj(), 10, "cliff"))
    assert store.get("k") is not None and store.nbytes == len(repr(Obj()))
