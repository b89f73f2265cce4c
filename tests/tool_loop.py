"""The one builder of synthetic agent histories the tests use: a tool loop in any dialect.

A history is a task (and an optional system prompt), then steps: what the model said
(thinking, text, tool calls) and what came back (each call's result, then optionally a
human message). :func:`tool_loop` renders the steps in a dialect's wire shape — the
shapes the harnesses send (Claude Code, Codex, Gemini CLI, OpenAI chat agents) — and every
test module builds its histories by choosing the steps' content, never the wire format.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "Step", "tool_loop"]


@dataclass(frozen=True)
class Call:
    """A tool call and its result.

    :param args: the call's arguments (a dict, or the JSON text of them as sent).
    :param result: what the tool returned (text).
    :param item_id: the Responses ``function_call`` item's own id (none: no ``id`` key).
    """

    id: str
    name: str
    args: dict[str, Any] | str
    result: str
    item_id: str | None = None


@dataclass(frozen=True)
class Step:
    """One model output and what followed it.

    :param thinking: Anthropic thinking text, the Responses reasoning summary (``""``: an
        empty summary), Gemini's thought summary; ``None``: none.
    :param signature: the thinking's signature, the reasoning's ``encrypted_content``,
        Gemini's ``thoughtSignature`` on the first call.
    :param reasoning_id: the Responses reasoning item's id.
    :param human: a user message after the results (Anthropic: a text block in the
        results' user message).
    :param after: messages appended as they are after the step.
    """

    calls: Sequence[Call] = ()
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    reasoning_id: str | None = None
    human: str | None = None
    after: Sequence[Any] = field(default_factory=tuple)


def tool_loop(dialect: str, steps: Sequence[Step], *, task: str | Sequence[str] | None,
              system: str | None = None) -> list[Any]:
    """The messages of ``steps`` in ``dialect`` (``openai_chat``, ``anthropic``,
    ``openai_responses``, ``gemini``), after the system prompt and the task (``None``: no
    head: steps to append to a history; Gemini: several texts are several parts)."""
    render = {"openai_chat": _chat, "anthropic": _anthropic, "openai_responses": _responses,
              "gemini": _gemini}[dialect]
    head = [] if task is None else _HEADS[dialect](task, system)
    out: list[Any] = list(head)
    for step in steps:
        out += render(step)
        out += step.after
    return out


def _text(task: str | Sequence[str]) -> str:
    return task if isinstance(task, str) else "\n".join(task)


def _arguments(call: Call) -> str:
    return call.args if isinstance(call.args, str) else json.dumps(call.args)


# --- OpenAI chat -------------------------------------------------------------------------
def _chat_head(task: str | Sequence[str], system: str | None) -> list[Any]:
    system_msg = [{"role": "system", "content": system}] if system is not None else []
    return [*system_msg, {"role": "user", "content": _text(task)}]


def _chat(step: Step) -> list[Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": step.text}
    if step.calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": _arguments(c)}}
                             for c in step.calls]
    out: list[Any] = [msg]
    out += [{"role": "tool", "tool_call_id": c.id, "content": c.result} for c in step.calls]
    if step.human:
        out.append({"role": "user", "content": step.human})
    return out


# --- Anthropic Messages ------------------------------------------------------------------
def _anthropic_head(task: str | Sequence[str], system: str | None) -> list[Any]:
    return [{"role": "user", "content": _text(task)}]  # the system prompt is a body field


def _anthropic(step: Step) -> list[Any]:
    blocks: list[Any] = []
    if step.thinking is not None:
        blocks.append({"type": "thinking", "thinking": step.thinking,
                       "signature": step.signature})
    if step.text:
        blocks.append({"type": "text", "text": step.text})
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.args}
               for c in step.calls]
    content: list[Any] = [{"type": "tool_result", "tool_use_id": c.id, "content": c.result}
                          for c in step.calls]
    if step.human:
        content.append({"type": "text", "text": step.human})
    out: list[Any] = [{"role": "assistant", "content": blocks}]
    if content:
        out.append({"role": "user", "content": content})
    return out


# --- OpenAI Responses --------------------------------------------------------------------
def _user_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _responses_head(task: str | Sequence[str], system: str | None) -> list[Any]:
    developer = [{"type": "message", "role": "developer",
                  "content": [{"type": "input_text", "text": system}]}] if system else []
    return [*developer, _user_item(_text(task))]


def _responses(step: Step) -> list[Any]:
    out: list[Any] = []
    if step.thinking is not None:
        summary = [{"type": "summary_text", "text": step.thinking}] if step.thinking else []
        out.append({"type": "reasoning", "id": step.reasoning_id, "summary": summary,
                    "encrypted_content": step.signature})
    if step.text:
        out.append({"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": step.text}]})
    for c in step.calls:
        item: dict[str, Any] = {"type": "function_call"}
        if c.item_id is not None:
            item["id"] = c.item_id
        out.append({**item, "call_id": c.id, "name": c.name, "arguments": _arguments(c)})
    out += [{"type": "function_call_output", "call_id": c.id, "output": c.result}
            for c in step.calls]
    if step.human:
        out.append(_user_item(step.human))
    return out


# --- Gemini ------------------------------------------------------------------------------
def _gemini_head(task: str | Sequence[str], system: str | None) -> list[Any]:
    texts = [task] if isinstance(task, str) else list(task)
    return [{"role": "user", "parts": [{"text": t} for t in texts]}]


def _gemini(step: Step) -> list[Any]:
    """Gemini CLI's shape: the signature on a step's first call only, all of a step's
    function responses in one user content, ids kept."""
    parts: list[Any] = []
    if step.thinking is not None:
        parts.append({"text": step.thinking, "thought": True})
    if step.text:
        parts.append({"text": step.text})
    calls: list[Any] = [{"functionCall": {"id": c.id, "name": c.name, "args": c.args}}
                        for c in step.calls]
    if calls and step.signature is not None:
        calls[0]["thoughtSignature"] = step.signature
    out: list[Any] = [{"role": "model", "parts": parts + calls or [{"text": "ok"}]}]
    if step.calls:
        out.append({"role": "user", "parts": [
            {"functionResponse": {"id": c.id, "name": c.name, "response": {"output": c.result}}}
            for c in step.calls]})
    if step.human:
        out.append({"role": "user", "parts": [{"text": step.human}]})
    return out


_HEADS = {"openai_chat": _chat_head, "anthropic": _anthropic_head,
          "openai_responses": _responses_head, "gemini": _gemini_head}
