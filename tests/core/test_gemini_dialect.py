"""The ``gemini`` dialect: what it reads, what it keeps, the API's validity rules, and the
requests Gemini CLI 0.61.0 sent (captured from the real CLI: tests/clis/data)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agentcompact import Budget, Engine, get_dialect, new_plugin_manager, validate
from agentcompact._markers import COMPACTION_HEADER
from agentcompact._turns import problems
from agentcompact.dialects import GeminiDialect
from agentcompact.errors import ValidationError

from .histories import build

CAPTURED = Path(__file__).resolve().parents[1] / "clis" / "data"
D = GeminiDialect()


def _captured() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(
        (CAPTURED / "gemini-cli-0.61.0-requests.json").read_text())
    return data


def test_registered_and_reads_contents_of_a_body() -> None:
    assert get_dialect("gemini", new_plugin_manager()).name == "gemini"
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "model": "m"}
    assert D.messages_of(body) is body["contents"]
    assert D.with_messages(body, [])["contents"] == [] and body["contents"]


def test_the_captured_cli_session_is_valid_and_read_as_the_cli_meant_it() -> None:
    main = _captured()[1]["body"]
    contents = D.messages_of(main)
    validate(contents, D)
    roles = [D.role(c) for c in contents]
    assert roles[0] == "user" and roles[1::2] == ["assistant"] * (len(contents) // 2)
    assert set(roles[2::2]) == {"tool"}
    parallel = next(c for c in contents if len(D.tool_call_ids(c)) == 2)
    answer = contents[contents.index(parallel) + 1]
    assert D.tool_result_ids(answer) == D.tool_call_ids(parallel)
    first, second = [p for p in D.parts(parallel) if p.kind == "tool_call"]
    assert first.opaque and not second.opaque  # the signature rides on the first call only
    assert first.name == "read_file" and json.loads(first.text)["file_path"].endswith(".txt")
    results = [p for c in contents for p in D.parts(c) if p.kind == "tool_result"]
    assert results and all(p.text.startswith("STEP-") for p in results)


def test_the_routing_request_of_two_user_contents_is_valid() -> None:
    routing = _captured()[0]["body"]
    validate(D.messages_of(routing), D)
    assert "responseJsonSchema" in routing["generationConfig"]


def test_pairing_by_id_else_by_name_and_position() -> None:
    calls = {"role": "model", "parts": [
        {"functionCall": {"name": "read", "args": {"p": "a"}}, "thoughtSignature": "c2ln"},
        {"functionCall": {"name": "read", "args": {"p": "b"}}},
        {"functionCall": {"id": "x1", "name": "ls", "args": {}}}]}
    answers = {"role": "user", "parts": [
        {"functionResponse": {"id": "x1", "name": "ls", "response": {"output": "."}}},
        {"functionResponse": {"name": "read", "response": {"output": "A"}}},
        {"functionResponse": {"name": "read", "response": {"output": "B"}}}]}
    assert D.tool_call_ids(calls) == ("read#0", "read#1", "x1")
    assert D.tool_result_ids(answers) == ("x1", "read#0", "read#1")
    assert [p.ref for p in D.parts(answers)] == ["x1", "read#0", "read#1"]
    validate([{"role": "user", "parts": [{"text": "go"}]}, calls, answers], D)


def test_snake_case_fields_read_like_camel_case() -> None:
    calls = {"role": "model", "parts": [{"function_call": {"name": "f", "args": {"a": 1}},
                                         "thought_signature": "c2ln"}]}
    answers = {"role": "user", "parts": [{"function_response": {
        "name": "f", "response": {"output": "done"}}}]}
    assert D.tool_call_ids(calls) == ("f#0",) and D.tool_result_ids(answers) == ("f#0",)
    assert D.parts(calls)[0].opaque and D.parts(answers)[0].text == "done"
    assert not D.is_opaque(calls) and not D.is_opaque(answers)
    long = {"role": "user", "parts": [{"function_response": {
        "name": "f", "response": {"output": "x" * 5000}}}]}
    cut = D.truncate(long, 300)
    assert len(cut["parts"][0]["function_response"]["response"]["output"]) < 1000


def test_thoughts_signatures_media_and_code_execution() -> None:
    m = {"role": "model", "parts": [
        {"text": "weighing options", "thought": True},
        {"text": "", "thoughtSignature": "c2lnMQ=="},
        {"executableCode": {"language": "PYTHON", "code": "print(2 + 2)"}},
        {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "4"}},
        {"text": "The answer is 4.", "thoughtSignature": "c2lnMg=="}]}
    user = {"role": "user", "parts": [{"text": "see"},
                                      {"inlineData": {"mimeType": "image/png", "data": "AA"}},
                                      {"fileData": {"fileUri": "gs://b/f.pdf"}}]}
    kinds = [(p.kind, p.opaque) for p in D.parts(m)]
    assert kinds == [("thinking", False), ("thinking", True), ("text", False), ("text", False),
                     ("text", True)]
    assert D.text_of(m) == "weighing options\nprint(2 + 2)\n4\nThe answer is 4."
    assert "c2ln" not in D.counted_text(m)[0]  # a signature is not text the model reads
    assert D.counted_text(user) == ("see", 2)
    assert not D.is_opaque(m) and not D.is_opaque(user)


def test_a_part_or_content_key_it_does_not_model_makes_the_content_opaque() -> None:
    part = {"role": "model", "parts": [{"text": "a"}, {"toolCall": {"note": "Q" * 40}}]}
    field = {"role": "user", "parts": [{"text": "a"}], "x_future": {"note": "Z" * 40}}
    odd = {"role": "user", "parts": ["not a part"]}
    for m in (part, field, odd):
        assert D.is_opaque(m)
        assert D.counted_text(m)[0]  # counted by its JSON (the meter reads is_opaque)
    assert [p.kind for p in D.parts(part)] == ["text", "other"]
    assert "Q" * 40 in D.parts(part)[1].text


def test_truncate_leaves_signed_and_thought_parts_and_names_what_it_cuts() -> None:
    big = "line of output\n" * 400
    m = {"role": "model", "parts": [
        {"text": big, "thought": True}, {"text": big, "thoughtSignature": "c2ln"},
        {"text": big}, {"functionCall": {"name": "f", "args": {"big": big}},
                        "thoughtSignature": "c2ln"}]}
    original = copy.deepcopy(m)
    cut = D.truncate(m, 500)
    assert m == original
    assert [cut["parts"][i] is m["parts"][i] for i in range(4)] == [True, True, False, True]
    assert "chars omitted" in cut["parts"][2]["text"] or "elided" in cut["parts"][2]["text"]
    assert D.truncation_texts(m) == [big]
    response = {"role": "user", "parts": [{"functionResponse": {
        "name": "f", "response": {"output": big, "exitCode": 1, "stderr": "short"}}}]}
    assert D.truncation_texts(response) == [big, "short"]
    out = D.truncate(response, 500)["parts"][0]["functionResponse"]["response"]
    assert out["exitCode"] == 1 and out["stderr"] == "short" and len(out["output"]) < 1000
    assert D.truncate({"role": "user", "parts": [{"text": "short"}]}, 500)["parts"][0] == {
        "text": "short"}


def test_text_message_and_compaction_message_recognised() -> None:
    assert D.text_message("x") == {"role": "user", "parts": [{"text": "x"}]}
    assert D.text_message("x", "assistant")["role"] == "model"
    assert D.is_synthetic(D.text_message(COMPACTION_HEADER + "\n\nsummary"))
    assert not D.is_synthetic(D.text_message("hi " + COMPACTION_HEADER))


_USER = {"role": "user", "parts": [{"text": "go"}]}
_CALL = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}},
                                     "thoughtSignature": "c2ln"}]}
_UNSIGNED = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]}
_ANSWER = {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}
_TEXT = {"role": "model", "parts": [{"text": "done"}]}


@pytest.mark.parametrize(("contents", "error"), [
    ([_CALL, _ANSWER], "does not follow a user turn"),  # a history starting with a call
    ([_USER, _TEXT, _CALL, _ANSWER], "does not follow a user turn"),
    ([_USER, _ANSWER], "does not follow a function call turn"),
    ([_USER, _CALL, _USER, _ANSWER], "does not follow a function call turn"),
    ([_USER, {"role": "model", "parts": [*_CALL["parts"], *_UNSIGNED["parts"]]}, _ANSWER],
     "2 function calls"),
    ([_USER, _CALL, _ANSWER, _UNSIGNED, _ANSWER], "without its thought signature"),
    ([_USER, {"role": "system", "parts": [{"text": "s"}]}], "expected 'user' or 'model'"),
    ([_USER, {"role": "model", "parts": []}], "parts must not be empty"),
])
def test_what_the_api_refuses(contents: list[Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        validate(contents, D)


@pytest.mark.parametrize("contents", [
    [_USER, _USER, _TEXT],  # consecutive user contents (Gemini CLI's routing request)
    [_USER, _UNSIGNED, _ANSWER, _TEXT],  # a model that does not sign (Gemini 2.5)
    [_USER, _UNSIGNED, _ANSWER, _USER, _CALL, _ANSWER],  # unsigned, but an earlier turn
    [{"parts": [{"text": "no role: a user content"}]}, _TEXT],
])
def test_what_the_api_accepts(contents: list[Any]) -> None:
    validate(contents, D)


def test_fixed_tokens_count_the_system_instruction_and_tools() -> None:
    engine = Engine("cliff", "gemini", Budget(10_000), counter="chars")
    body = {"contents": [_USER], "systemInstruction": {"parts": [{"text": "S" * 4000}]},
            "tools": [{"functionDeclarations": [{"name": "f", "description": "D" * 400}]}],
            "generationConfig": {"temperature": 1}}
    fixed = engine.fixed_tokens(body)
    assert fixed >= 1100
    assert engine.fixed_tokens({**body, "generationConfig": {"topK": 5}}) == fixed
    snake = {"contents": [_USER], "system_instruction": body["systemInstruction"]}
    assert engine.fixed_tokens(snake) >= 1000


def test_a_compacted_cli_like_session_stays_valid_and_keeps_signatures() -> None:
    history = build("gemini", [(20, [3000], 0)] * 12)
    engine = Engine("cliff", "gemini", Budget(6_000), counter="chars")
    result = engine.compact(history)
    assert result.compacted
    validate(result.messages, D)
    sent = json.dumps(result.messages)
    kept = [m for m in result.messages if m.get("role") == "model"]
    assert kept and all(m in history for m in kept)  # model contents whole, never rewritten
    for m in kept:
        for part in m["parts"]:
            if "thoughtSignature" in part:
                assert json.dumps(part["thoughtSignature"]) in sent


def test_every_order_problem_is_named_so_an_inherited_one_is_not_new() -> None:
    """A history with two stray function responses: an output that drops the first still
    has the second, which its input had too (the engine must not take it for its own)."""
    stray = [{"role": "user", "parts": [{"functionResponse": {"name": f"f{k}",
                                                               "response": {}}}]}
             for k in range(2)]
    contents = [_USER, _TEXT, stray[0], _USER, _TEXT, stray[1], _USER]
    inherited = {key for key, _ in problems(contents, D, allow_pending=True)}
    assert len(inherited) == 4  # each stray: no call turn before it, and an orphan
    out = [contents[0], D.text_message(COMPACTION_HEADER + "\n\nx"), *contents[4:]]
    assert {key for key, _ in problems(out, D, allow_pending=True)} <= inherited
