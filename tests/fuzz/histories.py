"""Hypothesis strategies building agent histories per dialect, adversarial on purpose.

An abstract plan (turns of calls, results, thinking, human text) is drawn once and rendered
into each dialect's native messages, with the shapes that broke the engine before: signed
thinking inside tool loops (on the first step only, or on every step), parallel calls,
duplicate and orphan ids, images, empty and non-string content, results larger than the
budget, lone surrogates and JSON nested deeper than 255 levels, instructions in the
middle of a conversation, pinned text; and shapes the code does not model or models
rarely (``extra``): a block, part or item type of no known kind, carrying ``UNMODELLED``
(the invariants require it sent verbatim), and per dialect the rare known ones real agents
send (redacted thinking and server tool use; Codex's custom and local shell calls; a
DeepSeek ``reasoning_content``; LangChain content blocks; Gemini's code execution parts and
snake_case fields, thought signatures on every step or on the first only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

PIN = "PIN-RULE"
SECRET = "sk-SECRET-canary"
UNMODELLED = "UNMODELLED-canary"

WORDS = st.sampled_from(["alpha", "beta", "make", "test", "src/app.py", "error", "0x1f",
                         "ok", "def", "return", "42", "\u00e9t\u00e9", "\u4e2d\u6587", SECRET])


@dataclass
class Turn:
    thinking: bool
    text: str
    calls: list[str]
    results: list[tuple[str, str]]
    human: str | None = None
    image: bool = False
    instruction: str | None = None
    odd: str | None = None  # "surrogate" | "deep" | "empty" | "list"
    extra: str | None = None  # "unknown" (UNMODELLED) | "rare"


@dataclass
class Plan:
    task: str
    turns: list[Turn] = field(default_factory=list)
    interleaved: bool = True


def _text(draw: Any, lo: int, hi: int) -> str:
    n = draw(st.integers(lo, hi))
    words = draw(st.lists(WORDS, min_size=1, max_size=8))
    out = " ".join(words)
    return (out * (n // max(len(out), 1) + 1))[:n] if n else ""


@st.composite
def plans(draw: Any, max_turns: int = 7) -> Plan:
    plan = Plan(task="Fix the bug. " + _text(draw, 0, 200), interleaved=draw(st.booleans()))
    n = draw(st.integers(1, max_turns))
    for k in range(n):
        ncalls = draw(st.sampled_from([0, 1, 1, 1, 2, 3]))
        calls = [f"c{k}_{j}" for j in range(ncalls)]
        if ncalls and draw(st.integers(0, 30)) == 0:
            calls[-1] = calls[0] if ncalls > 1 else "c0_0"  # duplicate id
        results = []
        for ref in calls:
            size = draw(st.sampled_from([0, 40, 300, 1500, 4000, 12000]))
            results.append((ref, _text(draw, size, size)))
        if draw(st.integers(0, 40)) == 0:
            results.append((f"orphan{k}", "stale output"))
        human = None
        if draw(st.integers(0, 4)) == 0 or not calls:
            human = _text(draw, 1, 300)
            if draw(st.integers(0, 5)) == 0:
                human = f"{PIN}-{k}: never push to main."
        odd = draw(st.sampled_from([None] * 12 + ["surrogate", "deep", "empty", "list"]))
        instruction = f"Instruction {k}: be brief." if draw(st.integers(0, 12)) == 0 else None
        extra = draw(st.sampled_from([None] * 8 + ["unknown", "rare"]))
        plan.turns.append(Turn(thinking=draw(st.booleans()) or k == 0, text=_text(draw, 0, 200),
                               calls=calls, results=results, human=human,
                               image=draw(st.integers(0, 15)) == 0, instruction=instruction,
                               odd=odd, extra=extra))
    return plan


def _deep(depth: int = 300) -> Any:
    value: Any = {"leaf": True}
    for _ in range(depth):
        value = {"x": [value]}
    return value


def _odd_text(turn: Turn, text: str) -> str:
    return text + " \ud800 broken" if turn.odd == "surrogate" else text


# --- renderers ----------------------------------------------------------------------------
def openai_chat(plan: Plan) -> list[Any]:
    msgs: list[Any] = [{"role": "system", "content": "You are a coding agent."},
                       {"role": "user", "content": plan.task}]
    for turn in plan.turns:
        if turn.instruction:
            msgs.append({"role": "developer", "content": turn.instruction})
        msg: dict[str, Any] = {"role": "assistant",
                               "content": _odd_text(turn, turn.text) if turn.text else None}
        if turn.odd == "deep":
            msg["metadata"] = _deep()
        if turn.calls:
            msg["tool_calls"] = [{"id": ref, "type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"cmd": ref})}} for ref in turn.calls]
        elif not turn.text:
            msg["content"] = "" if turn.odd == "empty" else "thinking aloud"
        if turn.extra == "rare":  # DeepSeek's and vLLM's reasoning field
            msg["reasoning_content"] = "Reasoning about " + turn.text[:40]
        msgs.append(msg)
        for ref, out in turn.results:
            content: Any = out
            if turn.odd == "list":
                content = [{"type": "text", "text": out}]
            msgs.append({"role": "tool", "tool_call_id": ref, "content": content})
        if turn.human is not None:
            content = turn.human
            if turn.image:
                content = [{"type": "text", "text": turn.human},
                           {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]
            msgs.append({"role": "user", "content": content})
        if turn.extra == "unknown":
            msgs.append({"role": "user", "content": [
                {"type": "text", "text": "see attached"},
                {"type": "x_future_part", "x_future_part": {"note": UNMODELLED}}]})
    return msgs


def anthropic(plan: Plan) -> list[Any]:
    msgs: list[Any] = [{"role": "user", "content": plan.task}]
    for k, turn in enumerate(plan.turns):
        blocks: list[Any] = []
        if turn.thinking and (plan.interleaved or k == 0 or msgs[-1]["role"] == "user"
                              and _genuine(msgs[-1])):
            if turn.extra == "rare":
                blocks.append({"type": "redacted_thinking", "data": f"EncRedacted{k}=="})
            else:
                blocks.append({"type": "thinking", "thinking": "Let me think. " + turn.text[:80],
                               "signature": f"sig{k}"})
        if turn.extra == "rare":  # a server tool: its call and result in one message
            blocks.append({"type": "server_tool_use", "id": f"srvtoolu_{k}",
                           "name": "web_search", "input": {"query": "pytest fixtures"}})
            blocks.append({"type": "web_search_tool_result", "tool_use_id": f"srvtoolu_{k}",
                           "content": [{"type": "web_search_result", "url": "https://e.x/",
                                        "title": "Fixtures", "encrypted_content": "Eq=="}]})
        if turn.text:
            blocks.append({"type": "text", "text": _odd_text(turn, turn.text)})
        for ref in turn.calls:
            args: Any = {"cmd": ref}
            if turn.odd == "deep":
                args = {"cmd": ref, "deep": _deep()}
            blocks.append({"type": "tool_use", "id": ref, "name": "bash", "input": args})
        if not blocks:
            blocks.append({"type": "text", "text": "ok"})
        msgs.append({"role": "assistant", "content": blocks})
        content: list[Any] = []
        for ref, out in turn.results:
            result: Any = out if turn.odd != "list" else [{"type": "text", "text": out}]
            content.append({"type": "tool_result", "tool_use_id": ref, "content": result})
        if turn.human is not None:
            content.append({"type": "text", "text": turn.human})
            if turn.image:
                content.append({"type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": "AA"}})
        if turn.extra == "unknown":
            content.append({"type": "x_future_block", "payload": {"note": UNMODELLED}})
        msgs.append({"role": "user", "content": content or "continue"})
    return msgs


def _genuine(message: Any) -> bool:
    content = message.get("content")
    return isinstance(content, str) or any(
        isinstance(b, dict) and b.get("type") != "tool_result" for b in content)


def openai_responses(plan: Plan) -> list[Any]:
    msgs: list[Any] = [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": plan.task}]}]
    for k, turn in enumerate(plan.turns):
        if turn.instruction:
            msgs.append({"type": "message", "role": "developer",
                         "content": [{"type": "input_text", "text": turn.instruction}]})
        if turn.thinking:
            msgs.append({"type": "reasoning", "id": f"rs_{k}", "summary": [
                {"type": "summary_text", "text": "Plan " + turn.text[:60]}],
                "encrypted_content": f"gAAA{k}=="})
        if turn.text or not turn.calls:
            item: dict[str, Any] = {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": _odd_text(turn, turn.text or "ok")}]}
            if turn.odd == "deep":
                item["metadata"] = _deep()
            msgs.append(item)
        for ref in turn.calls:
            msgs.append({"type": "function_call", "call_id": ref, "name": "shell",
                         "arguments": json.dumps({"cmd": ref})})
        for ref, out in turn.results:
            msgs.append({"type": "function_call_output", "call_id": ref, "output": out})
        if turn.extra == "rare":  # Codex's apply_patch tool and local shell
            msgs.append({"type": "custom_tool_call", "call_id": f"ct_{k}", "name": "apply_patch",
                         "input": "*** Begin Patch\n*** End Patch"})
            msgs.append({"type": "custom_tool_call_output", "call_id": f"ct_{k}",
                         "output": "Done!"})
            msgs.append({"type": "local_shell_call", "call_id": f"ls_{k}", "status": "completed",
                         "action": {"type": "exec", "command": ["ls"], "env": {}}})
            msgs.append({"type": "local_shell_call_output", "call_id": f"ls_{k}",
                         "output": "src\ntests"})
        elif turn.extra == "unknown":
            msgs.append({"type": "x_future_item", "payload": {"note": UNMODELLED}})
        if turn.human is not None or not turn.calls:
            content: list[Any] = [{"type": "input_text", "text": turn.human or "go on"}]
            if turn.image:
                content.append({"type": "input_image", "image_url": "data:image/png;base64,AA"})
            msgs.append({"type": "message", "role": "user", "content": content})
    return msgs


def langchain(plan: Plan) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    msgs: list[Any] = [SystemMessage(content="You are a coding agent.", id="s0"),
                       HumanMessage(content=plan.task, id="h0")]
    for k, turn in enumerate(plan.turns):
        if turn.instruction:
            msgs.append(SystemMessage(content=turn.instruction, id=f"s{k + 1}"))
        calls = [{"id": ref, "name": "bash", "args": {"cmd": ref}, "type": "tool_call"}
                 for ref in turn.calls]
        text: Any = _odd_text(turn, turn.text) if turn.odd == "surrogate" else turn.text
        if turn.extra == "rare":  # content blocks, reasoning first
            text = [{"type": "reasoning", "reasoning": "Plan " + turn.text[:40]},
                    {"type": "text", "text": turn.text or "ok"}]
        elif turn.extra == "unknown":
            text = [{"type": "text", "text": turn.text or "ok"},
                    {"type": "x_future_block", "payload": {"note": UNMODELLED}}]
        msgs.append(AIMessage(content=text, tool_calls=calls, id=f"a{k}"))
        for j, (ref, out) in enumerate(turn.results):
            content: Any = out if turn.odd != "list" else [{"type": "text", "text": out}]
            msgs.append(ToolMessage(content=content, tool_call_id=ref, id=f"t{k}_{j}"))
        if turn.human is not None:
            msgs.append(HumanMessage(content=turn.human, id=f"h{k + 1}"))
    return msgs


def gemini(plan: Plan) -> list[Any]:
    msgs: list[Any] = [{"role": "user", "parts": [{"text": plan.task}]}]
    for k, turn in enumerate(plan.turns):
        parts: list[Any] = []
        if turn.thinking:
            parts.append({"text": "Let me think. " + turn.text[:80], "thought": True})
        if turn.extra == "rare":  # server-side code execution, its result in the same content
            parts.append({"executableCode": {"language": "PYTHON", "code": "print(6 * 7)"}})
            parts.append({"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "42"}})
        if turn.text or turn.odd == "empty":
            parts.append({"text": _odd_text(turn, turn.text)})
        for ref in turn.calls:
            args: Any = {"cmd": ref, "deep": _deep()} if turn.odd == "deep" else {"cmd": ref}
            key = "function_call" if turn.extra == "rare" else "functionCall"
            parts.append({key: {"id": ref, "name": "bash", "args": args}})
        calls = [p for p in parts if "functionCall" in p or "function_call" in p]
        if calls and (plan.interleaved or k == 0):  # signed on every step, or the first only
            calls[0]["thoughtSignature"] = f"c2lnLXt7a319LQ{k}=="
        msgs.append({"role": "model", "parts": parts or [{"text": "ok"}]})
        answers: list[Any] = []
        for ref, out in turn.results:
            response: Any = {"output": out}
            if turn.odd == "list":
                response = {"output": out, "lines": out.count("\n"), "ok": True}
            answers.append({"functionResponse": {"id": ref, "name": "bash", "response": response}})
        if answers:
            msgs.append({"role": "user", "parts": answers})
        if turn.human is not None or not turn.calls:
            human: list[Any] = [{"text": turn.human or "go on"}]
            if turn.image:
                human.append({"inlineData": {"mimeType": "image/png", "data": "AA"}})
            msgs.append({"role": "user", "parts": human})
        if turn.extra == "unknown":
            msgs.append({"role": "user", "parts": [
                {"text": "see attached"}, {"x_future_part": {"note": UNMODELLED}}]})
    return msgs


RENDER = {"openai_chat": openai_chat, "anthropic": anthropic,
          "openai_responses": openai_responses, "langchain": langchain, "gemini": gemini}
