"""Builders of valid agent histories in every dialect, from an abstract plan.

A plan is a list of turns; each turn is ``(text_len, [result_len, ...], human_len)``:
assistant text of ``text_len`` chars (0: none), one tool call per result (parallel calls
when several), and an optional human message after the results (0: none).
"""

from __future__ import annotations

import json
import random
from typing import Any

WORDS = ("alpha beta gamma delta src/app.py make test error 42 0x1f run_tests() "
         "FileNotFoundError assert ok").split()


def text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n:
        word = rng.choice(WORDS) + str(rng.randint(0, 999))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n]


Plan = list[tuple[int, list[int], int]]


def build(dialect: str, plan: Plan, task: str = "Fix the bug in src/app.py.") -> list[Any]:
    return {"openai_chat": _chat, "anthropic": _anthropic, "openai_responses": _responses,
            "gemini": _gemini}[dialect](plan, task)


def _chat(plan: Plan, task: str) -> list[Any]:
    msgs: list[Any] = [{"role": "system", "content": "You are a coding agent."},
                       {"role": "user", "content": task}]
    for k, (tlen, results, human) in enumerate(plan):
        calls = [{"id": f"call_{k}_{j}", "type": "function",
                  "function": {"name": "bash", "arguments": json.dumps({"cmd": text(30, k + j)})}}
                 for j in range(len(results))]
        msg: dict[str, Any] = {"role": "assistant", "content": text(tlen, k) if tlen else None}
        if calls:
            msg["tool_calls"] = calls
        msgs.append(msg)
        for j, rlen in enumerate(results):
            msgs.append({"role": "tool", "tool_call_id": f"call_{k}_{j}",
                         "content": text(rlen, k * 3 + j)})
        if human:
            msgs.append({"role": "user", "content": text(human, k + 100)})
    return msgs


def _anthropic(plan: Plan, task: str) -> list[Any]:
    msgs: list[Any] = [{"role": "user", "content": task}]
    for k, (tlen, results, human) in enumerate(plan):
        blocks: list[Any] = [{"type": "thinking", "thinking": text(40, k), "signature": f"sig{k}"}]
        if tlen:
            blocks.append({"type": "text", "text": text(tlen, k)})
        blocks += [{"type": "tool_use", "id": f"toolu_{k}_{j}", "name": "bash",
                    "input": {"cmd": text(30, k + j)}} for j in range(len(results))]
        msgs.append({"role": "assistant", "content": blocks})
        content: list[Any] = [{"type": "tool_result", "tool_use_id": f"toolu_{k}_{j}",
                               "content": text(rlen, k * 3 + j)}
                              for j, rlen in enumerate(results)]
        if human:
            content.append({"type": "text", "text": text(human, k + 100)})
        if content:
            msgs.append({"role": "user", "content": content})
        else:
            msgs.append({"role": "user", "content": "continue"})
    return msgs


def _responses(plan: Plan, task: str) -> list[Any]:
    msgs: list[Any] = [{"type": "message", "role": "developer",
                        "content": [{"type": "input_text", "text": "You are Codex."}]},
                       {"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": task}]}]
    for k, (tlen, results, human) in enumerate(plan):
        msgs.append({"type": "reasoning", "id": f"rs_{k}", "summary": [
            {"type": "summary_text", "text": text(40, k)}], "encrypted_content": f"gAAA{k}=="})
        if tlen:
            msgs.append({"type": "message", "role": "assistant",
                         "content": [{"type": "output_text", "text": text(tlen, k)}]})
        for j in range(len(results)):
            msgs.append({"type": "function_call", "call_id": f"call_{k}_{j}", "name": "shell",
                         "arguments": json.dumps({"cmd": text(30, k + j)})})
        for j, rlen in enumerate(results):
            msgs.append({"type": "function_call_output", "call_id": f"call_{k}_{j}",
                         "output": text(rlen, k * 3 + j)})
        if human or not results:
            msgs.append({"type": "message", "role": "user",
                         "content": [{"type": "input_text", "text": text(human or 8, k + 100)}]})
    return msgs


def _gemini(plan: Plan, task: str) -> list[Any]:
    """Gemini CLI's shape: a thought summary on every other step, the signature on each
    step's first call, all of a step's function responses in one user content."""
    msgs: list[Any] = [{"role": "user", "parts": [{"text": task}]}]
    for k, (tlen, results, human) in enumerate(plan):
        parts: list[Any] = []
        if k % 2 == 0:
            parts.append({"text": text(40, k), "thought": True})
        if tlen:
            parts.append({"text": text(tlen, k)})
        calls = [{"functionCall": {"id": f"bash_{k}_{j}", "name": "bash",
                                   "args": {"cmd": text(30, k + j)}}}
                 for j in range(len(results))]
        if calls:
            calls[0]["thoughtSignature"] = f"c2lnLXt7a319LQ{k}=="
        msgs.append({"role": "model", "parts": parts + calls or [{"text": "ok"}]})
        if results:
            msgs.append({"role": "user", "parts": [
                {"functionResponse": {"id": f"bash_{k}_{j}", "name": "bash",
                                      "response": {"output": text(rlen, k * 3 + j)}}}
                for j, rlen in enumerate(results)]})
        if human or not results:
            msgs.append({"role": "user", "parts": [{"text": text(human or 8, k + 100)}]})
    return msgs


def call_points(messages: list[Any], dialect: Any) -> list[int]:
    """Indices where the agent calls the model: each turn start, and the end."""
    from agentcompact import split_turns

    turns = split_turns(messages, dialect)
    return [s for s in turns.starts if s > 0] + [len(messages)]
