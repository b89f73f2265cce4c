"""The SDK wrappers, driven by the official openai and anthropic clients against the
upstream simulator: a tool loop per client type whose history crosses a small trigger."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest

from agentcompact import Budget, Engine, get_dialect, validate
from agentcompact.integrations.sdk import CompactedClient, compact
from agentcompact.integrations.upstream_sim import (
    Reply,
    RunningServer,
    Script,
    ToolCall,
    UpstreamSim,
    filler_text,
    prompt_text,
    serve,
)
from agentcompact.markers import COMPACTION_HEADER
from tests.integrations.conftest import Collector

pytestmark = pytest.mark.network

TRIGGER = 2000
TURNS = 10
SYSTEM = "You are a careful coder."
FUNCTION = {"name": "read_file", "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}


def steps() -> list[Reply]:
    out: list[Reply] = []
    for i in range(TURNS):
        if i % 3 == 1:
            out.append(Reply.calling(ToolCall("read_file", {"path": f"a{i}.py"}),
                                     ToolCall("read_file", {"path": f"b{i}.py"})))
        else:
            out.append(Reply.tool("read_file", {"path": f"f{i}.py"}, text=f"step {i}"))
    out.append(Reply("all done"))
    return out


def tool_output(args: str | dict[str, Any]) -> str:
    path = (json.loads(args) if isinstance(args, str) else args).get("path", "?")
    return f"# {path}\n" + filler_text(250)


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serve(UpstreamSim(Script(*steps()))) as running:
        yield running


@pytest.fixture
def oai(server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0) as raw:
        yield raw


@pytest.fixture
async def aoai(server: RunningServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x",
                                  max_retries=0) as raw:
        yield raw


@pytest.fixture
def claude(server: RunningServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0) as raw:
        yield raw


@pytest.fixture
async def aclaude(server: RunningServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="x",
                                        max_retries=0) as raw:
        yield raw


def wrap(client: Any, pm: Any, **options: Any) -> CompactedClient:
    return compact(client, trigger_tokens=TRIGGER, plugins=pm, episode_id="ep", group_id="g",
                   **options)


def bodies(server: RunningServer, path: str) -> list[dict[str, Any]]:
    return [r.body for r in server.requests if r.path == path]


def check_sent(server: RunningServer, path: str, dialect: str, key: str,
               collector: Collector) -> None:
    """What the provider received: valid, compacted, prefix-stable; each call logged."""
    sent = bodies(server, path)
    assert len(sent) == TURNS + 1
    d = get_dialect(dialect)
    for body in sent:
        validate(body[key], d)
    compacted = [b for b in sent if COMPACTION_HEADER in prompt_text(b)]
    assert compacted, "the history never got compacted"
    cliffs = sum(1 for a, b in zip(sent, sent[1:], strict=False)
                 if b[key][: len(a[key])] != a[key])
    assert 1 <= cliffs < len(sent) // 2
    assert len(collector.calls) == len(sent)
    for call, body in zip(collector.calls, sent, strict=True):
        assert (call.episode_id, call.group_id, call.dialect) == ("ep", "g", dialect)
        assert call.messages == body[key]
        assert call.compacted == (COMPACTION_HEADER in prompt_text(body))
        assert call.response and call.usage
    assert collector.calls[-1].model


# ------------------------------------------------------------------ OpenAI chat


def chat_loop(client: Any, stream: bool = False) -> list[Any]:
    messages: list[Any] = [{"role": "system", "content": SYSTEM},
                           {"role": "user", "content": "Fix the bug."}]
    for _ in range(TURNS + 1):
        kwargs: dict[str, Any] = {"model": "gpt-sim", "messages": messages,
                                  "tools": [{"type": "function", "function": FUNCTION}]}
        if stream:
            text, calls = "", {}
            for chunk in client.chat.completions.create(
                    stream=True, stream_options={"include_usage": True}, **kwargs):
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    for c in choice.delta.tool_calls or ():
                        entry = calls.setdefault(c.index, {"id": c.id, "type": "function",
                                                           "function": {"name": "",
                                                                        "arguments": ""}})
                        entry["function"]["name"] += c.function.name or ""
                        entry["function"]["arguments"] += c.function.arguments or ""
            message: Any = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [calls[i] for i in sorted(calls)]
            tool_calls = message.get("tool_calls", [])
            ids_args = [(c["id"], c["function"]["arguments"]) for c in tool_calls]
        else:
            message = client.chat.completions.create(**kwargs).choices[0].message
            ids_args = [(c.id, c.function.arguments) for c in message.tool_calls or ()]
        messages.append(message)  # SDK objects go back in, as users do
        if not ids_args:
            break
        for ref, args in ids_args:
            messages.append({"role": "tool", "tool_call_id": ref, "content": tool_output(args)})
    return messages


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat(server: RunningServer, oai: Any, pm: Any, collector: Collector,
                     stream: bool) -> None:
    client = wrap(oai, pm)
    history = chat_loop(client, stream)
    assert len(history) == 2 + 2 * TURNS + TURNS // 3 + 1 + (TURNS % 3 > 1)
    check_sent(server, "/v1/chat/completions", "openai_chat", "messages", collector)
    assert collector.calls[-1].response[0]["content"] == "all done"
    assert collector.calls[0].response[0]["tool_calls"][0]["function"]["name"] == "read_file"
    assert collector.calls[0].request["tools"][0]["function"]["name"] == "read_file"
    assert client.models.list().data[0].id == "sim-model"  # proxied untouched


async def test_async_openai_chat_stream(server: RunningServer, aoai: Any, pm: Any,
                                        collector: Collector) -> None:
    client = wrap(aoai, pm)
    messages: list[Any] = [{"role": "system", "content": SYSTEM},
                           {"role": "user", "content": "Fix the bug."}]
    for _ in range(TURNS + 1):
        response = await client.chat.completions.create(
            model="gpt-sim", messages=messages, tools=[{"type": "function", "function": FUNCTION}],
            stream=True, stream_options={"include_usage": True})
        async with response as stream:
            async for _chunk in stream:
                pass
        message = collector.calls[-1].response[0]  # reassembled by the wrapper
        messages.append(message)
        for call in message.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": tool_output(call["function"]["arguments"])})
        if not message.get("tool_calls"):
            break
    check_sent(server, "/v1/chat/completions", "openai_chat", "messages", collector)
    assert collector.calls[-1].usage.get("completion_tokens")


# ------------------------------------------------------------------ OpenAI responses


def responses_loop(client: Any, stream: bool = False) -> list[Any]:
    items: list[Any] = [{"role": "user", "content": "Fix the bug."}]
    tools = [{"type": "function", **FUNCTION}]
    for _ in range(TURNS + 1):
        kwargs = {"model": "gpt-sim", "input": items, "instructions": SYSTEM, "tools": tools}
        if stream:
            output = []
            for event in client.responses.create(stream=True, **kwargs):
                if event.type == "response.completed":
                    output = event.response.output
        else:
            output = client.responses.create(**kwargs).output
        calls = [o for o in output if o.type == "function_call"]
        items.extend(o.model_dump(exclude_none=True) for o in output)
        if not calls:
            break
        for call in calls:
            items.append({"type": "function_call_output", "call_id": call.call_id,
                          "output": tool_output(call.arguments)})
    return items


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses(server: RunningServer, oai: Any, pm: Any, collector: Collector,
                          stream: bool) -> None:
    responses_loop(wrap(oai, pm), stream)
    check_sent(server, "/v1/responses", "openai_responses", "input", collector)
    sent = bodies(server, "/v1/responses")
    assert all(b["instructions"] == SYSTEM for b in sent)
    assert collector.calls[0].request["instructions"] == SYSTEM
    assert [i["type"] for i in collector.calls[0].response] == ["message", "function_call"]


def test_responses_string_input_passes_through(server: RunningServer, oai: Any, pm: Any,
                                               collector: Collector) -> None:
    wrap(oai, pm).responses.create(model="gpt-sim", input="hello")
    (body,) = bodies(server, "/v1/responses")
    assert body["input"] == "hello"
    assert collector.calls[0].messages == [{"role": "user", "content": "hello"}]


# ------------------------------------------------------------------ Anthropic


def anthropic_loop(client: Any, mode: str, collector: Collector) -> list[Any]:
    messages: list[Any] = [{"role": "user", "content": "Fix the bug."}]
    tools = [{"name": "read_file", "description": "Read a file.",
              "input_schema": FUNCTION["parameters"]}]
    for _ in range(TURNS + 1):
        kwargs = {"model": "claude-sim", "max_tokens": 1024, "system": SYSTEM,
                  "messages": messages, "tools": tools}
        if mode == "stream":
            with client.messages.stream(**kwargs) as stream:
                blocks = stream.get_final_message().content
        elif mode == "raw-stream":
            for _event in client.messages.create(stream=True, **kwargs):
                pass
            blocks = collector.calls[-1].response[0]["content"]  # reassembled by the wrapper
        else:
            blocks = client.messages.create(**kwargs).content
        messages.append({"role": "assistant", "content": blocks})  # SDK blocks go back in
        uses = [b for b in blocks if _get(b, "type") == "tool_use"]
        if not uses:
            break
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": _get(b, "id"),
             "content": tool_output(_get(b, "input"))} for b in uses]})
    return messages


def _get(block: Any, key: str) -> Any:
    return block[key] if isinstance(block, dict) else getattr(block, key)


@pytest.mark.parametrize("mode", ["create", "stream", "raw-stream"])
def test_anthropic(server: RunningServer, claude: Any, pm: Any, collector: Collector,
                   mode: str) -> None:
    anthropic_loop(wrap(claude, pm), mode, collector)
    check_sent(server, "/v1/messages", "anthropic", "messages", collector)
    assert all(b["system"] == SYSTEM for b in bodies(server, "/v1/messages"))
    first = collector.calls[0].response[0]
    assert first["role"] == "assistant"
    assert [b["type"] for b in first["content"]] == ["text", "tool_use"]
    assert first["content"][1]["input"] == {"path": "f0.py"}
    assert collector.calls[-1].response[0]["content"][0]["text"] == "all done"
    assert collector.calls[-1].usage["output_tokens"] > 0


async def test_async_anthropic(server: RunningServer, aclaude: Any, pm: Any,
                               collector: Collector) -> None:
    client = wrap(aclaude, pm)
    messages: list[Any] = [{"role": "user", "content": "Fix the bug."}]
    tools = [{"name": "read_file", "description": "Read a file.",
              "input_schema": FUNCTION["parameters"]}]
    for i in range(TURNS + 1):
        kwargs = {"model": "claude-sim", "max_tokens": 1024, "system": SYSTEM,
                  "messages": messages, "tools": tools}
        if i % 2:
            async with client.messages.stream(**kwargs) as stream:
                message = await stream.get_final_message()
        else:
            message = await client.messages.create(**kwargs)
        messages.append({"role": "assistant", "content": message.content})
        uses = [b for b in message.content if b.type == "tool_use"]
        if not uses:
            break
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id, "content": tool_output(b.input)}
            for b in uses]})
    check_sent(server, "/v1/messages", "anthropic", "messages", collector)


# ------------------------------------------------------------------ options


def test_engine_instance_record_off_and_ids(oai: Any, pm: Any, collector: Collector) -> None:
    engine = Engine(dialect="openai_chat", budget=Budget(trigger_tokens=TRIGGER), plugins=pm)
    client = compact(oai, engine=engine, record=False)
    assert client.engines["openai_chat"] is engine
    stream = client.chat.completions.create(model="m", messages=[{"role": "user",
                                                                  "content": "hi"}], stream=True)
    assert isinstance(stream, openai.Stream)  # untouched when not recording
    list(stream)
    assert collector.calls == []
    other = compact(oai, engine=engine, plugins=pm).with_options(timeout=5)
    assert isinstance(other, CompactedClient)
    other.episode_id, other.group_id = "ep-2", "g-2"
    other.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert (collector.calls[-1].episode_id, collector.calls[-1].group_id) == ("ep-2", "g-2")
    with pytest.raises(Exception, match="unsupported client"):
        compact(object())
