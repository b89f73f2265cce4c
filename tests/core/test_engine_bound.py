"""``MessageMeter.bound`` / ``Engine.token_bound`` / ``Engine.leaves_unchanged``: a count
bounded without tokenizing, and the certificate the proxy completes a held request on
before measuring. A wrong bound or certificate would let a body go upstream that the
engine would have changed, so these are checked on real text and real sessions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompact import Budget, Engine, PrefixEntry, get_dialect, hookimpl, new_plugin_manager
from agentcompact._tokens import CharEstimateCounter, MessageMeter, TiktokenCounter
from agentcompact.trajectory import iter_trajectories

from ..conftest import TRAJECTORIES, needs_shared_data
from .histories import build
from .test_engine_reuse import DictStore

PLAN = [(60, [1500, 200], 0), (40, [3000], 80), (0, [800, 800, 800], 0)] * 4


class OpaqueCounter:
    """A real counter that makes no promise about tokens per byte."""

    name = "opaque"

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        return CharEstimateCounter().count_texts(texts)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=400))
def test_bound_is_at_least_the_tiktoken_count_of_any_text(text: str) -> None:
    meter = MessageMeter(TiktokenCounter(), get_dialect("openai_chat"))
    message = {"role": "user", "content": text}
    bound = meter.bound([message])
    assert bound is not None
    assert bound >= meter.measure([message]).tokens[0]


@needs_shared_data("trajectories", "claude-code")
def test_bound_is_at_least_the_count_of_every_real_message() -> None:
    checked = 0
    for traj in iter_trajectories(TRAJECTORIES / "claude-code"):
        meter = MessageMeter(TiktokenCounter(), get_dialect(traj.dialect))
        bounds = [meter.bound([m]) for m in traj.messages]  # before anything is cached
        counts = meter.measure(traj.messages).tokens
        for bound, count in zip(bounds, counts, strict=True):
            assert bound is not None and bound >= count
        # once counted, a message is bounded by its exact count
        assert meter.bound(traj.messages) == sum(counts)
        checked += len(counts)
    assert checked > 1000


def test_images_and_overheads_are_in_the_bound() -> None:
    meter = MessageMeter(CharEstimateCounter(), get_dialect("anthropic"))
    image = {"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.test/a.png"}},
        {"type": "text", "text": "what is this?"}]}
    bound = meter.bound([image])
    assert bound is not None and bound >= meter.measure([image]).tokens[0] >= 1600


def test_no_bound_without_the_counters_promise() -> None:
    meter = MessageMeter(OpaqueCounter(), get_dialect("openai_chat"))
    assert meter.bound([{"role": "user", "content": "hi"}]) is None


def engine(trigger: int, **kw: Any) -> Engine:
    kw.setdefault("plugins", new_plugin_manager())
    return Engine(strategy="cliff", dialect="openai_chat",
                  budget=Budget(trigger_tokens=trigger), **kw)


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
        bound = e.token_bound(messages)
        assert bound is not None
        sure = e.leaves_unchanged(bound, since)
        version = e.store_version
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
    version = e.store_version
    assert version is not None
    assert e.leaves_unchanged(10, version)
    e.store.put("some-chain-digest", PrefixEntry(head_len=1, cut=1, message=history[0],
                                                 message_tokens=10, strategy="cliff"))
    assert not e.leaves_unchanged(10, version)  # something was stored since
    assert not e.leaves_unchanged(10, None)
    assert not e.leaves_unchanged(100_001, e.store_version)  # over the trigger

    plain = engine(trigger=100_000, store=DictStore())  # a store without a version
    assert plain.store_version is None
    assert not plain.leaves_unchanged(10, plain.store_version)


def test_no_certificate_when_a_plugin_decides_compaction() -> None:
    class Always:
        @hookimpl
        def agentcompact_should_compact(self, messages: Any, tokens: int, budget: Any,
                                        dialect: Any) -> bool:
            return True

    pm = new_plugin_manager()
    pm.register(Always())
    e = engine(trigger=100_000, plugins=pm)
    assert not e.leaves_unchanged(10, e.store_version)


def test_token_bound_is_none_for_a_counter_without_the_promise() -> None:
    e = engine(trigger=100_000, counter=OpaqueCounter())
    assert e.token_bound([{"role": "user", "content": "hi"}]) is None


def test_fixed_tokens_count_system_instructions_and_tools_by_content() -> None:
    e = engine(trigger=100_000, counter=TiktokenCounter())
    tools = [{"name": "read_file", "description": "Read a file from the repository.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    body = {"system": "You are a coding agent.", "tools": tools, "messages": []}
    expected = sum(TiktokenCounter().count_texts(
        ["You are a coding agent.", orjson.dumps(tools).decode()]))
    assert e.fixed_tokens(body) == expected
    assert e.fixed_tokens({**body, "messages": [1]}) == expected  # same values: remembered
    assert e.fixed_tokens(orjson.loads(orjson.dumps(body))) == expected  # equal copies
    assert e.fixed_tokens({**body, "tools": [*tools, {"name": "grep"}]}) > expected
    assert e.fixed_tokens({"messages": []}) == 0
    assert e.fixed_tokens({"instructions": "Be brief.", "messages": []}) == 3
