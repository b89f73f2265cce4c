"""The upstream simulator, driven through a real loopback socket by the official SDKs."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agentcompact.testing import (
    Fault,
    LatencyModel,
    Reply,
    RunningServer,
    Script,
    ToolCall,
    UpstreamSim,
    digest_reply,
    estimate_tokens,
    filler_text,
    prompt_text,
    serve,
)

pytestmark = pytest.mark.network

USER = [{"role": "user", "content": "what is the weather in Paris?"}]
PARALLEL = Reply.calling(
    ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_time", {"tz": "Europe/Paris"})
)
THOUGHTFUL = Reply("It is sunny.").thinking_first("The user wants weather.", "sig-abc")


@pytest.fixture
def sim() -> UpstreamSim:
    return UpstreamSim()


@pytest.fixture
def server(sim: UpstreamSim) -> Iterator[RunningServer]:
    with serve(sim) as running:
        yield running


@pytest.fixture
def oai(server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-test",
                       max_retries=0) as client:
        yield client


@pytest.fixture
def claude(server: RunningServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.base_url, api_key="sk-ant-test",
                             max_retries=0) as client:
        yield client


def chat(client: openai.OpenAI, **extra: Any) -> Any:
    return client.chat.completions.create(model="gpt-sim", messages=USER, **extra)


# ---------------------------------------------------------------- OpenAI Chat Completions


def test_chat_default_reply_echoes_and_records_the_request(
    oai: openai.OpenAI, server: RunningServer
) -> None:
    completion = chat(oai)
    assert completion.choices[0].message.content == "echo: what is the weather in Paris?"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.completion_tokens == estimate_tokens("echo: " + USER[0]["content"])
    (seen,) = server.requests
    assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
    assert seen.headers["authorization"] == "Bearer sk-test"
    assert seen.body["messages"] == USER


def test_chat_streaming_text_with_usage_chunk(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script.push(Reply("streamed answer, in pieces"))
    stream = chat(oai, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed answer, in pieces"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7


def test_chat_parallel_tool_calls(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script.push(PARALLEL)
    message = chat(oai).choices[0].message
    assert message.content is None
    calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
    assert calls == [("call_sim0001_0", "get_weather", {"city": "Paris"}),
                     ("call_sim0001_1", "get_time", {"tz": "Europe/Paris"})]


def test_chat_streamed_tool_calls_accumulate(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script.push(Reply.calling(*PARALLEL.tool_calls, text="Checking."))
    with oai.chat.completions.stream(model="gpt-sim", messages=USER) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    assert [c.function.arguments for c in choice.message.tool_calls] == [
        '{"city":"Paris"}', '{"tz":"Europe/Paris"}'
    ]


def test_chat_logprobs_cover_every_content_token(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script.push(Reply("twelve chars"), Reply("twelve chars"))
    logprobs = chat(oai, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    assert "".join(t.token for t in logprobs) == "twelve chars" and len(logprobs) == 3
    assert all(len(t.top_logprobs) == 2 and t.logprob < 0 for t in logprobs)
    streamed = [c.choices[0].logprobs for c in chat(oai, stream=True, logprobs=True)]
    assert [t.token for lp in streamed if lp for t in lp.content] == ["twel", "ve c", "hars"]


def test_max_tokens_cuts_the_reply(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script.push(Reply.filler(100))
    choice = chat(oai, max_tokens=10).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content == filler_text(100)[:40]


# ---------------------------------------------------------------- OpenAI Responses


def test_responses_text_reasoning_and_function_call(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script.push(Reply.tool("get_weather", {"city": "Paris"}, text="Let me check.")
                    .thinking_first("need weather", "enc-123"))
    response = oai.responses.create(model="gpt-sim", input="weather?")
    reasoning, message, call = response.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content == "enc-123"
    assert message.type == "message" and response.output_text == "Let me check."
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    assert response.status == "completed"
    assert response.usage.output_tokens_details.reasoning_tokens == 3


def test_responses_streaming_event_sequence(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script.push(Reply.tool("get_weather", {"city": "Paris"}, text="Checking."))
    events = list(oai.responses.create(model="gpt-sim", input="hi", stream=True))
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.output_text.delta",
                 "response.function_call_arguments.delta", "response.output_item.done"):
        assert kind in types
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_stream_helper_accumulates(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script.push(PARALLEL.thinking_first("two tools"))
    with oai.responses.stream(model="gpt-sim", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == '{"city":"Paris"}{"tz":"Europe/Paris"}'
    assert [item.type for item in final.output] == ["reasoning", "function_call", "function_call"]


def test_responses_stream_has_event_lines(server: RunningServer) -> None:
    body = {"model": "gpt-sim", "input": "hi", "stream": True}
    raw = httpx.post(f"{server.base_url}/v1/responses", json=body).text
    assert raw.startswith("event: response.created\ndata: {")


def test_responses_compact_and_models(oai: openai.OpenAI) -> None:
    compacted = oai.responses.compact(model="gpt-5", input="a long history")
    assert compacted.output[0].type == "compaction"
    assert [m.id for m in oai.models.list().data] == ["sim-model"]


# ---------------------------------------------------------------- Anthropic Messages


def messages(client: anthropic.Anthropic, **extra: Any) -> Any:
    return client.messages.create(model="claude-sim", max_tokens=1024, messages=USER, **extra)


def test_messages_text_thinking_and_tool_use(sim: UpstreamSim, claude: anthropic.Anthropic,
                                             server: RunningServer) -> None:
    sim.script.push(Reply.tool("get_weather", {"city": "Paris"}).thinking_first("hmm", "sig-1"))
    message = messages(claude)
    thinking, tool_use = message.content
    assert (thinking.type, thinking.thinking, thinking.signature) == ("thinking", "hmm", "sig-1")
    assert (tool_use.type, tool_use.name, tool_use.input) == ("tool_use", "get_weather",
                                                              {"city": "Paris"})
    assert message.stop_reason == "tool_use"
    headers = server.requests[0].headers  # SDK versions differ: x-api-key or a Bearer token
    assert "sk-ant-test" in headers.get("x-api-key", headers.get("authorization", ""))


def test_messages_stream_accumulates_every_block(sim: UpstreamSim,
                                                 claude: anthropic.Anthropic) -> None:
    sim.script.push(Reply.calling(*PARALLEL.tool_calls, text="On it.").thinking_first("plan", "s9"))
    with claude.messages.stream(model="claude-sim", max_tokens=1024, messages=USER) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "message_stop" in kinds
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert final.content[0].signature == "s9" and final.content[1].text == "On it."
    assert final.content[3].input == {"tz": "Europe/Paris"}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 1


def test_messages_raw_event_order(sim: UpstreamSim, claude: anthropic.Anthropic) -> None:
    sim.script.push(THOUGHTFUL)
    events = list(messages(claude, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    deltas = {e.delta.type for e in events if e.type == "content_block_delta"}
    assert deltas == {"thinking_delta", "signature_delta", "text_delta"}
    assert events[-2].delta.stop_reason == "end_turn"


def test_messages_max_tokens_and_count_tokens(sim: UpstreamSim,
                                              claude: anthropic.Anthropic) -> None:
    sim.script.push(Reply.filler(50))
    message = claude.messages.create(model="claude-sim", max_tokens=5, messages=USER)
    assert message.stop_reason == "max_tokens" and message.content[0].text == filler_text(50)[:20]
    count = claude.messages.count_tokens(model="claude-sim", messages=USER)
    assert count.input_tokens == message.usage.input_tokens


# ---------------------------------------------------------------- scripting


def test_responder_computes_the_reply_from_the_request(sim: UpstreamSim,
                                                       oai: openai.OpenAI) -> None:
    sim.script = Script(then=digest_reply)
    text = chat(oai).choices[0].message.content
    assert text == digest_reply({"messages": USER}).text
    assert prompt_text({"messages": USER}) in text


def test_script_steps_then_fallback(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script = Script("first", lambda body: f"saw {len(body['messages'])}", then="rest")
    answers = [chat(oai).choices[0].message.content for _ in range(4)]
    assert answers == ["first", "saw 1", "rest", "rest"]


# ---------------------------------------------------------------- faults


def test_context_length_errors_have_each_providers_shape(
    sim: UpstreamSim, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    sim.script.push(Fault.context_length(8000, 9000), Fault.context_length(200_000, 250_000))
    with pytest.raises(openai.BadRequestError) as oai_error:
        chat(oai)
    assert oai_error.value.code == "context_length_exceeded"
    assert "maximum context length is 8000 tokens" in oai_error.value.message
    with pytest.raises(anthropic.BadRequestError) as claude_error:
        messages(claude)
    assert claude_error.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 250000 tokens > 200000 maximum"}}


def test_context_window_rejects_long_prompts(oai: openai.OpenAI) -> None:
    with serve(UpstreamSim(context_window=10)) as small:
        client = oai.with_options(base_url=f"{small.base_url}/v1")
        with pytest.raises(openai.BadRequestError, match="context length"):
            chat(client)


@pytest.mark.parametrize("status", [500, 503, 529])
def test_server_errors_raise_api_status_error(sim: UpstreamSim, oai: openai.OpenAI,
                                              claude: anthropic.Anthropic, status: int) -> None:
    sim.script.push(Fault.http(status), Fault.http(status))
    with pytest.raises(openai.APIStatusError) as oai_error:
        chat(oai)
    with pytest.raises(anthropic.APIStatusError) as claude_error:
        messages(claude)
    assert oai_error.value.status_code == claude_error.value.status_code == status


def test_fault_header_applies_to_one_request(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError):
        chat(oai, extra_headers={"x-sim-fault": "status=429"})
    assert chat(oai).choices[0].message.content.startswith("echo:")
    with pytest.raises(openai.BadRequestError, match="bad x-sim-fault header"):
        chat(oai, extra_headers={"x-sim-fault": "explode=1"})


def test_dropped_stream_raises_in_the_client(sim: UpstreamSim, oai: openai.OpenAI,
                                             claude: anthropic.Anthropic) -> None:
    sim.script.push(Reply.filler(40).failing(Fault.drop(5)), Fault.drop(3))
    # the SDKs ride different httpx majors: openai raises the transport's own error,
    # anthropic (2.17 on, over httpx2) its APIConnectionError caused by the transport's
    with pytest.raises(Exception, match="incomplete chunked read") as oai_error:
        list(chat(oai, stream=True))
    with pytest.raises(Exception, match="incomplete chunked read") as claude_error:
        list(messages(claude, stream=True))
    assert "RemoteProtocolError" in _chain_names(oai_error.value)
    assert "RemoteProtocolError" in _chain_names(claude_error.value)
    if not isinstance(claude_error.value, anthropic.APIConnectionError):
        assert "RemoteProtocolError" in type(claude_error.value).__name__


def _chain_names(exc: BaseException | None) -> list[str]:
    """The class names of ``exc`` and of the exceptions it was raised from, in order."""
    names = []
    while exc is not None:
        names.append(type(exc).__name__)
        exc = exc.__cause__
    return names


def test_delay_and_hang_hit_client_timeouts(sim: UpstreamSim, oai: openai.OpenAI) -> None:
    sim.script.push(Fault.delay(0.3), Fault.hang(30))
    started = time.monotonic()
    assert chat(oai).choices[0].message.content.startswith("echo:")
    assert time.monotonic() - started >= 0.3
    with pytest.raises(openai.APITimeoutError):
        chat(oai.with_options(timeout=0.3))


# ---------------------------------------------------------------- latency and runner


async def test_concurrent_requests_overlap() -> None:
    latency = LatencyModel(ttft_s=0.05, decode_tokens_per_s=100)
    sim = UpstreamSim(Script(then=Reply.filler(30)), latency=latency)
    async with serve(sim) as running:
        async with openai.AsyncOpenAI(base_url=f"{running.base_url}/v1", api_key="k",
                                      max_retries=0) as client:
            async def one() -> None:
                await client.chat.completions.create(model="m", messages=USER)

            started = time.monotonic()
            await one()
            single = time.monotonic() - started
            started = time.monotonic()
            await asyncio.gather(*(one() for _ in range(4)))
            together = time.monotonic() - started
    assert single >= 0.35  # 0.05 s to first token + 30 tokens at 100/s
    assert together < 2 * single


async def test_concurrency_limit_queues_requests() -> None:
    latency = LatencyModel(decode_tokens_per_s=100, max_concurrency=1)
    sim = UpstreamSim(Script(then=Reply.filler(20)), latency=latency)
    async with serve(sim) as running, httpx.AsyncClient(
        base_url=running.base_url, timeout=30
    ) as client:
        body = {"model": "m", "messages": USER, "stream": True}
        started = time.monotonic()
        await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(3)))
        assert time.monotonic() - started >= 3 * 0.2


def test_streams_are_paced_at_the_decode_rate() -> None:
    sim = UpstreamSim(Script(then=Reply.filler(20)), latency=LatencyModel(decode_tokens_per_s=50))
    with serve(sim) as running:
        started = time.monotonic()
        with httpx.stream("POST", f"{running.base_url}/v1/messages",
                          json={"model": "c", "max_tokens": 100, "messages": USER,
                                "stream": True}) as response:
            arrivals = [time.monotonic() - started for _ in response.iter_lines()]
    assert arrivals[-1] >= 20 / 50


def test_server_stops_cleanly_and_serves_plain_apps() -> None:
    before = set(threading.enumerate())
    running = serve(UpstreamSim().app).start()
    assert running.base_url.startswith("http://127.0.0.1:") and running.port > 0
    assert httpx.get(f"{running.base_url}/v1/models").json()["data"][0]["id"] == "sim-model"
    assert len(running.requests) == 1
    running.stop()
    running.stop()
    assert set(threading.enumerate()) <= before


DOCS = Path(__file__).resolve().parents[2] / "docs" / "upstream-sim.md"


@pytest.mark.skipif(not DOCS.exists(), reason="docs absent from this checkout")
def test_docs_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)
    assert len(blocks) == 3
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), {})


# ------------------------------------------------ what the real coding CLIs need (issue 13)


def test_an_unknown_route_is_recorded_and_answered_404(server: RunningServer,
                                                       sim: UpstreamSim) -> None:
    response = httpx.head(f"{server.base_url}/v1/unheard/of?x=1")
    assert response.status_code == 404
    response = httpx.post(f"{server.base_url}/api/event_logging", json={"e": 1})
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    assert [(r.method, r.path) for r in sim.requests] == [
        ("HEAD", "/v1/unheard/of"), ("POST", "/api/event_logging")]


def test_a_custom_tool_call_streams_as_codex_reads_it(server: RunningServer) -> None:
    from agentcompact.testing import ToolCall

    sim = server.sim
    assert sim is not None
    sim.script.push(Reply.calling(ToolCall("exec", "text(await tools.x())", custom=True)))
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json={
            "model": "m", "stream": True, "input": [{"role": "user", "content": "go"}]}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert "response.custom_tool_call_input.delta" in kinds
    done = next(e for e in events if e["type"] == "response.output_item.done")
    assert done["item"]["type"] == "custom_tool_call"
    assert done["item"]["input"] == "text(await tools.x())"
    assert done["item"]["call_id"].startswith("call_")
    pieces = "".join(e["delta"] for e in events
                     if e["type"] == "response.custom_tool_call_input.delta")
    assert pieces == "text(await tools.x())"


def test_max_recorded_keeps_the_latest_requests_and_counts_all() -> None:
    sim = UpstreamSim(max_recorded=2)
    with serve(sim) as running:
        for i in range(4):
            httpx.post(f"{running.base_url}/v1/chat/completions",
                       json={"model": "m", "messages": [{"role": "user", "content": str(i)}]})
        answer = httpx.post(f"{running.base_url}/v1/chat/completions",
                            json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert [r.body["messages"][0]["content"] for r in sim.requests] == ["3", "x"]
    assert answer.headers["request-id"] == "req_sim000005"
