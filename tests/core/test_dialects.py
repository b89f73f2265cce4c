from __future__ import annotations

import copy

import pytest

from agentcompact import get_dialect, new_plugin_manager
from agentcompact._markers import COMPACTION_HEADER
from agentcompact.dialects import (
    AnthropicDialect,
    OpenAIChatDialect,
    OpenAIResponsesDialect,
    _anthropic,
)
from agentcompact.errors import ConfigError, DialectError

from .histories import build

DIALECTS = ["openai_chat", "anthropic", "openai_responses", "gemini"]


@pytest.mark.parametrize("name", DIALECTS)
def test_registered_by_name(name: str) -> None:
    assert get_dialect(name, new_plugin_manager()).name == name


def test_unknown_dialect_names_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="unknown dialect 'cohere'.*anthropic.*gemini"):
        get_dialect("cohere", new_plugin_manager())


def test_anthropic_reads_blocks() -> None:
    d = AnthropicDialect()
    assistant = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "s1"},
        {"type": "redacted_thinking", "data": "xyz"},
        {"type": "text", "text": "Running."},
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
        {"type": "tool_use", "id": "t2", "name": "Read", "input": {"file_path": "a.py"}},
    ]}
    results = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"},
        {"type": "tool_result", "tool_use_id": "t2",
         "content": [{"type": "text", "text": "print(1)"}, {"type": "image", "source": {}}]},
    ]}
    assert d.role(assistant) == "assistant" and d.role(results) == "tool"
    assert d.tool_call_ids(assistant) == ("t1", "t2")
    assert d.tool_result_ids(results) == ("t1", "t2")
    kinds = [p.kind for p in d.parts(assistant)]
    assert kinds == ["thinking", "thinking", "text", "tool_call", "tool_call"]
    assert d.parts(assistant)[3].text == '{"command":"ls"}'
    assert [p.text for p in d.parts(results)] == ["a.py", "print(1)"]
    assert d.role({"role": "user", "content": "hi"}) == "user"


def test_openai_chat_reads_tool_calls_and_reasoning() -> None:
    d = OpenAIChatDialect()
    m = {"role": "assistant", "content": None, "reasoning_content": "think",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]}
    assert d.tool_call_ids(m) == ("c1",)
    assert [(p.kind, p.text) for p in d.parts(m)] == [
        ("thinking", "think"), ("tool_call", "{\"cmd\": \"ls\"}")]
    tool = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x"}]}
    assert d.tool_result_ids(tool) == ("c1",) and d.parts(tool)[0].text == "x"
    image = {"role": "user", "content": [{"type": "text", "text": "see"},
                                          {"type": "image_url", "image_url": {"url": "data:"}}]}
    assert [p.kind for p in d.parts(image)] == ["text", "image"]


def test_responses_items() -> None:
    d = OpenAIResponsesDialect()
    reasoning = {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gAAA"}
    call = {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "c1", "output": "done"}
    short = {"role": "user", "content": "hi"}
    assert [d.role(x) for x in (reasoning, call, out, short)] == [
        "assistant", "assistant", "tool", "user"]
    assert d.parts(reasoning)[0].opaque
    assert d.tool_call_ids(call) == ("c1",) and d.tool_result_ids(out) == ("c1",)
    assert d.messages_of({"input": "hello"}) == [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("name", ["openai_chat", "anthropic", "openai_responses"])
def test_digest_ignores_cache_control(name: str) -> None:
    d = get_dialect(name, new_plugin_manager())
    m = d.text_message("hello")
    marked = copy.deepcopy(m)
    if isinstance(marked["content"], list):
        marked["content"][0]["cache_control"] = {"type": "ephemeral"}
    else:
        marked["cache_control"] = {"type": "ephemeral"}
    assert d.digest(m) == d.digest(marked)
    assert d.digest(m) != d.digest(d.text_message("hello!"))


@pytest.mark.parametrize("name", DIALECTS)
def test_truncate_copies_and_keeps_ids(name: str) -> None:
    d = get_dialect(name, new_plugin_manager())
    history = build(name, [(10, [5000, 30], 0)])
    original = copy.deepcopy(history)
    for m in history:
        t = d.truncate(m, 300)
        assert d.tool_result_ids(t) == d.tool_result_ids(m)
        assert d.tool_call_ids(t) == d.tool_call_ids(m)
        if len(d.text_of(m)) <= 300:
            assert t is m
        else:
            assert t is not m and "chars omitted" in d.text_of(t)
            assert len(d.text_of(t)) < 400
    assert history == original


@pytest.mark.parametrize("name", DIALECTS)
def test_synthetic_message_recognised(name: str) -> None:
    d = get_dialect(name, new_plugin_manager())
    assert d.is_synthetic(d.text_message(COMPACTION_HEADER + "\n\nx"))
    assert not d.is_synthetic(d.text_message("hello " + COMPACTION_HEADER))


def test_messages_of_rejects_a_body_without_messages() -> None:
    with pytest.raises(DialectError, match="no list under 'messages'"):
        AnthropicDialect().messages_of({"model": "x"})


def test_with_messages_is_a_shallow_copy() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "a"}], "max_tokens": 5}
    new = AnthropicDialect().with_messages(body, [])
    assert new["messages"] == [] and body["messages"] and new["model"] == "m"


