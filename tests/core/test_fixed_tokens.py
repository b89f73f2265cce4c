"""The fixed part of a request (system prompt, instructions, tool schemas) counted once."""

from __future__ import annotations

from typing import Any

from agentcompact import Budget, Engine
from agentcompact.extending import FixedTokens, make_counter

TOOLS = [{"name": "bash", "description": "run a command", "input_schema": {"type": "object"}},
         {"name": "read", "description": "read a file", "input_schema": {"type": "object"}}]


def test_a_body_is_counted_as_the_engine_counts_it() -> None:
    body = {"system": "You are terse.", "tools": TOOLS, "messages": []}
    engine = Engine("cliff", "anthropic", Budget(trigger_tokens=10_000), counter="chars")
    assert FixedTokens(make_counter("chars")).count(body) == engine.fixed_tokens(body) > 0
    assert FixedTokens(make_counter("chars")).count({"messages": []}) == 0


class _Tool:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema


def test_converted_values_are_counted_as_their_body_and_converted_when_an_item_changes(
) -> None:
    converted: list[str] = []

    def convert(key: str, value: Any) -> Any:
        converted.append(key)
        return [t.schema for t in value] if key == "tools" else value

    fixed = FixedTokens(make_counter("chars"), ("system", "tools"), convert)
    tools = [_Tool(t) for t in TOOLS]
    plain = FixedTokens(make_counter("chars")).count({"system": "Be terse.", "tools": TOOLS})
    assert fixed.count({"system": "Be terse.", "tools": tuple(tools)}) == plain
    assert converted == ["system", "tools"]
    # a new tuple of the same tool objects: remembered, nothing converted again
    assert fixed.count({"system": "Be terse.", "tools": tuple(list(tools))}) == plain
    assert converted == ["system", "tools"]
    # one tool changed: converted and counted again
    other = (tools[0], _Tool({"name": "write", "description": "write a file"}))
    changed = fixed.count({"system": "Be terse.", "tools": other})
    assert converted == ["system", "tools"] * 2
    assert changed == FixedTokens(make_counter("chars")).count(
        {"system": "Be terse.", "tools": [t.schema for t in other]}) != plain
