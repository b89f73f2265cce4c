"""End to end through real sockets: official SDK clients → proxy → recording upstream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from agentcompact import get_dialect, validate
from agentcompact.integrations.proxy import ThreadedServer
from agentcompact.testing import Reply, ToolCall

from .conftest import Upstream
from .histories import anthropic_history, chat_history, responses_history

pytestmark = pytest.mark.network

MODEL = "sim-model"
PARALLEL = Reply.calling(ToolCall("read_file", {"path": "a.py"}), ToolCall("grep", {"q": "x"}),
                         text="Checking both.")


@pytest.fixture
def claude(proxy: ThreadedServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=proxy.base_url, api_key="sk-ant-test",
                             max_retries=0) as client:
        yield client


@pytest.fixture
def oai(proxy: ThreadedServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key="sk-test",
                       max_retries=0) as client:
        yield client


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def assert_kept_verbatim(sent: list[Any], original: list[Any]) -> None:
    """Every sent message is an original one byte for byte, except compaction messages."""
    originals = {dumps(m) for m in original}
    for message in sent:
        if dumps(message) not in originals:
            assert "[agentcompact:" in dumps(message).decode(), message


# ------------------------------------------------------------------------- Anthropic


def test_anthropic_compacts_over_trigger_and_keeps_signed_thinking(
    claude: anthropic.Anthropic, upstream: Upstream
) -> None:
    upstream.sim.script.push(Reply.tool("read_file", {"path": "b.py"}).thinking_first("hmm", "s1"))
    history = anthropic_history(20)
    message = claude.messages.create(model=MODEL, max_tokens=1024, messages=history)
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    assert message.content[0].signature == "s1"
    sent = upstream.requests[-1].body["messages"]
    assert len(sent) < len(history)
    validate(sent, get_dialect("anthropic"))
    assert_kept_verbatim(sent, history)
    # recent turns verbatim, signatures included: what follows the compaction message is
    # the end of the history, at least the newest turn (how many turns depends on when the
    # replayed compactions fell)
    marker = next(i for i, m in enumerate(sent) if b"[agentcompact:" in dumps(m))
    kept = len(sent) - marker - 1
    assert kept >= 2 and sent[-kept:] == history[-kept:]
    thinking = [b for m in sent if isinstance(m["content"], list) for b in m["content"]
                if b.get("type") == "thinking"]
    assert thinking and all(b["signature"].startswith("sig-") for b in thinking)


def test_anthropic_stream_with_thinking_and_parallel_tools(
    claude: anthropic.Anthropic, upstream: Upstream
) -> None:
    upstream.sim.script.push(Reply.calling(*PARALLEL.tool_calls, text="Both.")
                             .thinking_first("plan", "sig-stream"))
    with claude.messages.stream(model=MODEL, max_tokens=1024,
                                messages=anthropic_history(20)) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert final.content[0].signature == "sig-stream"
    assert [b.input for b in final.content[2:]] == [{"path": "a.py"}, {"q": "x"}]
    validate(upstream.requests[-1].body["messages"], get_dialect("anthropic"))


def test_prefix_is_byte_stable_between_cliffs(claude: anthropic.Anthropic,
                                              upstream: Upstream) -> None:
    """A session growing one turn per call: between two cliffs, each call's context
    starts with the previous call's context, byte for byte."""
    full = anthropic_history(30, result_tokens=120)
    sent: list[list[Any]] = []
    for turns in range(6, 31):
        claude.messages.create(model=MODEL, max_tokens=64, messages=full[: 1 + 2 * turns])
        sent.append(upstream.requests[-1].body["messages"])
    stable = cliffs = 0
    for before, after in zip(sent, sent[1:], strict=False):
        if len(after) == len(before) + 2:
            assert dumps(after[: len(before)]) == dumps(before)
            stable += 1
        else:
            cliffs += 1
    assert cliffs >= 1 and stable >= 10