# --- what a dialect does not model is kept (issue 13) ------------------------------------

_TOOLS_ITEM = {"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [
    {"type": "namespace", "name": "functions", "description": "", "tools": [
        {"type": "custom", "name": "exec", "description": "Run JavaScript " * 40}]}]}


def test_responses_additional_tools_item_is_an_opaque_instruction_counted_by_its_json() -> None:
    d = OpenAIResponsesDialect()
    assert d.is_opaque(_TOOLS_ITEM) and d.is_instruction(_TOOLS_ITEM)
    assert d.role(_TOOLS_ITEM) == "developer"
    text, images = d.counted_text(_TOOLS_ITEM)
    assert images == 0 and "Run JavaScript" in text and '"additional_tools"' in text
    assert len(text) >= len("Run JavaScript " * 40)
    assert [p.kind for p in d.parts(_TOOLS_ITEM)] == ["other"]


def test_responses_developer_messages_are_instructions_not_opaque() -> None:
    d = OpenAIResponsesDialect()
    dev = {"type": "message", "role": "developer",
           "content": [{"type": "input_text", "text": "You are Codex"}]}
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    assert d.is_instruction(dev) and not d.is_opaque(dev)
    assert not d.is_instruction(user) and not d.is_opaque(user)
    call = {"type": "custom_tool_call", "call_id": "c1", "name": "exec", "input": "text(1)"}
    assert not d.is_opaque(call) and d.tool_call_ids(call) == ("c1",)


def test_responses_message_with_an_unknown_content_part_is_opaque_and_counted() -> None:
    d = OpenAIResponsesDialect()
    m = {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "look"}, {"type": "input_hologram", "data": "Z" * 50}]}
    assert d.is_opaque(m)
    assert "Z" * 50 in d.counted_text(m)[0] and "look" in d.counted_text(m)[0]


def test_anthropic_mid_conversation_system_message_is_valid_and_an_instruction() -> None:
    d = AnthropicDialect()
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "system", "content": "Tool permissions changed."},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "system", "content": "Another reminder."},
        {"role": "user", "content": "next"},
    ]
    d.check_order(messages)  # no ValidationError
    for i, m in enumerate(messages):
        d.check_shape(m, i)
    assert [d.is_instruction(m) for m in messages] == [False, True, False, True, False]
    with pytest.raises(Exception, match="first message must be a user message"):
        d.check_order([{"role": "system", "content": "s"}, messages[2]])


def test_anthropic_unknown_block_type_makes_the_message_opaque_and_counts_its_json() -> None:
    d = AnthropicDialect()
    m = {"role": "assistant", "content": [
        {"type": "text", "text": "here"},
        {"type": "container_upload", "file_id": "file_" + "q" * 40}]}
    assert d.is_opaque(m)
    assert "q" * 40 in d.counted_text(m)[0]
    known = {"role": "assistant", "content": [{"type": "text", "text": "x"},
                                              {"type": "redacted_thinking", "data": "abc"}]}
    assert not d.is_opaque(known) and "abc" not in d.counted_text(known)[0]


@pytest.mark.parametrize("kind", sorted(_anthropic._KNOWN_BLOCKS))
def test_anthropic_every_block_type_it_calls_known_has_a_reading(kind: str) -> None:
    # is_opaque reads the set, parts() reads _block_part: a type added to the set without
    # a reading would be rendered as its JSON instead of being kept verbatim
    d = AnthropicDialect()
    block = {"type": kind, "text": "t", "thinking": "t", "input": {}, "name": "n", "id": "i",
             "tool_use_id": "i", "content": "c", "data": "d", "source": {}}
    message = {"role": "assistant", "content": [block]}
    assert not d.is_opaque(message)
    assert [p.kind for p in d.parts(message)] != ["other"]


def test_openai_chat_unknown_content_part_is_opaque_and_developer_an_instruction() -> None:
    d = OpenAIChatDialect()
    m = {"role": "user", "content": [{"type": "text", "text": "a"},
                                     {"type": "input_video", "video": "V" * 30}]}
    assert d.is_opaque(m) and "V" * 30 in d.counted_text(m)[0]
    assert d.is_instruction({"role": "developer", "content": "rules"})
    assert not d.is_opaque({"role": "user", "content": "plain"})


@pytest.mark.parametrize("name", DIALECTS)
@pytest.mark.parametrize("bad", [7, "text", None, ["role", "user"]])
def test_non_object_message_is_a_dialect_error_naming_index_and_type(name: str, bad: object
                                                                     ) -> None:
    d = get_dialect(name, new_plugin_manager())
    ok = {"role": "user", "content": "hi"}
    body = {d.messages_key: [ok, bad]}
    with pytest.raises(DialectError) as info:
        d.messages_of(body)
    message = str(info.value)
    assert "message 1" in message and type(bad).__name__ in message
    if isinstance(bad, str):
        assert bad not in message.replace(type(bad).__name__, "")  # no content in errors
    with pytest.raises(DialectError, match=type(bad).__name__):
        d.role(bad)


def test_openai_chat_truncate_keeps_non_object_content_items() -> None:
    d = OpenAIChatDialect()
    m = {"role": "user", "content": [{"type": "text", "text": "x" * 100}, 5]}
    out = d.truncate(m, 20)
    assert out["content"][1] == 5 and len(out["content"][0]["text"]) < 100
