"""The SDK wrappers, driven by the official openai and anthropic clients against the
upstream simulator: a tool loop per client type whose history crosses a small trigger."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from agentcompact import Budget, Engine, get_dialect, validate
from agentcompact._markers import COMPACTION_HEADER
from agentcompact.errors import ConfigError, DialectError
from agentcompact.integrations.sdk import _TABLES, CompactedClient, compact
from agentcompact.testing import (
    Reply,
    RunningServer,
    Script,
    ToolCall,
    UpstreamSim,
    filler_text,
    prompt_text,
    serve,
)
from agentcompact.wire import from_body, reassemble_events
from tests.integrations.conftest import Collector, largest_request

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
    return compact(client, budget=Budget(trigger_tokens=TRIGGER), plugins=pm, episode_id="ep",
                   group_id="g",
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
    assert collector.calls[-1].policy_version == 0
    other.policy_version = 7  # a training loop, after an update: recorded on every call
    other.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert collector.calls[-1].policy_version == 7
    with pytest.raises(ConfigError, match="unsupported client"):
        compact(object())


# ------------------------------------------------------------------ every call path bounded


BIG = 2000  # the trigger of the call-path tests: one request of ~6.6k tokens each
CHAT_TOOLS = [{"type": "function", "function": {**FUNCTION, "strict": True}}]  # parse wants it
RESP_TOOLS = [{"type": "function", **FUNCTION}]
CLAUDE_TOOLS = [{"name": "read_file", "description": "Read a file.",
                 "input_schema": FUNCTION["parameters"]}]


def long_chat(n: int = 20) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(n):
        out.append({"role": "user", "content": f"question {i} " + filler_text(150)})
        out.append({"role": "assistant", "content": f"answer {i} " + filler_text(150)})
    out.append({"role": "user", "content": "and now?"})
    return out


def chat_kwargs() -> dict[str, Any]:
    return {"model": "gpt-sim", "messages": long_chat(), "tools": CHAT_TOOLS}


def responses_kwargs() -> dict[str, Any]:
    return {"model": "gpt-sim", "input": long_chat()[1:], "instructions": SYSTEM,
            "tools": RESP_TOOLS}


def claude_kwargs() -> dict[str, Any]:
    return {"model": "claude-sim", "max_tokens": 256, "system": SYSTEM,
            "messages": long_chat()[1:], "tools": CLAUDE_TOOLS}


def _drain(result: Any) -> None:
    for _ in result:
        pass


async def _adrain(result: Any) -> None:
    async for _ in result:
        pass


# per dialect: (kwargs factory, route), then "resource.method how-the-result-is-consumed"
_ENDPOINT_CASES: dict[str, tuple[Callable[[], dict[str, Any]], str, list[str]]] = {
    "openai_chat": (chat_kwargs, "/v1/chat/completions", [
        "chat.completions.create object", "chat.completions.create stream",
        "chat.completions.parse object", "chat.completions.stream manager",
        "chat.completions.with_raw_response.create raw",
        "chat.completions.with_raw_response.parse raw",
        "chat.completions.with_streaming_response.create streaming",
        "beta.chat.completions.create object"]),
    "openai_responses": (responses_kwargs, "/v1/responses", [
        "responses.create object", "responses.create stream", "responses.parse object",
        "responses.stream manager", "responses.with_raw_response.create raw",
        "responses.with_streaming_response.create streaming", "beta.responses.create object"]),
    "anthropic": (claude_kwargs, "/v1/messages", [
        "messages.create object", "messages.create stream", "messages.parse object",
        "messages.stream manager", "messages.count_tokens object",
        "messages.with_raw_response.create raw",
        "messages.with_streaming_response.create streaming", "beta.messages.create object",
        "beta.messages.stream manager"]),
}
# (resource path, method, consumed as, kwargs factory, route, dialect, logged)
CALL_PATHS = [
    (spec.rsplit(" ")[0].rsplit(".", 1)[0], spec.split(" ")[0].rsplit(".", 1)[1],
     spec.split(" ")[1], factory,
     route + ("/count_tokens" if "count_tokens" in spec else ""), dialect,
     "streaming" not in spec and "count_tokens" not in spec)
    for dialect, (factory, route, specs) in _ENDPOINT_CASES.items() for spec in specs
]


def _resolve(client: Any, path: str, method: str) -> Any:
    target = client
    for part in path.split("."):
        target = getattr(target, part)
    return getattr(target, method)


def _kwargs_for(method: str, consume: str, factory: Callable[[], dict[str, Any]]
                ) -> dict[str, Any]:
    kwargs = factory()
    if method == "count_tokens":
        kwargs.pop("max_tokens")
    if consume == "stream":
        kwargs["stream"] = True
    return kwargs


def _client_for(server: RunningServer, dialect: str, is_async: bool) -> Any:
    if dialect == "anthropic":
        cls: Any = anthropic.AsyncAnthropic if is_async else anthropic.Anthropic
        return cls(base_url=server.base_url, api_key="x", max_retries=0)
    cls = openai.AsyncOpenAI if is_async else openai.OpenAI
    return cls(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def _ids(case: tuple[Any, ...]) -> str:
    return f"{case[0]}.{case[1]}-{case[2]}"


@pytest.mark.parametrize("case", CALL_PATHS, ids=_ids)
def test_every_call_path_is_bounded(case: tuple[Any, ...], pm: Any,
                                    collector: Collector) -> None:
    path, method, consume, factory, route, dialect, logged = case
    with serve(UpstreamSim(Script(then=lambda body: "ok"))) as server:
        client = compact(_client_for(server, dialect, False), budget=Budget(trigger_tokens=BIG),
                         plugins=pm)
        call = _resolve(client, path, method)
        kwargs = _kwargs_for(method, consume, factory)
        if consume == "manager":
            with call(**kwargs) as stream:
                _drain(stream)
        elif consume == "streaming":
            with call(**kwargs) as response:
                response.read()
        elif consume == "stream":
            _drain(call(**kwargs))
        else:
            call(**kwargs)
        assert sent_tokens_of(server, route, dialect) <= BIG
        client.close()
    assert len(collector.calls) == int(logged)
    if logged:
        assert collector.calls[0].compacted and collector.calls[0].response


def sent_tokens_of(server: RunningServer, route: str, dialect: str) -> int:
    got = [r for r in server.requests if r.path == route]
    assert len(got) == 1, [r.path for r in server.requests]
    return largest_request(server, route, dialect)


@pytest.mark.parametrize("case", CALL_PATHS, ids=_ids)
async def test_every_async_call_path_is_bounded(case: tuple[Any, ...], pm: Any,
                                                collector: Collector) -> None:
    path, method, consume, factory, route, dialect, logged = case
    async with serve(UpstreamSim(Script(then=lambda body: "ok"))) as server:
        client = compact(_client_for(server, dialect, True), budget=Budget(trigger_tokens=BIG),
                         plugins=pm)
        call = _resolve(client, path, method)
        kwargs = _kwargs_for(method, consume, factory)
        if consume == "manager":
            async with call(**kwargs) as stream:
                await _adrain(stream)
        elif consume == "streaming":
            async with call(**kwargs) as response:
                await response.read()
        elif consume == "stream":
            await _adrain(await call(**kwargs))
        else:
            await call(**kwargs)
        assert sent_tokens_of(server, route, dialect) <= BIG
        await client.close()
    assert len(collector.calls) == int(logged)


def _methods(resource: Any) -> set[str]:
    return {name for name in dir(resource) if not name.startswith("_")
            and name not in ("with_raw_response", "with_streaming_response")}


def _resources(client: Any, wrapped: bool) -> list[tuple[str, str, Any]]:
    """(table name, path, resource) of every resource that sends a context."""
    if isinstance(client, (anthropic.Anthropic, anthropic.AsyncAnthropic)):
        paths = [("messages", "messages"), ("messages", "beta.messages")]
    else:
        paths = [("chat.completions", "chat.completions"), ("responses", "responses"),
                 ("chat.completions", "beta.chat.completions"), ("responses", "beta.responses")]
    out = []
    for table, path in paths:
        target = client
        try:
            for part in path.split("."):
                target = getattr(target, part)
        except AttributeError:
            continue  # not in this SDK version
        out.append((table, path, target))
    return out


@pytest.mark.parametrize("make", [
    lambda: openai.OpenAI(api_key="x"), lambda: openai.AsyncOpenAI(api_key="x"),
    lambda: anthropic.Anthropic(api_key="x"), lambda: anthropic.AsyncAnthropic(api_key="x"),
], ids=["openai", "async-openai", "anthropic", "async-anthropic"])
def test_every_sdk_method_is_classified(make: Callable[[], Any]) -> None:
    """The installed SDKs' methods on the context-sending resources (and their raw and
    streaming-response views, and sub-resources) each have an entry in the wrapper's
    table: a method added by a newer SDK fails here rather than pass through uncompacted."""
    raw = make()
    seen = 0
    for table_name, path, resource in _resources(raw, wrapped=False):
        table = _TABLES[table_name]
        views = [resource] + [getattr(resource, v) for v in ("with_raw_response",
                                                             "with_streaming_response")]
        for view in views:
            for name in _methods(view):
                assert name in table, f"{path}.{name} is not classified by the SDK wrapper"
                sub = table[name]
                if isinstance(sub, dict):
                    for inner in _methods(getattr(view, name)):
                        assert inner in sub, f"{path}.{name}.{inner} is not classified"
                seen += 1
    assert seen > 20
    client = compact(raw, budget=Budget(trigger_tokens=BIG))
    for _, path, _resource in _resources(client, wrapped=True):
        with pytest.raises(ConfigError, match=r"not known .* client\.unwrapped"):
            _resolve(client, path, "some_future_method")
    if isinstance(raw, (anthropic.Anthropic, anthropic.AsyncAnthropic)):
        with pytest.raises(ConfigError, match="batch"):
            _ = client.messages.batches.create
        assert client.messages.batches.list == raw.messages.batches.list
        with pytest.raises(ConfigError, match="tool_runner"):
            _ = client.beta.messages.tool_runner
    else:
        with pytest.raises(ConfigError, match="realtime"):
            _ = client.responses.connect
        assert client.chat.completions.retrieve == raw.chat.completions.retrieve


def test_a_15k_system_prompt_counts_toward_a_20k_trigger(pm: Any, collector: Collector) -> None:
    """System prompt and tool schemas are part of what the budget bounds."""
    system = "Rules.\n" + filler_text(15_000)
    script = Script(then=lambda body: Reply.tool("read_file", {"path": "f.py"}))
    with serve(UpstreamSim(script)) as server:
        raw = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        client = compact(raw, budget=Budget(trigger_tokens=20_000), plugins=pm)
        chat = [{"role": "system", "content": system}, {"role": "user", "content": "go"}]
        claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
        cclient = compact(claude, budget=Budget(trigger_tokens=20_000), plugins=pm)
        items: list[Any] = [{"role": "user", "content": "go"}]
        cmsgs: list[Any] = [{"role": "user", "content": "go"}]
        for _ in range(25):  # 25 tool results of ~260 tokens: the histories pass 20k
            message = client.chat.completions.create(model="m", messages=chat,
                                                     tools=CHAT_TOOLS).choices[0].message
            chat += [message, *({"role": "tool", "tool_call_id": c.id, "content":
                                 tool_output(c.function.arguments)} for c in message.tool_calls)]
            out = client.responses.create(model="m", input=items, instructions=system,
                                          tools=RESP_TOOLS).output
            items += [o.model_dump(exclude_none=True) for o in out]
            items += [{"type": "function_call_output", "call_id": o.call_id,
                       "output": tool_output(o.arguments)} for o in out
                      if o.type == "function_call"]
            reply = cclient.messages.create(model="m", max_tokens=100, system=system,
                                            tools=CLAUDE_TOOLS, messages=cmsgs)
            cmsgs += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b.id, "content": tool_output(b.input)}
                for b in reply.content if b.type == "tool_use"]}]
        assert largest_request(server, "/v1/chat/completions") <= 20_000
        assert largest_request(server, "/v1/responses", "openai_responses") <= 20_000
        assert largest_request(server, "/v1/messages", "anthropic") <= 20_000
        raw.close()
        claude.close()
    # the histories did grow past the trigger: compaction did the bounding
    compactions = {e.dialect for e in collector.events if e.cut}
    assert compactions == {"openai_chat", "openai_responses", "anthropic"}


# ------------------------------------------------------------------ validation, recording


def test_options_are_checked_when_wrapping() -> None:
    raw = openai.OpenAI(api_key="x")
    with pytest.raises(ConfigError, match="trigger_tokens"):
        compact(raw, budget=Budget(trigger_tokens="abc"))
    with pytest.raises(ConfigError, match="'nope'"):
        compact(raw, budget=Budget(trigger_tokens=100), strategy="nope")
    with pytest.raises(ConfigError, match="recent_turns"):
        compact(raw, budget=Budget(trigger_tokens=100, recent_turns=0))
    with pytest.raises(ConfigError, match=r"unknown option\(s\) trigger_tokens; .*budget=Budget"):
        compact(raw, trigger_tokens=100)  # one vocabulary: the Engine's
    with pytest.raises(ConfigError, match="strategy=StrategySettings"):
        compact(raw, budget=Budget(trigger_tokens=100), model="m")
    with pytest.raises(ConfigError, match="triger_tokens"):
        compact(anthropic.Anthropic(api_key="x"), triger_tokens=100)
    assert compact(raw, budget=Budget(trigger_tokens=100, recent_turns=1)).engines[
        "openai_chat"].budget.recent_turns == 1


def test_messages_are_checked_at_call_time(server: RunningServer, oai: Any, pm: Any) -> None:
    client = wrap(oai, pm)
    with pytest.raises(DialectError, match=r"openai_chat: messages\[1\] is str"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"},
                                                            "a string"])
    with pytest.raises(DialectError, match=r"openai_responses: input is int"):
        client.responses.create(model="m", input=3)
    history = [{"role": "user", "content": "Fix the bug."}]
    client.chat.completions.create(model="m", messages=iter(history))  # any iterable
    assert bodies(server, "/v1/chat/completions")[-1]["messages"] == history


def test_a_failing_recorder_never_breaks_the_callers_stream(
        caplog: pytest.LogCaptureFixture) -> None:
    from agentcompact import hookimpl, new_plugin_manager

    class Broken:
        @hookimpl
        def agentcompact_log_model_call(self, call: Any) -> None:
            raise RuntimeError("recorder down")

    broken = new_plugin_manager()
    broken.register(Broken())
    kwargs = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with serve(UpstreamSim()) as server, openai.OpenAI(
            base_url=server.base_url + "/v1", api_key="x", max_retries=0) as oai:
        client = compact(oai, budget=Budget(trigger_tokens=TRIGGER), plugins=broken)
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        assert chunks and chunks[-1].choices[0].finish_reason == "stop"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "echo: hi"
        assert client.chat.completions.create(**kwargs).choices[0].message.content == text
    assert sum("recording a openai_chat call failed: RuntimeError" in r.message
               for r in caplog.records) == 2


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_are_recorded_unchanged(pm: Any, collector: Collector, stream: bool) -> None:
    kwargs: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "logprobs": True, "top_logprobs": 2}
    with serve(UpstreamSim()) as server, openai.OpenAI(
            base_url=server.base_url + "/v1", api_key="x", max_retries=0) as oai:
        client = wrap(oai, pm)
        direct = oai.chat.completions.create(**kwargs)
        want = [e.logprob for e in direct.choices[0].logprobs.content]
        if stream:
            _drain(client.chat.completions.create(stream=True, **kwargs))
        else:
            client.chat.completions.create(**kwargs)
    (call,) = collector.calls
    assert call.response_logprobs == want and want
    assert call.request["top_logprobs"] == 2


def test_server_token_ids_are_recorded_unchanged() -> None:
    """vLLM's ``return_token_ids`` fields: top-level ``prompt_token_ids``, the choice's
    ``token_ids`` (streamed: one piece per chunk)."""
    body = {"model": "m", "prompt_token_ids": [1, 2, 3], "choices": [{
        "index": 0, "message": {"role": "assistant", "content": "ab"}, "token_ids": [7, 8],
        "logprobs": {"content": [{"token": "a", "logprob": -0.5}, {"token": "b",
                                                                   "logprob": -0.25}]}}]}
    got = from_body("openai_chat", body)
    assert (got.prompt_token_ids, got.token_ids, got.logprobs) == ([1, 2, 3], [7, 8],
                                                                   [-0.5, -0.25])
    chunks = [{"model": "m", "prompt_token_ids": [1, 2, 3], "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": "a"}, "token_ids": [7]}]},
        {"model": "m", "choices": [{"index": 0, "delta": {"content": "b"}, "token_ids": [8],
                                    "finish_reason": "stop"}]}]
    streamed = reassemble_events("openai_chat", chunks)
    assert (streamed.prompt_token_ids, streamed.token_ids) == ([1, 2, 3], [7, 8])
    assert streamed.response == [{"role": "assistant", "content": "ab"}] and streamed.complete


def test_reassembler_keeps_citations_and_appends_the_signature() -> None:
    events = [
        {"type": "message_start", "message": {"model": "c", "usage": {"input_tokens": 5}}},
        {"type": "content_block_start", "index": 0, "content_block": {
            "type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta",
                                                              "signature": "abc"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta",
                                                              "signature": "def"}},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text",
                                                                      "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "citations_delta",
                                                              "citation": {"cited_text": "x"}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta",
                                                              "text": "hi"}},
        {"type": "content_block_start", "index": 2, "content_block": {
            "type": "tool_use", "id": "t", "name": "f", "input": {}}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta",
                                                              "partial_json": "{\"a\": "}},
        {"type": "content_block_stop", "index": 2},  # cut JSON: kept as text, no raise
        "not an event", {"type": "content_block_delta"},  # malformed: skipped
        {"type": "message_stop"},
    ]
    got = reassemble_events("anthropic", events)
    thinking, text, tool = got.response[0]["content"]
    assert thinking["signature"] == "abcdef"
    assert text == {"type": "text", "text": "hi", "citations": [{"cited_text": "x"}]}
    assert tool["input"] == "{\"a\": " and got.complete
