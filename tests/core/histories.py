"""Valid agent histories in every dialect, from an abstract plan (``tests.tool_loop``).

A plan is a list of turns; each turn is ``(text_len, [result_len, ...], human_len)``:
assistant text of ``text_len`` chars (0: none), one tool call per result (parallel calls
when several), and an optional human message after the results (0: none).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from tests.tool_loop import Call, Step, tool_loop

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
    """The plan as a tool loop in ``dialect`` (``tests.tool_loop``): each step's calls run
    ``bash`` (``shell`` in Responses); Anthropic, Responses and Gemini steps think (Gemini
    every other step); a step without results is answered so that turns alternate."""
    steps = [_step(dialect, k, tlen, results, human) for k, (tlen, results, human)
             in enumerate(plan)]
    system = {"openai_chat": "You are a coding agent.", "openai_responses": "You are Codex."}
    return tool_loop(dialect, steps, task=task, system=system.get(dialect))


def _step(dialect: str, k: int, tlen: int, results: list[int], human: int) -> Step:
    name = "shell" if dialect == "openai_responses" else "bash"
    prefix = {"anthropic": "toolu", "gemini": "bash"}.get(dialect, "call")
    calls = [Call(f"{prefix}_{k}_{j}", name, {"cmd": text(30, k + j)}, text(rlen, k * 3 + j))
             for j, rlen in enumerate(results)]
    step = Step(calls, text(tlen, k) if tlen else None,
                human=text(human, k + 100) if human else None)
    if dialect == "anthropic":
        after = [] if results or human else [{"role": "user", "content": "continue"}]
        return replace(step, thinking=text(40, k), signature=f"sig{k}", after=after)
    if dialect == "openai_responses":
        return replace(step, thinking=text(40, k), signature=f"gAAA{k}==", reasoning_id=f"rs_{k}",
                       human=text(human or 8, k + 100) if human or not results else None)
    if dialect == "gemini":
        return replace(step, thinking=text(40, k) if k % 2 == 0 else None,
                       signature=f"c2lnLXt7a319LQ{k}==",
                       human=text(human or 8, k + 100) if human or not results else None)
    return step


def call_points(messages: list[Any], dialect: Any) -> list[int]:
    """Indices where the agent calls the model: each turn start, and the end."""
    from agentcompact import split_turns

    turns = split_turns(messages, dialect)
    return [s for s in turns.starts if s > 0] + [len(messages)]
