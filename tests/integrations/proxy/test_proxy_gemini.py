"""The Gemini API through the proxy: routing, its error shape, probes and sessions; a
Gemini CLI-shaped session compacted with its thought signatures byte for byte, the SSE
answer relayed as the upstream sent it, countTokens passed through, the API key (header or
``?key=``) relayed and never written down, ``--record``, and the official Google Gen AI
SDK end to end."""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agentcompact import Budget, validate
from agentcompact.dialects import GeminiDialect
from agentcompact.integrations.proxy import ThreadedServer
from agentcompact.integrations.proxy._wire import (
    dialect_for,
    error_body,
    is_context_error,
    is_probe,
    session_key,
    upstream_of,
)
from agentcompact.testing import Reply, ToolCall, filler_text
from agentcompact.wire import reassemble
from tests.tool_loop import Call, Step, tool_loop

from .conftest import ProxyFactory, Upstream

pytestmark = pytest.mark.network

KEY = "AIza-proxy-test-key-0000"
SYSTEM = {"parts": [{"text": "You are Gemini CLI, an autonomous CLI agent."}]}
TOOLS = [{"functionDeclarations": [{"name": "read_file", "description": "Read a file.",
                                    "parametersJsonSchema": {"type": "object"}}]}]
D = GeminiDialect()


def gemini_history(turns: int, result_tokens: int = 300) -> list[dict[str, Any]]:
    """What Gemini CLI sends (its shape captured from 0.61.0; ``tests.tool_loop``): the
    prompt, then per step a model content with a signed call (a parallel pair every third
    step, the signature on the first call only) and a user content answering every call,
    ids kept."""
    steps = []
    for t in range(turns):
        pair = range(2 if t % 3 == 2 else 1)
        steps.append(Step(
            [Call(f"read_file_{t}_{j}", "read_file", {"file_path": f"/w/step{t}_{j}.txt"},
                  f"STEP-{t}\n" + filler_text(result_tokens)) for j in pair],
            signature=base64.b64encode(f"state of step {t} ".encode() * 4).decode()))
    return tool_loop("gemini", steps, task=[
        "<session_context>\nThis is the Gemini CLI.\n</session_context>",
        "Read the step files one by one."])


def body(contents: list[Any], **extra: Any) -> dict[str, Any]:
    return {"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS,
            "generationConfig": {"temperature": 1, "thinkingConfig": {"includeThoughts": True}},
            **extra}


STREAM = "/v1beta/models/gemini-3-pro-preview:streamGenerateContent"


@pytest.mark.parametrize(("path", "dialect", "upstream"), [
    ("/v1beta/models/gemini-3-pro-preview:generateContent", "gemini", "gemini"),
    (STREAM, "gemini", "gemini"),
    ("/v1/models/gemini-2.5-pro:generateContent", "gemini", "gemini"),
    ("/v1beta/models/gemini-3-pro-preview:countTokens", None, "gemini"),
    ("/v1beta/models", None, "gemini"),
    ("/v1beta/openai/chat/completions", "openai_chat", "gemini"),
    ("/v1/models", None, "openai_chat"),
    ("/v1/messages", "anthropic", "anthropic"),
])
def test_routing(path: str, dialect: str | None, upstream: str) -> None:
    assert dialect_for(path) == dialect
    assert upstream_of(path) == upstream


