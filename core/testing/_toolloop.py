"""A model that works through a task with whatever tool the client offers: the scripted
tool loop of ``python -m agentcompact.testing --script tool-loop``.

Each request that offers a function tool is answered with a call to the first such tool,
its arguments made up from the tool's JSON schema, until ``steps`` calls have been made
since the user's last message; then a final text. Each step's arguments grow (a string
names step ``k``, an integer is ``k + 1``), and each tool result the client appends grows
the context, so a compaction shows within a few steps at a small trigger.

The step is read from the request, not counted: the call id of the newest tool result
carries it (``call_loop<k>_<n>`` / ``toolu_loop<k>_<n>``), so concurrent clients, a retried
request and a history a compaction shortened all get the right next step. A client that
rewrites ids gets the number of tool results since the last user message instead.
Requests with no tool (a summarizer's) get a short digest of the prompt.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ._script import Reply, Script, ToolCall, digest_reply

__all__ = ["DEFAULT_LOOP_STEPS", "ToolLoopModel", "tool_loop_script"]

#: Tool calls per user message when the command line does not say.
DEFAULT_LOOP_STEPS = 8
_STEP_ID = re.compile(r"loop(\d+)_")
_RESULT_TYPES = ("function_call_output", "custom_tool_call_output")


class ToolLoopModel:
    """The responder: ``steps`` tool calls per user message, then ``"Done: …"``."""

    def __init__(self, steps: int = DEFAULT_LOOP_STEPS) -> None:
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        self.steps = steps
        self._serial: Iterator[int] = itertools.count()
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        tool = _first_function_tool(body)
        if tool is None:
            return digest_reply(body)
        step = _next_step(body)
        if step >= self.steps:
            return Reply(f"Done: {self.steps} tool calls made.")
        with self._lock:
            serial = next(self._serial)
        name, schema, anthropic = tool
        prefix = "toolu_" if anthropic else "call_"
        call = ToolCall(name, _arguments(schema, step), id=f"{prefix}loop{step}_{serial}")
        return Reply.calling(call, text=f"Step {step + 1} of {self.steps}: calling {name}.")


def tool_loop_script(steps: int = DEFAULT_LOOP_STEPS) -> Script:
    """A :class:`Script` answering every request with :class:`ToolLoopModel`."""
    return Script(then=ToolLoopModel(steps))


def _first_function_tool(body: Mapping[str, Any]) -> tuple[str, Mapping[str, Any], bool] | None:
    """(name, JSON schema of its arguments, Anthropic-shaped) of the first function tool."""
    for tool in body.get("tools") or []:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            return function["name"], _schema(function.get("parameters")), False
        if isinstance(tool.get("name"), str) and tool.get("type") in (None, "function"):
            anthropic = "input_schema" in tool
            schema = tool.get("input_schema") if anthropic else tool.get("parameters")
            return tool["name"], _schema(schema), anthropic
    return None


def _schema(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _arguments(schema: Mapping[str, Any], step: int) -> dict[str, Any]:
    """Arguments for every property of ``schema``, each naming ``step``."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return {}
    return {name: _value(name, spec if isinstance(spec, Mapping) else {}, step)
            for name, spec in properties.items()}


def _value(name: str, spec: Mapping[str, Any], step: int) -> Any:
    enum = spec.get("enum")
    if isinstance(enum, Sequence) and not isinstance(enum, str) and enum:
        return enum[step % len(enum)]
    kind = spec.get("type")
    if isinstance(kind, list):  # ["string", "null"]
        kind = next((k for k in kind if k != "null"), "string")
    if kind in ("integer", "number"):
        return step + 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return {}
    if "path" in name.lower() or "file" in name.lower():
        return f"src/module_{step}.py"
    return f"{name} {step}"


def _next_step(body: Mapping[str, Any]) -> int:
    """Step of the call to make now: one past the newest tool result's, 0 after user text."""
    items = body.get("messages") if "messages" in body else body.get("input")
    if not isinstance(items, list) or not items:
        return 0
    ids = _result_ids(items[-1])
    if not ids:
        return 0
    for call_id in reversed(ids):
        found = _STEP_ID.search(call_id)
        if found:
            return int(found.group(1)) + 1
    return _results_since_user_text(items)


def _result_ids(item: Any) -> list[str]:
    """The call ids a message answers (empty when it is not a tool result)."""
    if not isinstance(item, Mapping):
        return []
    if item.get("role") == "tool":  # Chat Completions
        return [str(item.get("tool_call_id") or "")]
    if item.get("type") in _RESULT_TYPES:  # Responses
        return [str(item.get("call_id") or "")]
    content = item.get("content")
    if item.get("role") == "user" and isinstance(content, list):  # Anthropic
        return [str(block.get("tool_use_id") or "") for block in content
                if isinstance(block, Mapping) and block.get("type") == "tool_result"]
    return []


def _results_since_user_text(items: list[Any]) -> int:
    count = 0
    for item in reversed(items):
        if _result_ids(item):
            count += 1
        elif isinstance(item, Mapping) and item.get("role") == "user":
            break
    return count
