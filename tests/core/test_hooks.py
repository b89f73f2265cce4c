"""One test per hook (meta-tested below: every hookspec has one and a docs section)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import agentcompact
from agentcompact import (
    Budget,
    CompactionEvent,
    Engine,
    EpisodeEnd,
    ModelCall,
    SummaryCall,
    hookimpl,
    log_episode_end,
    log_model_call,
    log_summary_call,
    new_plugin_manager,
)
from agentcompact import (
    _hookspecs as hookspecs,
)
from agentcompact.dialects import OpenAIChatDialect
from agentcompact.strategies import CliffStrategy

from .histories import build

ROOT = Path(__file__).resolve().parents[2]
PLAN = [(60, [1500, 200], 0), (40, [3000], 80)] * 6
HOOKS = sorted(n.removeprefix("agentcompact_") for n in dir(hookspecs)
               if n.startswith("agentcompact_"))


def test_hook_register_strategies() -> None:
    pm = new_plugin_manager()

    class Mine(CliffStrategy):
        pass

    class Plugin:
        @hookimpl
        def agentcompact_register_strategies(self, register: Any) -> None:
            register("cliff", Mine)  # overrides the built-in (trylast)
            register("mine", Mine)

    pm.register(Plugin())
    assert isinstance(Engine("cliff", plugins=pm).strategy, Mine)
    assert isinstance(Engine("mine", plugins=pm).strategy, Mine)


def test_hook_register_dialects() -> None:
    pm = new_plugin_manager()

    class Shouting(OpenAIChatDialect):
        name = "shouting"  # type: ignore[misc]  # a subclass renames its dialect

    class Plugin:
        @hookimpl
        def agentcompact_register_dialects(self, register: Any) -> None:
            register(Shouting())

    pm.register(Plugin())
    assert Engine(dialect="shouting", plugins=pm).dialect.name == "shouting"


def test_hook_should_compact() -> None:
    pm = new_plugin_manager()
    seen: list[int] = []

    class Plugin:
        @hookimpl
        def agentcompact_should_compact(self, messages: Any, tokens: int, budget: Any,
                                        dialect: Any) -> bool:
            seen.append(tokens)
            return len(messages) > 10

    pm.register(Plugin())
    msgs = build("openai_chat", PLAN)
    assert Engine("cliff", "openai_chat", Budget(10**6), plugins=pm).compact(msgs).compacted
    assert seen and seen[0] > 0
    short = msgs[:8]
    assert not Engine("cliff", "openai_chat", Budget(10), plugins=pm).compact(short).compacted


def test_hook_pin() -> None:
    pm = new_plugin_manager()

    class Plugin:
        @hookimpl
        def agentcompact_pin(self, message: Any, index: int, dialect: Any) -> bool:
            return message.get("role") == "tool" and index == 4

    pm.register(Plugin())
    msgs = build("openai_chat", PLAN)
    r = Engine("cliff", "openai_chat", Budget(1500, 1200), plugins=pm).compact(msgs[:12])
    assert r.compacted and msgs[4]["content"] in r.messages[r.head_len]["content"]


def test_hook_render_message() -> None:
    pm = new_plugin_manager()

    class Plugin:
        @hookimpl
        def agentcompact_render_message(self, message: Any, dialect: Any, settings: Any) -> Any:
            return [] if message.get("role") == "tool" else None  # drop every result

    pm.register(Plugin())
    msgs = build("openai_chat", PLAN)
    r = Engine("cliff", "openai_chat", Budget(6000), plugins=pm).compact(msgs)
    assert r.compacted and "[tool result]" not in r.messages[r.head_len]["content"]


def test_hook_summary_prompt() -> None:
    pm = new_plugin_manager()

    class Plugin:
        @hookimpl
        def agentcompact_summary_prompt(self, messages: Any, dialect: Any, settings: Any) -> Any:
            return [{"role": "user", "content": f"summarize {len(messages)} messages"}]

    pm.register(Plugin())
    result = pm.hook.agentcompact_summary_prompt(messages=[1, 2], dialect=None, settings={})
    assert result == [{"role": "user", "content": "summarize 2 messages"}]
    # the summary strategy's use of it is tested against a live endpoint in tests/strategies


def test_hook_on_compaction() -> None:
    pm = new_plugin_manager()
    events: list[CompactionEvent] = []

    class Plugin:
        @hookimpl
        def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
            events.append(event)

    pm.register(Plugin())
    msgs = build("anthropic", PLAN)
    r = Engine("cliff", "anthropic", Budget(6000), plugins=pm, episode_id="ep1").compact(msgs)
    assert events and events[-1] is r.event and events[-1].episode_id == "ep1"
    assert events[-1].tokens_before > events[-1].tokens_after
    assert {d.action for d in events[-1].dropped} <= {"rendered", "truncated", "dropped"}
    assert CompactionEvent.from_dict(events[-1].to_dict()) == events[-1]


def _collect(hook: str) -> tuple[Any, list[Any]]:
    pm = new_plugin_manager()
    seen: list[Any] = []

    # pluggy passes only the parameters an implementation names without a default
    def on_call(self: Any, call: Any) -> None:
        seen.append(call)

    def on_episode(self: Any, episode: Any) -> None:
        seen.append(episode)

    impl = on_episode if hook.endswith("episode_end") else on_call
    plugin = type("Plugin", (), {hook: hookimpl(impl)})
    pm.register(plugin())
    return pm, seen


def test_hook_log_model_call() -> None:
    pm, seen = _collect("agentcompact_log_model_call")
    call = ModelCall("ep", "openai_chat", [{"role": "user", "content": "hi"}],
                     [{"role": "assistant", "content": "yo"}])
    log_model_call(call, pm)
    assert seen == [call] and ModelCall.from_dict(call.to_dict()) == call


def test_hook_log_summary_call() -> None:
    pm, seen = _collect("agentcompact_log_summary_call")
    call = SummaryCall("ep", "summary", [{"role": "user", "content": "x"}], "a summary")
    log_summary_call(call, pm)
    assert seen == [call] and SummaryCall.from_dict(call.to_dict()) == call


def test_hook_log_episode_end() -> None:
    pm, seen = _collect("agentcompact_log_episode_end")
    episode = log_episode_end("ep", 1.0, "complete", pm=pm, group_id="task-1")
    assert seen == [episode] and isinstance(episode, EpisodeEnd)
    assert EpisodeEnd.from_dict(episode.to_dict()) == episode


def test_every_hook_has_a_test_and_a_docs_section() -> None:
    tests = {n for n in globals() if n.startswith("test_hook_")}
    docs = (ROOT / "docs" / "hooks.md").read_text()
    for hook in HOOKS:
        assert f"test_hook_{hook}" in tests, hook
        assert re.search(rf"^## `agentcompact_{hook}", docs, re.M), hook


def test_all_matches_public_names() -> None:
    public = {n for n in dir(agentcompact) if not n.startswith("_")}
    modules = {"budget", "dialects", "engine", "errors", "events", "hookspecs", "markers",
               "pluginmanager", "store", "strategies", "tokens", "turns", "logging_hooks"}
    assert set(agentcompact.__all__) - {"__version__"} <= public
    extra = public - set(agentcompact.__all__) - modules - {"annotations"}
    assert all(isinstance(getattr(agentcompact, n), type(agentcompact)) for n in extra), extra
