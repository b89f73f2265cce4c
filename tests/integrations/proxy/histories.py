"""Agent histories in the three wire formats, long enough to cross a proxy's trigger."""

from __future__ import annotations

from typing import Any

from agentcompact.testing import filler_text

TASK = "Fix the failing test in tests/test_parser.py and explain the cause."


def anthropic_history(turns: int, result_tokens: int = 300) -> list[dict[str, Any]]:
    """user task, then per turn: assistant (signed thinking, text, two parallel tool_use)
    and user (two tool_result blocks); ends with tool results (the model's turn)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"step {t}: look at file {t}",
             "signature": f"sig-{t}-" + "A" * 40},
            {"type": "text", "text": f"Reading file_{t}.py."},
            {"type": "tool_use", "id": f"toolu_{t}_a", "name": "read_file",
             "input": {"path": f"src/file_{t}.py"}},
            {"type": "tool_use", "id": f"toolu_{t}_b", "name": "grep",
             "input": {"pattern": f"def f{t}"}},
        ]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{t}_a",
             "content": f"# file_{t}.py\n" + filler_text(result_tokens)},
            {"type": "tool_result", "tool_use_id": f"toolu_{t}_b", "content": f"f{t} found"},
        ]})
    return messages


def chat_history(turns: int, result_tokens: int = 300) -> list[dict[str, Any]]:
    """system, user task, then per turn an assistant with two parallel tool calls and the
    two tool messages answering them."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": TASK}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": f"Reading file_{t}.py.", "tool_calls": [
            {"id": f"call_{t}_a", "type": "function",
             "function": {"name": "read_file", "arguments": f'{{"path":"src/file_{t}.py"}}'}},
            {"id": f"call_{t}_b", "type": "function",
             "function": {"name": "grep", "arguments": f'{{"pattern":"def f{t}"}}'}},
        ]})
        messages.append({"role": "tool", "tool_call_id": f"call_{t}_a",
                         "content": f"# file_{t}.py\n" + filler_text(result_tokens)})
        messages.append({"role": "tool", "tool_call_id": f"call_{t}_b", "content": f"f{t} found"})
    return messages


def responses_history(turns: int, result_tokens: int = 300) -> list[dict[str, Any]]:
    """Responses input items: user message, then per turn an encrypted reasoning item, a
    function_call and its function_call_output."""
    items: list[dict[str, Any]] = [{"type": "message", "role": "user",
                                    "content": [{"type": "input_text", "text": TASK}]}]
    for t in range(turns):
        items.append({"type": "reasoning", "id": f"rs_{t}", "summary": [],
                      "encrypted_content": f"gAAAAB{t}" + "Z" * 60})
        items.append({"type": "function_call", "id": f"fc_{t}", "call_id": f"call_{t}",
                      "name": "shell", "arguments": f'{{"cmd":"cat file_{t}.py"}}'})
        items.append({"type": "function_call_output", "call_id": f"call_{t}",
                      "output": f"# file_{t}.py\n" + filler_text(result_tokens)})
    return items
