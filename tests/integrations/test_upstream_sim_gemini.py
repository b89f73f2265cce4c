"""The simulator's Gemini API: the requests Gemini CLI 0.61.0 sent (captured) answered,
answers in the API's shapes (JSON and SSE chunks), signatures as a Gemini 3 model gives
them, and the API's own refusals, word for word."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentcompact.testing import Fault, Reply, RunningServer, Script, ToolCall, UpstreamSim, serve
from agentcompact.testing._clis import ToolLoop
from agentcompact.testing._gemini_wire import schema_sample, signature_of

pytestmark = pytest.mark.network

CAPTURED = Path(__file__).resolve().parents[1] / "clis" / "data"
PRO = "/v1beta/models/gemini-3-pro-preview"
USER = {"role": "user", "parts": [{"text": "go"}]}


@pytest.fixture
def sim() -> UpstreamSim:
    return UpstreamSim()


@pytest.fixture
def server(sim: UpstreamSim) -> Iterator[RunningServer]:
    with serve(sim) as running:
        yield running


def _post(server: RunningServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=10)


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.text.splitlines()
            if line.startswith("data: ")]


def test_the_captured_cli_requests_are_answered(server: RunningServer, sim: UpstreamSim,
                                                tmp_path: Path) -> None:
    loop = ToolLoop([tmp_path / f"step{i:03d}.txt" for i in range(9)])
    sim.script.then = loop
    routing, main = json.loads((CAPTURED / "gemini-cli-0.61.0-requests.json").read_text())
    got = httpx.post(server.base_url + routing["path"], json=routing["body"],
                     headers=routing["headers"], timeout=10)
    assert got.status_code == 200
    answer = got.json()["candidates"][0]["content"]["parts"][0]["text"]
    assert set(json.loads(answer)) == {"complexity_reasoning", "complexity_score"}
    streamed = httpx.post(f"{server.base_url}{main['path']}?{main['query']}", json=main["body"],
                          headers=main["headers"], timeout=10)
    assert streamed.status_code == 200, streamed.text
    call = _events(streamed)[-1]["candidates"][0]["content"]["parts"][-1]["functionCall"]
    assert call == {"name": "read_file", "args": {"file_path": str(tmp_path / "step005.txt")}}


def test_generate_content_json_and_sse(server: RunningServer, sim: UpstreamSim) -> None:
    sim.script.push(Reply("Hello there, " * 12), Reply("Hello there, " * 12))
    body = {"contents": [USER], "generationConfig": {"maxOutputTokens": 500}}
    whole = _post(server, f"{PRO}:generateContent", body).json()
    (candidate,) = whole["candidates"]
    assert candidate["finishReason"] == "STOP" and candidate["content"]["role"] == "model"
    assert candidate["content"]["parts"][0]["text"] == "Hello there, " * 12
    assert candidate["content"]["parts"][-1]["thoughtSignature"]  # Gemini 3 signs its answers
    assert whole["modelVersion"] == "gemini-3-pro-preview"
    usage = whole["usageMetadata"]
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["candidatesTokenCount"]
    stream = _post(server, f"{PRO}:streamGenerateContent?alt=sse", body)
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = _events(stream)
    assert len(events) > 1 and "finishReason" not in events[0]["candidates"][0]
    assert events[-1]["candidates"][0]["finishReason"] == "STOP"
    text = "".join(p.get("text", "") for e in events
                   for p in e["candidates"][0]["content"]["parts"])
    assert text == "Hello there, " * 12


def test_calls_signed_on_the_first_only_and_not_by_gemini_2(server: RunningServer,
                                                              sim: UpstreamSim) -> None:
    calls = Reply.calling(ToolCall("read_file", {"p": "a"}), ToolCall("read_file", {"p": "b"}),
                          ToolCall("ls", {}, id="call-7"))
    sim.script.push(calls, calls)
    parts = _post(server, f"{PRO}:generateContent", {"contents": [USER]}).json()[
        "candidates"][0]["content"]["parts"]
    assert [("thoughtSignature" in p) for p in parts if "functionCall" in p] == [True, False,
                                                                                  False]
    assert parts[0]["thoughtSignature"] == signature_of("read_file", {"p": "a"})
    assert parts[-1]["functionCall"]["id"] == "call-7" and "id" not in parts[0]["functionCall"]
    old = _post(server, "/v1beta/models/gemini-2.5-pro:generateContent",
                {"contents": [USER]}).json()["candidates"][0]["content"]["parts"]
    assert not any("thoughtSignature" in p for p in old)


_CALL = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}},
                                     "thoughtSignature": signature_of("f", {})}]}
_ANSWER = {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}


@pytest.mark.parametrize(("contents", "message"), [
    ([], "contents is not specified"),
    ([_CALL, _ANSWER], "function call turn comes immediately after a user turn"),
    ([USER, _ANSWER], "function response turn comes immediately after a function call turn"),
    ([USER, {"role": "model", "parts": _CALL["parts"] * 2}, _ANSWER],
     "number of function response parts is equal to the number of function call parts"),
    ([USER, {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]}, _ANSWER],
     "Function call is missing a thought_signature"),
    ([USER, {"role": "model", "parts": [{"functionCall": {"name": "g", "args": {}},
                                         "thoughtSignature": signature_of("f", {})}]},
      {"role": "user", "parts": [{"functionResponse": {"name": "g", "response": {}}}]}],
     "Corrupted thought signature"),
    ([USER, {"role": "system", "parts": [{"text": "x"}]}], "valid role: user, model"),
    ([USER, {"role": "model", "parts": []}], "contents.parts must not be empty"),
])
def test_what_the_api_refuses_is_refused_in_its_words(server: RunningServer,
                                                      contents: list[Any], message: str) -> None:
    got = _post(server, f"{PRO}:streamGenerateContent?alt=sse", {"contents": contents})
    assert got.status_code == 400
    error = got.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and message in error["message"]


def test_what_the_api_accepts(server: RunningServer) -> None:
    unsigned = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]}
    for path, contents in [
        (f"{PRO}:generateContent", [USER, USER]),  # Gemini CLI's routing request
        (f"{PRO}:generateContent", [USER, _CALL, _ANSWER]),
        (f"{PRO}:generateContent", [USER, unsigned, _ANSWER, USER]),  # an earlier turn
        ("/v1beta/models/gemini-2.5-pro:generateContent", [USER, unsigned, _ANSWER]),
    ]:
        assert _post(server, path, {"contents": contents}).status_code == 200


def test_count_tokens_and_the_context_window(sim: UpstreamSim) -> None:
    small = UpstreamSim(Script(), context_window=100)
    big = {"contents": [{"role": "user", "parts": [{"text": "word " * 400}]}]}
    with serve(small) as server:
        count = _post(server, f"{PRO}:countTokens", big).json()["totalTokens"]
        assert count > 400
        wrapped = _post(server, f"{PRO}:countTokens", {"generateContentRequest": big})
        assert wrapped.json()["totalTokens"] == count
        refused = _post(server, f"{PRO}:generateContent", big)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        f"The input token count ({count}) exceeds the maximum number of tokens allowed (100).")


def test_faults_in_google_shape(server: RunningServer, sim: UpstreamSim) -> None:
    sim.script.push(Fault.http(429, "Resource has been exhausted"))
    got = _post(server, f"{PRO}:generateContent", {"contents": [USER]})
    assert got.status_code == 429 and got.json()["error"]["status"] == "RESOURCE_EXHAUSTED"


def test_schema_sample_follows_the_schema() -> None:
    schema = {"type": "OBJECT", "properties": {
        "a": {"type": "STRING"}, "b": {"type": "INTEGER"}, "c": {"type": "number"},
        "d": {"type": "array", "items": {"type": "boolean"}}, "e": {"enum": ["x", "y"]},
        "f": {"type": "integer", "minimum": 5}}}
    assert schema_sample(schema) == {"a": "simulated", "b": 1, "c": 0.0, "d": [False],
                                     "e": "x", "f": 5}
