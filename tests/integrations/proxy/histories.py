"""Agent histories in the three wire formats, long enough to cross a proxy's trigger
(``tests.tool_loop``)."""

from __future__ import annotations

from typing import Any

from agentcompact.testing import filler_text
from tests.tool_loop import Call, Step, tool_loop

TASK = "Fix the failing test in tests/test_parser.py and explain the cause."


def _read_and_grep(t: int, prefix: str, result_tokens: int) -> list[Call]:
    return [Call(f"{prefix}_{t}_a", "read_file", {"path": f"src/file_{t}.py"},
                 f"# file_{t}.py\n" + filler_text(result_tokens)),
            Call(f"{prefix}_{t}_b", "grep", {"pattern": f"def f{t}"}, f"f{t} found")]


def anthropic_history(turns: int, result_tokens: int = 300) -> list[dict[str, Any]]:
    """user task, then per turn: assistant (signed thinking, text, two parallel tool_use)
    and user (two tool_result blocks); ends with tool results (the model's turn)."""
    return tool_loop("anthropic", [
        Step(_read_and_grep(t, "toolu", result_tokens), f"Reading file_{t}.py.",
             thinking=f"step {t}: look at file {t}", signature=f"sig-{t}-" + "A" * 40)
        for t in range(turns)], task=TASK)


def chat_history(turns: int, result_tokens: int = 300) -> list[dict[str, Any]]:
    """system, user task, then per turn an assistant with two parallel tool calls and the
    two tool messages answering them."""
    steps = []
    for t in range(turns):
        a, b = _read_and_grep(t, "call", result_tokens)
        steps.append(Step([Call(a.id, a.name, f'{{"path":"src/file_{t}.py"}}', a.result),
                           Call(b.id, b.name, f'{{"pattern":"def f{t}"}}', b.result)],
                          f"Reading file_{t}.py."))
    return tool_loop("openai_chat", steps, task=TASK, system="You are a coding agent.")


def responses_history(turns: int, result_tokens: int = 300) -> list[dict[str, Any]]:
    """Responses input items: user message, then per turn an encrypted reasoning item, a
    function_call and its function_call_output."""
    return tool_loop("openai_responses", [
        Step([Call(f"call_{t}", "shell", f'{{"cmd":"cat file_{t}.py"}}',
                   f"# file_{t}.py\n" + filler_text(result_tokens), item_id=f"fc_{t}")],
             thinking="", signature=f"gAAAAB{t}" + "Z" * 60, reasoning_id=f"rs_{t}")
        for t in range(turns)], task=TASK)