def test_system_and_tools_count_against_the_budget(claude: anthropic.Anthropic,
                                                  upstream: Upstream) -> None:
    """The proxy's trigger is 3,000 chars/4 tokens. Messages alone stay under it; with a
    system prompt and tools of ~1,500 tokens the request as a whole is over, so the proxy
    compacts, and what the upstream receives, tools included, fits the trigger."""
    history = anthropic_history(8, result_tokens=150)
    tools = [{"name": f"tool_{i}", "description": "Reads things. " * 40,
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
             for i in range(10)]
    system = "You are a careful coding agent. " * 30
    assert len(orjson.dumps(history)) // 4 < 3000 < len(
        orjson.dumps(history) + orjson.dumps(tools) + system.encode()) // 4
    claude.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert upstream.requests[-1].body["messages"] == history  # alone: under the trigger
    claude.messages.create(model=MODEL, max_tokens=64, messages=history, tools=tools,
                           system=system)
    body = upstream.requests[-1].body
    assert body["tools"] == tools and body["system"] == system
    assert len(body["messages"]) < len(history)
    validate(body["messages"], get_dialect("anthropic"))


def test_small_request_is_forwarded_untouched(claude: anthropic.Anthropic,
                                              upstream: Upstream) -> None:
    history = anthropic_history(2)
    claude.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert upstream.requests[-1].body["messages"] == history


# ------------------------------------------------------------------------- OpenAI


def test_chat_parallel_tool_calls_non_streaming(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.sim.script.push(PARALLEL)
    history = chat_history(20)
    completion = oai.chat.completions.create(model=MODEL, messages=history)
    calls = completion.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["read_file", "grep"]
    sent = upstream.requests[-1].body["messages"]
    assert len(sent) < len(history)
    validate(sent, get_dialect("openai_chat"))
    assert_kept_verbatim(sent, history)
    assert sent[0] == history[0]


def test_chat_streaming_tool_calls(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.sim.script.push(PARALLEL)
    with oai.chat.completions.stream(model=MODEL, messages=chat_history(20)) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking both."
    assert [json.loads(c.function.arguments) for c in choice.message.tool_calls] == [
        {"path": "a.py"}, {"q": "x"}]
    validate(upstream.requests[-1].body["messages"], get_dialect("openai_chat"))


def test_responses_stream_keeps_encrypted_reasoning(oai: openai.OpenAI,
                                                     upstream: Upstream) -> None:
    upstream.sim.script.push(Reply.tool("shell", {"cmd": "ls"}).thinking_first("t", "enc-new"))
    items = responses_history(20)
    events = list(oai.responses.create(model=MODEL, input=items, stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].encrypted_content == "enc-new"
    sent = upstream.requests[-1].body["input"]
    assert len(sent) < len(items)
    validate(sent, get_dialect("openai_responses"))
    assert_kept_verbatim(sent, items)
    kept = [i for i in sent if i.get("type") == "reasoning"]
    assert kept and all(dumps(i) in {dumps(o) for o in items} for i in kept)


# ------------------------------------------------------------- byte-identical relay

BODIES = {
    "/v1/messages": lambda stream: {"model": MODEL, "max_tokens": 256, "stream": stream,
                                    "messages": anthropic_history(20)},
    "/v1/chat/completions": lambda stream: {"model": MODEL, "stream": stream,
                                            "messages": chat_history(20)},
    "/v1/responses": lambda stream: {"model": MODEL, "stream": stream,
                                     "input": responses_history(20)},
}


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("path", sorted(BODIES))
def test_client_receives_exactly_the_upstream_bytes(
    proxy: ThreadedServer, upstream: Upstream, path: str, stream: bool
) -> None:
    upstream.sim.script.push(PARALLEL.thinking_first("why", "sig-z"))
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client, client.stream(
        "POST", path, json=BODIES[path](stream), headers={"x-api-key": "k"}
    ) as response:
        received = b"".join(response.iter_raw())
        status, ctype = response.status_code, response.headers["content-type"]
    sent = upstream.tap.sent[-1]
    assert sent.finished.wait(5) and sent.completed
    assert status == sent.status == 200
    assert received == sent.body
    assert ("text/event-stream" in ctype) is stream
