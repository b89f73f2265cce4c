"""``MessageMeter.bound``: a count bounded without tokenizing (the proxy's certificate is
built on it: tests/integrations/proxy/test_speculation.py), and ``Engine.fixed_tokens``. A
wrong bound would let a body go upstream that the engine would have changed, so it is
checked on real text and real sessions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompact import Budget, Engine, get_dialect, new_plugin_manager
from agentcompact._tokens import CharEstimateCounter, MessageMeter, TiktokenCounter
from agentcompact.trajectory import iter_trajectories

from ..conftest import TRAJECTORIES, needs_shared_data


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
