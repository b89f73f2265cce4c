from __future__ import annotations

import pytest

from agentcompact import ValidationError, get_dialect, new_plugin_manager, split_turns, validate

from .histories import build

DIALECTS = ["openai_chat", "anthropic", "openai_responses", "gemini"]


@pytest.mark.parametrize("name", DIALECTS)
def test_head_and_turns(name: str) -> None:
    d = get_dialect(name, new_plugin_manager())
    msgs = build(name, [(10, [20, 20], 0), (0, [20], 15), (5, [], 0)])
    turns = split_turns(msgs, d)
    assert len(turns) == 3
    assert all(not d.is_model_output(m) for m in msgs[: turns.head_len])
    for k in range(len(turns)):
        segment = msgs[turns.starts[k] : turns.end(k)]
        issued = {i for m in segment for i in d.tool_call_ids(m)}
        answered = {i for m in segment for i in d.tool_result_ids(m)}
        assert issued == answered  # a turn holds its calls and all their results
    validate(msgs, d)


def test_responses_step_is_one_turn() -> None:
    d = get_dialect("openai_responses", new_plugin_manager())
    msgs = build("openai_responses", [(10, [5, 5], 0)])
    turns = split_turns(msgs, d)
    # reasoning + message + two calls form one run of model items: one turn
    assert turns.starts == (2,)


def test_history_without_model_output_is_all_head() -> None:
    d = get_dialect("openai_chat", new_plugin_manager())
    msgs = [{"role": "user", "content": "hi"}]
    turns = split_turns(msgs, d)
    assert turns.head_len == 1 and len(turns) == 0


@pytest.mark.parametrize("name", DIALECTS)
def test_orphan_result_rejected(name: str) -> None:
    d = get_dialect(name, new_plugin_manager())
    msgs = build(name, [(5, [10], 0), (5, [10], 0)])
    turns = split_turns(msgs, d)
    first = range(turns.starts[0], turns.end(0))
    calls = [i for i in first if d.tool_call_ids(msgs[i])]
    cut = [m for i, m in enumerate(msgs) if i not in calls]  # drop the first turn's calls
    # (gemini's own rule names it first: a response turn that follows no call turn)
    with pytest.raises(ValidationError, match="orphan|does not follow a function call turn"):
        validate(cut, d)


@pytest.mark.parametrize("name", DIALECTS)
def test_call_without_result_rejected(name: str) -> None:
    d = get_dialect(name, new_plugin_manager())
    msgs = build(name, [(5, [10], 0), (5, [10], 0)])
    result_index = next(i for i, m in enumerate(msgs) if d.tool_result_ids(m))
    broken = msgs[:result_index] + msgs[result_index + 1 :]
    # (gemini's own rule names it first: a call turn that follows another model turn)
    with pytest.raises(ValidationError, match="has no result|does not follow a user turn"):
        validate(broken, d)
    validate(msgs[:result_index], d, allow_pending=True)


def test_anthropic_role_order() -> None:
    d = get_dialect("anthropic", new_plugin_manager())
    with pytest.raises(ValidationError, match="first message must be a user"):
        validate([{"role": "assistant", "content": "hi"}], d)
    # Claude Code sends system messages mid-conversation: valid input (issue 13)
    validate([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
              {"role": "system", "content": "c"}], d)
    with pytest.raises(ValidationError, match="role 'tool'"):
        validate([{"role": "tool", "content": "a"}], d)


def test_shape_errors_name_the_index() -> None:
    d = get_dialect("openai_chat", new_plugin_manager())
    with pytest.raises(ValidationError, match="message 1 is str") as info:
        validate([{"role": "user", "content": "a"}, "oops"], d)
    assert info.value.index == 1
