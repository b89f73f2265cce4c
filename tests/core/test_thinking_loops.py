"""The thinking-loop rule with a user interjecting while tools run (#36 item 13).

A tool-use loop is one assistant turn; with extended thinking the turn's first assistant
message must keep its thinking block as long as the loop runs, and only a user turn that
is not tool results ends it. Claude Code sends what the user types while tools run inside
the running turn, beside the next tool result ("within the running turn … rather than as
a separate conversation turn", its own words to the model; captured from 2.1.332: the
text appended to the tool result). A final message holding tool results *and* text
therefore continues the loop: a cut inside it must leave a message starting with
thinking at the loop's head. The oracle below states the rule on the raw wire shape,
independently of ``agentcompact._turns``."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcompact import Budget, Engine, new_plugin_manager, validate

SIGNATURE = "sig-" + "Q" * 40


def loop_head(messages: list[dict[str, Any]]) -> int | None:
    """The first assistant message after the last user message carrying no tool_result
    block (the Messages API's turn boundary), or ``None``."""
    i = len(messages) - 1
    while i >= 0:
        content = messages[i]["content"]
        results = isinstance(content, list) and any(
            b.get("type") == "tool_result" for b in content)
        if messages[i]["role"] == "user" and not results:
            break
        i -= 1
    return next((j for j in range(i + 1, len(messages))
                 if messages[j]["role"] == "assistant"), None)


def starts_with_thinking(message: dict[str, Any]) -> bool:
    content = message["content"]
    return isinstance(content, list) and bool(content) and content[0].get("type") in (
        "thinking", "redacted_thinking")


def broken_loop(original: list[dict[str, Any]], sent: list[dict[str, Any]]) -> bool:
    head = loop_head(original)
    if head is None or not starts_with_thinking(original[head]):
        return False
    out = loop_head(sent)
    return out is not None and not starts_with_thinking(sent[out])


def interjection_history(result_chars: int) -> list[dict[str, Any]]:
    """The issue's reproduction: the loop's second step answered with a result and the
    user's text."""
    return [
        {"role": "user", "content": "Fix the bug in parser.py"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "read the file first", "signature": SIGNATURE},
            {"type": "tool_use", "id": "t0", "name": "read", "input": {"path": "parser.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0",
                                      "content": "x = 1\n" * (result_chars // 6)}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "run", "input": {"cmd": "pytest"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "1 passed"},
            {"type": "text", "text": "also check the lexer"}]},
    ]


def test_the_issue_history_keeps_its_loop_whole() -> None:
    msgs = interjection_history(1800)
    engine = Engine("cliff", "anthropic", Budget(trigger_tokens=300), counter="chars",
                    plugins=new_plugin_manager())
    sent = engine.compact(msgs).messages
    assert not broken_loop(msgs, sent)
    assert sent[1] == msgs[1]  # the loop's head, with its thinking block
    validate(sent, engine.dialect, allow_pending=True)


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Anthropic histories of thinking tool loops: each loop opens with a thinking
    message; its later steps think or not (interleaved thinking or not); results of
    random size; any results message may carry the user's text beside them; a loop ends
    with a text answer and a new user message, or runs on to the end."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "task " + "t" * draw(
        st.integers(0, 400))}]
    calls = 0
    for loop in range(draw(st.integers(1, 4))):
        for step in range(draw(st.integers(1, 5))):
            content: list[dict[str, Any]] = []
            if step == 0 or draw(st.booleans()):
                content.append({"type": "thinking", "thinking": f"plan {loop}.{step}",
                                "signature": SIGNATURE})
            if draw(st.booleans()):
                content.append({"type": "text", "text": "working " * draw(st.integers(0, 40))})
            ids = [f"toolu_{calls + k}" for k in range(draw(st.integers(1, 3)))]
            calls += len(ids)
            content += [{"type": "tool_use", "id": i, "name": "bash", "input": {"cmd": i}}
                        for i in ids]
            msgs.append({"role": "assistant", "content": content})
            answer: list[dict[str, Any]] = [
                {"type": "tool_result", "tool_use_id": i,
                 "content": "out\n" * draw(st.integers(0, 900))} for i in ids]
            if draw(st.integers(0, 3)) == 0:  # the user types while the tools run
                answer.append({"type": "text", "text": "also " * draw(st.integers(1, 30))})
            msgs.append({"role": "user", "content": answer})
        if draw(st.booleans()):
            msgs.append({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "done", "signature": SIGNATURE},
                {"type": "text", "text": "Done."}]})
            msgs.append({"role": "user", "content": "next " * draw(st.integers(1, 30))})
    return msgs


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(msgs=histories(), trigger=st.integers(200, 3000))
def test_no_cut_leaves_a_running_thinking_loop_headless(msgs: list[dict[str, Any]],
                                                        trigger: int) -> None:
    engine = Engine("cliff", "anthropic", Budget(trigger_tokens=trigger), counter="chars",
                    plugins=new_plugin_manager())
    for end in range(2, len(msgs) + 1):  # as the agent calls, one request per step
        if msgs[end - 1]["role"] != "user":
            continue
        sent = engine.compact(msgs[:end]).messages
        assert not broken_loop(msgs[:end], sent), end
        validate(sent, engine.dialect, allow_pending=True)
