"""``python -m agentcompact.testing --script tool-loop``: the simulated model calls the tool
each request offers, reading its step from the request (never a counter), over all three
wire protocols through the official SDKs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agentcompact.testing import (
    RunningServer,
    ToolLoopModel,
    UpstreamSim,
    serve,
    tool_loop_script,
)

pytestmark = pytest.mark.network

STEPS = 3
CHAT_TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "lines": {"type": "integer"},
        "mode": {"type": "string", "enum": ["head", "tail"]}}, "required": ["path"]}}}]


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serve(UpstreamSim(tool_loop_script(STEPS))) as running:
        yield running


def _chat_loop(client: openai.OpenAI, messages: list[Any]) -> list[Any]:
    """Run the loop to its final answer; returns the tool calls made."""
    calls = []
    while True:
        message = client.chat.completions.create(model="m", messages=messages,
                                                 tools=CHAT_TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            assert message.content == f"Done: {STEPS} tool calls made."
            return calls
        for call in message.tool_calls:
            calls.append(call)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "x" * 400})


def test_chat_loop_calls_the_offered_tool_steps_times_per_user_message(
        server: RunningServer) -> None:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="k", max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": "go"}]
        first = _chat_loop(client, messages)
        messages.append({"role": "user", "content": "again"})
        second = _chat_loop(client, messages)
    assert len(first) == len(second) == STEPS
    arguments = [json.loads(c.function.arguments) for c in first]
    assert arguments == [{"path": f"src/module_{k}.py", "lines": k + 1,
                          "mode": ["head", "tail"][k % 2]} for k in range(STEPS)]
    ids = [c.id for c in first + second]
    assert len(set(ids)) == len(ids), "call ids repeat across turns"


def test_the_step_survives_a_shortened_history(server: RunningServer) -> None:
    """A compaction drops older calls: the newest tool result's id still names its step."""
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="k", max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": "go"}]
        answer = client.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
        call = answer.choices[0].message.tool_calls[0]
        messages += [answer.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "x"}]
        second = client.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
        call = second.choices[0].message.tool_calls[0]
        shortened = [{"role": "user", "content": "[agentcompact: earlier turns compacted]"},
                     second.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "x"}]
        third = client.chat.completions.create(model="m", messages=shortened, tools=CHAT_TOOLS)
    assert json.loads(third.choices[0].message.tool_calls[0].function.arguments)["path"] \
        == "src/module_2.py"


def test_anthropic_and_responses_loops(server: RunningServer) -> None:
    tool = {"name": "grep", "description": "Search.",
            "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}}}
    with anthropic.Anthropic(base_url=server.base_url, api_key="k", max_retries=0) as client:
        history: list[Any] = [{"role": "user", "content": "go"}]
        for step in range(STEPS + 1):
            reply = client.messages.create(model="m", max_tokens=100, tools=[tool],
                                           messages=history)
            uses = [b for b in reply.content if b.type == "tool_use"]
            if step == STEPS:
                assert not uses and reply.stop_reason == "end_turn"
                break
            assert uses[0].id.startswith("toolu_")
            assert uses[0].input == {"pattern": f"pattern {step}"}
            history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                          for b in reply.content]},
                        {"role": "user", "content": [{"type": "tool_result",
                                                      "tool_use_id": uses[0].id,
                                                      "content": "found"}]}]
    fn = {"type": "function", "name": "ls", "parameters": {"type": "object", "properties": {}}}
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="k", max_retries=0) as client:
        items: list[Any] = [{"role": "user", "content": "go"}]
        for _ in range(STEPS):
            response = client.responses.create(model="m", input=items, tools=[fn])
            call = next(o for o in response.output if o.type == "function_call")
            items += [call.model_dump(exclude_none=True),
                      {"type": "function_call_output", "call_id": call.call_id, "output": "a"}]
        final = client.responses.create(model="m", input=items, tools=[fn])
    assert final.output_text == f"Done: {STEPS} tool calls made."


def test_a_request_without_tools_gets_a_digest_and_ids_unknown_count_results() -> None:
    model = ToolLoopModel(steps=2)
    assert model({"messages": [{"role": "user", "content": "sum up"}]}).text.startswith(
        "SUMMARY sha256=")
    body = {"tools": CHAT_TOOLS, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"id": "x1"}]},
        {"role": "tool", "tool_call_id": "x1", "content": "a"}]}
    assert model(body).tool_calls  # one result, a client's own id: step 1 of 2
    body["messages"] += [{"role": "assistant", "tool_calls": [{"id": "x2"}]},
                         {"role": "tool", "tool_call_id": "x2", "content": "b"}]
    assert not model(body).tool_calls
    with pytest.raises(ValueError, match="at least 1"):
        ToolLoopModel(steps=0)


def _start_cli(*flags: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "agentcompact.testing", *flags],
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert process.stderr is not None
    line = process.stderr.readline()
    found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
    if found is None:
        _stop(process)
        pytest.fail(f"no address announced: {line!r}")
    return process, found.group(1)


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    process.wait(timeout=30)
    if process.stderr is not None:
        process.stderr.close()


def test_the_command_line_serves_the_tool_loop() -> None:
    process, url = _start_cli("--script", "tool-loop", "--steps", "2", "--port", "0")
    try:
        body = {"model": "m", "tools": CHAT_TOOLS,
                "messages": [{"role": "user", "content": "go"}]}
        for _ in range(50):
            try:
                answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10).json()
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] \
            == "read_file"
        busy = subprocess.run([sys.executable, "-m", "agentcompact.testing", "--port",
                               url.rsplit(":", 1)[1]], capture_output=True, text=True,
                              timeout=60)
    finally:
        _stop(process)
    assert busy.returncode == 2
    assert busy.stderr.count("\n") == 1 and "already in use" in busy.stderr
    assert "--port" in busy.stderr and "Traceback" not in busy.stderr