def test_probe_error_shape_and_context_error() -> None:
    assert is_probe({"contents": [], "generationConfig": {"maxOutputTokens": 1}})
    assert not is_probe({"contents": [], "generationConfig": {"maxOutputTokens": 64}})
    assert error_body("gemini", 400, "bad") == {
        "error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}
    assert error_body("gemini", 502, "x")["error"]["status"] == "UNAVAILABLE"
    said = (b'{"error": {"code": 400, "message": "The input token count (1200293) exceeds the '
            b'maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}')
    assert is_context_error(400, said) and not is_context_error(500, said)


def test_session_key_is_the_root_with_the_system_instruction() -> None:
    contents = gemini_history(2)
    one = session_key(D, body(contents), {}, contents)
    assert one == session_key(D, body(contents + gemini_history(3)[1:]), {}, contents)
    other = body(contents, systemInstruction={"parts": [{"text": "You are a router."}]})
    assert session_key(D, other, {}, contents) != one


def _sse_payloads(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in data.splitlines() if line.startswith(b"data: ")]


def test_a_cli_session_is_compacted_signatures_byte_for_byte_and_sse_relayed_verbatim(
        proxy: ThreadedServer, upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:
    upstream.sim.script.push(Reply.tool("read_file", {"file_path": "/w/next.txt"}))
    contents = gemini_history(24)
    raw = orjson.dumps(body(contents))
    with caplog.at_level(logging.INFO, "agentcompact"):
        got = httpx.post(f"{proxy.base_url}{STREAM}?alt=sse&key={KEY}", content=raw,
                         headers={"x-goog-api-key": KEY, "content-type": "application/json"},
                         timeout=30)
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("text/event-stream")
    sent = upstream.tap.sent[-1]
    assert got.content == sent.body  # the answer relayed as the upstream sent it
    chunks = _sse_payloads(got.content)
    call = chunks[-1]["candidates"][0]["content"]["parts"][-1]
    assert call["functionCall"]["name"] == "read_file" and call["thoughtSignature"]
    # upstream: compacted, valid (the simulator refuses what the Gemini API refuses)
    request = upstream.requests[-1]
    assert request.query == f"alt=sse&key={KEY}" and request.headers["x-goog-api-key"] == KEY
    out = request.body["contents"]
    assert len(out) < len(contents)
    validate(out, D)
    assert request.body["systemInstruction"] == SYSTEM and request.body["tools"] == TOOLS
    for content in out:  # every model content kept is the client's, byte for byte
        if content["role"] == "model":
            assert orjson.dumps(content) in raw
    assert out[-2:] == contents[-2:]
    # the key is never written down (the log holds the path, not the query); the test's own
    # client (httpx) logs its URL where another library's setup raised its level
    assert not [r for r in caplog.records if KEY in r.getMessage() and r.name != "httpx"]
    status = httpx.get(f"{proxy.base_url}/agentcompact/status", timeout=10)
    assert KEY not in status.text and status.json()["compactions"] >= 1


def test_count_tokens_and_other_paths_pass_through_untouched(
        proxy: ThreadedServer, upstream: Upstream) -> None:
    contents = gemini_history(24)
    raw = orjson.dumps({"contents": contents})
    got = httpx.post(f"{proxy.base_url}/v1beta/models/gemini-3-pro-preview:countTokens",
                     content=raw, headers={"x-goog-api-key": KEY}, timeout=30)
    assert got.status_code == 200 and got.json()["totalTokens"] > 3000
    assert upstream.tap.sent[-1].request == raw


def test_debug_dumps_redact_the_key(start_proxy: ProxyFactory, upstream: Upstream,
                                    tmp_path: Path) -> None:
    proxy = start_proxy(budget=Budget(3000), counter="chars", debug_dir=str(tmp_path / "dumps"))
    contents = gemini_history(3)
    httpx.post(f"{proxy.base_url}{STREAM}?alt=sse&key={KEY}", json=body(contents),
               headers={"x-goog-api-key": KEY}, timeout=30)
    files = list((tmp_path / "dumps").iterdir())
    assert files and all(KEY.encode() not in p.read_bytes() for p in files)
    assert b"[redacted]" in files[0].read_bytes()


def test_an_unreachable_upstream_is_a_google_error_without_the_key(
        start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    proxy = start_proxy(gemini_upstream="http://127.0.0.1:9", connect_timeout=2.0)
    with caplog.at_level(logging.INFO, "agentcompact"):
        got = httpx.post(f"{proxy.base_url}{STREAM}?alt=sse&key={KEY}",
                         json=body(gemini_history(1)), timeout=30)
    assert got.status_code == 502
    assert got.json()["error"]["status"] == "UNAVAILABLE"
    assert KEY not in caplog.text and KEY not in got.text


@pytest.mark.parametrize("stream", [True, False])
def test_record_reassembles_the_model_content(start_proxy: ProxyFactory, upstream: Upstream,
                                              tmp_path: Path, stream: bool) -> None:
    proxy = start_proxy(record=str(tmp_path / "run"), budget=Budget(3000), counter="chars")
    long_text = "Looking at the step files in order. " * 6
    upstream.sim.script.push(Reply.calling(ToolCall("read_file", {"file_path": "a"}),
                                           ToolCall("read_file", {"file_path": "b"}),
                                           text=long_text).thinking_first("plan the reads"))
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    got = httpx.post(f"{proxy.base_url}/v1beta/models/gemini-3-pro-preview:{method}",
                     json=body(gemini_history(20)), timeout=30)
    assert got.status_code == 200
    proxy.stop()
    lines = (tmp_path / "run" / "events.jsonl").read_bytes().splitlines()
    (call,) = [e["data"] for e in map(orjson.loads, lines) if e["kind"] == "model_call"]
    assert call["dialect"] == "gemini" and call["compacted"]
    assert call["messages"] == upstream.requests[-1].body["contents"]
    assert "contents" not in call["request"] and call["request"]["systemInstruction"] == SYSTEM
    (answer,) = call["response"]
    parts = answer["parts"]
    assert [p.get("thought", False) for p in parts] == [True, False, False, False]
    assert parts[1]["text"] == long_text  # streamed in pieces, rebuilt as one part
    assert [p["functionCall"]["args"] for p in parts[2:]] == [{"file_path": "a"},
                                                              {"file_path": "b"}]
    assert "thoughtSignature" in parts[2] and "thoughtSignature" not in parts[3]
    assert call["model"] == "gemini-3-pro-preview"
    assert call["usage"]["promptTokenCount"] > 0


def test_reassembly_joins_text_and_keeps_a_closing_signature() -> None:
    def chunk(*parts: dict[str, Any], done: bool = False) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}}
        if done:
            candidate["finishReason"] = "STOP"
        return b"data: " + orjson.dumps({"candidates": [candidate],
                                         "modelVersion": "gemini-3"}) + b"\r\n\r\n"

    data = (chunk({"text": "thinking ", "thought": True}) + chunk({"text": "more", "thought": True})
            + chunk({"text": "All "}) + chunk({"text": "done."})
            + chunk({"text": "", "thoughtSignature": "c2ln"}, done=True))
    got = reassemble("gemini", data, streamed=True)
    assert got.complete and got.model == "gemini-3"
    assert got.response == [{"role": "model", "parts": [
        {"text": "thinking more", "thought": True},
        {"text": "All done.", "thoughtSignature": "c2ln"}]}]
    cut = reassemble("gemini", data[: data.index(b"done.")], streamed=True)
    assert not cut.complete


def test_the_google_gen_ai_sdk_through_the_proxy(proxy: ThreadedServer,
                                                 upstream: Upstream) -> None:
    genai = pytest.importorskip("google.genai")
    types = pytest.importorskip("google.genai.types")
    upstream.sim.script.push("First answer.", "Streamed answer.")
    client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=proxy.base_url))
    contents = gemini_history(20)
    config = types.GenerateContentConfig(system_instruction="You are terse.")
    answer = client.models.generate_content(model="gemini-3-pro-preview", contents=contents,
                                            config=config)
    assert answer.text == "First answer."
    streamed = "".join(c.text or "" for c in client.models.generate_content_stream(
        model="gemini-3-pro-preview", contents=contents, config=config))
    assert streamed == "Streamed answer."
    for request in upstream.requests[-2:]:
        assert request.headers["x-goog-api-key"] == KEY
        sent = request.body["contents"]
        assert len(sent) < len(contents)
        validate(sent, D)


