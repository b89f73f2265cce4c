"""A scripted tool-using model for the host-framework tests (LiteLLM, the Agents SDK,
PydanticAI, ADK): it calls a ``read_file`` tool at each step with the step's number, and
answers ``All steps done.`` after ``steps`` tool results. The step is read from the newest
tool result of the request (``STEP <i>``), never from a counter, so a compacted request
still gets the right next step. The request checks the host's tests share live here too."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from agentcompact import get_dialect, validate
from agentcompact.testing import Reply, ToolCall

STEP = re.compile(r"STEP (\d+) OF ")
DONE = "All steps done."


def step_output(path: str, size: int) -> str:
    """What ``read_file(path)`` returns: the step marker, then ``size`` characters of lines."""
    match = re.search(r"(\d+)", path)
    n = int(match.group(1)) if match else 0
    line = f"line of {path}: the quick brown fox jumps over the lazy dog {n}\n"
    body = (line * (size // len(line) + 1))[:size]
    return f"STEP {n} OF ?\n{body}"


def _texts(value: Any) -> list[str]:
    """Every string inside ``value`` (a request body or a part of one), in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


FINISH = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # how mini-swe-agent's agent ends


def tool_loop(steps: int) -> Callable[[Any], Reply]:
    """A responder: the next ``read_file(path="step_<i>.txt")`` call, or the final answer
    after step ``steps``. Offered a ``bash`` tool (mini-swe-agent), it runs
    ``cat step_<i>.txt`` instead, and ends with mini-swe-agent's submit command."""

    def answer(body: Any) -> Reply:
        tools = _texts(body.get("tools") or body.get("functions") or [])
        if not tools:
            return Reply("no tools offered")
        done = [int(m.group(1)) for t in _texts(_history(body)) for m in STEP.finditer(t)]
        n = max(done) + 1 if done else 1
        bash = "bash" in tools
        if n > steps:
            return Reply.calling(ToolCall("bash", {"command": FINISH})) if bash else Reply(DONE)
        if bash:
            return Reply.calling(ToolCall("bash", {"command": f"cat step_{n}.txt"}))
        return Reply.calling(ToolCall("read_file", {"path": f"step_{n}.txt"}))

    return answer


def _history(body: Any) -> Any:
    return body.get("messages", body.get("input", body.get("contents")))


def check_requests(bodies: Sequence[dict[str, Any]], dialect: str) -> None:
    """Every request is valid for its provider (tool pairs whole, role order)."""
    d = get_dialect(dialect)
    key = d.messages_key
    for i, body in enumerate(bodies):
        try:
            validate(body[key], d)
        except Exception as exc:  # name the request in the failure
            raise AssertionError(f"request {i} is invalid: {exc}") from exc


def prefix_changes(bodies: Sequence[dict[str, Any]], key: str = "messages") -> int:
    """Requests whose messages do not start with the previous request's messages (a
    compaction, or a cache-breaking rewrite)."""
    changes = 0
    for before, after in zip(bodies, bodies[1:]):
        a, b = before[key], after[key]
        if b[:len(a)] != a:
            changes += 1
    return changes
