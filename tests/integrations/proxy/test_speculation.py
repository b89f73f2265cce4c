"""``Speculation``: the certificate the proxy completes a held request on before the engine
has measured it (a token bound, the prefix store's version, the trigger). A wrong
certificate would let a body go upstream that the engine would have changed, so it is
checked against ``Engine.compact`` step by step on a growing session."""

from __future__ import annotations

from typing import Any

import pytest

from agentcompact import Budget, Engine, PrefixEntry, get_dialect, hookimpl, new_plugin_manager
from agentcompact._tokens import MessageMeter, make_counter
from agentcompact.errors import ConfigError
from agentcompact.integrations.proxy._speculation import Speculation

from ...core.histories import build
from ...core.test_engine_bound import OpaqueCounter
from ...core.test_engine_reuse import DictStore

PLAN = [(60, [1500, 200], 0), (40, [3000], 80), (0, [800, 800, 800], 0)] * 4
SPEC = Speculation()


def engine(trigger: int, counter: Any = None, **kw: Any) -> Engine:
    """An engine as the proxy builds one: with a meter of its own, watched by ``SPEC``."""
    kw.setdefault("plugins", new_plugin_manager())
    meter = MessageMeter(make_counter(counter), get_dialect("openai_chat"))
    return SPEC.watch(Engine(strategy="cliff", dialect="openai_chat",
                             budget=Budget(trigger_tokens=trigger), counter=meter, **kw), meter)


def test_certificate_agrees_with_compact_on_a_growing_session() -> None:
    """At every step: when the certificate (bound from the step before, store version
    unchanged) says unchanged, ``compact`` leaves the history unchanged; it is given on
    most steps under the trigger and never once the session has been compacted."""
    history = build("openai_chat", PLAN)
    e = engine(trigger=5_000)
    since: int | None = None
    certified = 0
    compacted_once = False
    for n in range(3, len(history) + 1):
        messages = history[:n]
        bound = SPEC.token_bound(e, messages)
        assert bound is not None
        sure = SPEC.leaves_unchanged(e, bound, since)
        version = SPEC.store_version(e)
        result = e.compact(messages)
        if sure:
            certified += 1
            assert not result.modified and result.messages == messages
            assert not compacted_once
        compacted_once = compacted_once or result.modified
        since = version if not result.modified else None
    assert compacted_once
    assert certified >= 5


def test_no_certificate_after_a_put_or_without_a_store_version() -> None:
    e = engine(trigger=100_000)
    history = build("openai_chat", PLAN[:3])
    version = SPEC.store_version(e)
    assert version is not None
    assert SPEC.leaves_unchanged(e, 10, version)
    e.store.put("some-chain-digest", PrefixEntry(head_len=1, cut=1, message=history[0],
                                                 message_tokens=10, strategy="cliff"))
    assert not SPEC.leaves_unchanged(e, 10, version)  # something was stored since
    assert not SPEC.leaves_unchanged(e, 10, None)
    assert not SPEC.leaves_unchanged(e, 100_001, SPEC.store_version(e))  # over the trigger

    plain = engine(trigger=100_000, store=DictStore())  # a store without a version
    assert SPEC.store_version(plain) is None
    assert not SPEC.leaves_unchanged(plain, 10, SPEC.store_version(plain))


def test_no_certificate_when_a_plugin_decides_compaction() -> None:
    class Always:
        @hookimpl
        def agentcompact_should_compact(self, messages: Any, tokens: int, budget: Any,
                                        dialect: Any) -> bool:
            return True

    pm = new_plugin_manager()
    pm.register(Always())
    e = engine(trigger=100_000, plugins=pm)
    assert not SPEC.leaves_unchanged(e, 10, SPEC.store_version(e))


def test_token_bound_is_none_for_a_counter_without_the_promise() -> None:
    e = engine(trigger=100_000, counter=OpaqueCounter())
    assert SPEC.token_bound(e, [{"role": "user", "content": "hi"}]) is None


def test_no_bound_for_an_engine_not_watched_or_a_meter_not_its_own() -> None:
    """The bound reads the meter the engine counts with: an engine built without one the
    speculation knows gets no bound, and a meter of another engine is refused."""
    plain = Engine(strategy="cliff", dialect="openai_chat", plugins=new_plugin_manager())
    assert SPEC.token_bound(plain, [{"role": "user", "content": "hi"}]) is None
    other = MessageMeter(make_counter(None), get_dialect("openai_chat"))
    with pytest.raises(ConfigError, match="not the engine's counter"):
        Speculation().watch(plain, other)