def test_a_recorded_gemini_run_exports_to_rows(start_proxy: ProxyFactory, upstream: Upstream,
                                               tmp_path: Path) -> None:
    """Two recorded Gemini calls of one conversation become training rows: the prompt
    holds the system instruction and the function declarations, the model's function calls
    and text are the sampled turns, its function responses the environment's."""
    pytest.importorskip("tokenizers")
    from agentcompact.trajectory.export import export_runs

    from ...conftest import QWEN_TOKENIZER

    proxy = start_proxy(record=str(tmp_path / "run"), budget=Budget(3000), counter="chars")
    upstream.sim.script.push(Reply.calling(ToolCall("read_file", {"file_path": "a"}),
                                           text="Reading a."), "Done.")
    url = f"{proxy.base_url}/v1beta/models/gemini-3-pro-preview:generateContent"
    history = gemini_history(4)
    first = httpx.post(url, json=body(history), timeout=30)
    assert first.status_code == 200
    answer = first.json()["candidates"][0]["content"]
    call = next(p["functionCall"] for p in answer["parts"] if "functionCall" in p)
    history += [answer, {"role": "user", "parts": [{"functionResponse": {
        "name": call["name"], "response": {"output": filler_text(200)}}}]}]
    assert httpx.post(url, json=body(history), timeout=30).status_code == 200
    proxy.stop()
    manifest = export_runs([tmp_path / "run"], tmp_path / "rows", str(QWEN_TOKENIZER))
    assert manifest["counts"]["segments"] >= 1, manifest
    pq = pytest.importorskip("pyarrow.parquet")
    from tokenizers import Tokenizer

    rows = pq.read_table(tmp_path / "rows" / "segments-00000.parquet").to_pylist()
    tok = Tokenizer.from_file(str(QWEN_TOKENIZER / "tokenizer.json"))
    (row,) = rows  # both calls extend one context: one segment
    assert manifest["counts"]["model_calls"] == 2
    trained = tok.decode([t for t, m in zip(row["response_ids"], row["response_mask"]) if m])
    assert trained.startswith("Reading a.") and trained.endswith("Done.")
    assert '"name": "read_file", "arguments": {"file_path": "a"}' in trained
    environment = tok.decode([t for t, m in zip(row["response_ids"], row["response_mask"])
                              if not m])
    assert filler_text(200)[:40] in environment  # the function response, not trained
    # the prompt the model saw: its system instruction and function declarations are
    # rendered, and the row states the sampling settings of generationConfig
    prompt = tok.decode(row["prompt_ids"])
    assert SYSTEM["parts"][0]["text"] in prompt and '"name": "read_file"' in prompt
    assert row["sampling"]["temperature"] == 1.0
