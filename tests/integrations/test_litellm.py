"""The LiteLLM callback on the SDK path, with the real ``litellm`` package against the
upstream simulator: ``acompletion``, ``Router`` and the wrapped synchronous ``completion``
run a 30-step tool loop under a small trigger; every request sent is within the trigger,
valid, and byte-stable between compactions. (The real proxy process: test_litellm_proxy.py.)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

from agentcompact import Budget

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
litellm = pytest.importorskip("litellm")

from agentcompact import ConfigError  # noqa: E402
from agentcompact.integrations.litellm import CompactionCallback  # noqa: E402
from agentcompact.testing import RunningServer, Script, UpstreamSim, serve  # noqa: E402

from .conftest import sent_tokens  # noqa: E402
from .hosts_loop import DONE, check_requests, prefix_changes, step_output, tool_loop  # noqa: E402

pytestmark = pytest.mark.network

TRIGGER = 3000
STEPS = 30
SYSTEM = "You are a careful engineer. " * 150  # ~900 tokens of fixed prompt
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serve(UpstreamSim(Script(then=tool_loop(STEPS)))) as running:
        yield running


@pytest.fixture
def callback(pm: Any) -> Iterator[CompactionCallback]:
    cb = CompactionCallback(budget=Budget(trigger_tokens=TRIGGER), plugins=pm)
    saved = list(litellm.callbacks)
    litellm.callbacks = [cb]
    yield cb
    litellm.callbacks = saved


def _next_messages(messages: list[dict[str, Any]], reply: Any) -> list[dict[str, Any]]:
    message = reply.choices[0].message
    calls = message.tool_calls or []
    assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
    if calls:
        assistant["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in calls]
    results = [{"role": "tool", "tool_call_id": c.id,
                "content": step_output(c.function.arguments, 700)} for c in calls]
    return [*messages, assistant, *results]


async def _run_async(call: Any, **kwargs: Any) -> str:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": "Read every step file."}]
    for _ in range(STEPS + 1):
        reply = await call(messages=messages, tools=TOOLS, **kwargs)
        if not reply.choices[0].message.tool_calls:
            return str(reply.choices[0].message.content)
        messages = _next_messages(messages, reply)
    raise AssertionError("the loop did not finish")


def _check(server: RunningServer, collector: Any = None) -> None:
    bodies = [r.body for r in server.requests if r.path == "/v1/chat/completions"]
    assert len(bodies) == STEPS + 1
    assert max(sent_tokens(b) for b in bodies) <= TRIGGER
    check_requests(bodies, "openai_chat")
    compactions = sum(1 for b in bodies if any(
        "[agentcompact" in str(m.get("content")) for m in b["messages"]))
    assert compactions > 0
    # between compactions the request only grows: the cached prefix is byte-identical
    assert prefix_changes(bodies) <= compactions


def test_acompletion_tool_loop_stays_within_trigger(server: RunningServer,
                                                     callback: CompactionCallback,
                                                     collector: Any) -> None:
    base = f"{server.base_url}/v1"
    answer = asyncio.run(_run_async(litellm.acompletion, model="openai/sim-model",
                                    api_base=base, api_key="sk-test"))
    assert answer == DONE
    _check(server)
    assert callback.last_result is not None
    assert collector.events, "no compaction event reached the plugin manager"
    # every call is logged with the messages the provider received (LiteLLM leaves out
    # the null fields of what it is given)
    sent = [r.body["messages"] for r in server.requests]
    logged = [[{k: v for k, v in m.items() if v is not None} for m in c.messages]
              for c in collector.calls]
    assert logged == sent
    assert any(c.compacted for c in collector.calls)


def test_router_acompletion(server: RunningServer, callback: CompactionCallback) -> None:
    router = litellm.Router(model_list=[{"model_name": "agent", "litellm_params": {
        "model": "openai/sim-model", "api_base": f"{server.base_url}/v1",
        "api_key": "sk-test"}}])
    assert asyncio.run(_run_async(router.acompletion, model="agent")) == DONE
    _check(server)


def test_wrapped_sync_completion(server: RunningServer, callback: CompactionCallback) -> None:
    completion = callback.wrap(litellm.completion)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": "Read every step file."}]
    for _ in range(STEPS + 1):
        reply = completion("openai/sim-model", messages, tools=TOOLS,
                           api_base=f"{server.base_url}/v1", api_key="sk-test")
        if not reply.choices[0].message.tool_calls:
            break
        messages = _next_messages(messages, reply)
    assert reply.choices[0].message.content == DONE
    _check(server)


def test_conversations_get_their_own_engines(callback: CompactionCallback) -> None:
    chat = callback.conversations("openai_chat")
    a = [{"role": "system", "content": "s"}, {"role": "user", "content": "task A"}]
    b = [{"role": "system", "content": "s"}, {"role": "user", "content": "task B"}]
    asyncio.run(callback.async_pre_call_deployment_hook(
        {"model": "m", "messages": a}, "acompletion"))
    asyncio.run(callback.async_pre_call_deployment_hook(
        {"model": "m", "messages": [*a, {"role": "assistant", "content": "x"}]}, "acompletion"))
    assert len(chat) == 1
    asyncio.run(callback.async_pre_call_deployment_hook(
        {"model": "m", "messages": b}, "acompletion"))
    assert len(chat) == 2


def test_other_call_types_and_chained_responses_pass_through(
        callback: CompactionCallback) -> None:
    hook = callback.async_pre_call_deployment_hook
    assert asyncio.run(hook({"model": "m", "input": ["a text"]}, "aembedding")) is None
    assert asyncio.run(hook({"model": "m", "input": [{"role": "user", "content": "x"}],
                             "previous_response_id": "resp_1"}, "aresponses")) is None
    assert asyncio.run(hook({"model": "m", "input": "a string"}, "aresponses")) is None


def test_options_are_checked_when_built() -> None:
    with pytest.raises(ConfigError, match="trigger_tokens"):
        CompactionCallback()
    with pytest.raises(ConfigError, match="unknown option"):
        CompactionCallback(budget=Budget(trigger_tokens=1000), trigger=5)
    with pytest.raises(ConfigError, match="record"):
        CompactionCallback(budget=Budget(trigger_tokens=1000), record="yes")  # type: ignore[arg-type]


def test_callback_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentcompact.integrations.litellm as module

    monkeypatch.setattr(module, "_callback", None)
    monkeypatch.setenv("AGENTCOMPACT_TRIGGER", "12345")
    assert module.callback.conversations("openai_chat").template.budget.trigger_tokens == 12345
    monkeypatch.setattr(module, "_callback", None)
    monkeypatch.setenv("AGENTCOMPACT_TRIGGER", "lots")
    with pytest.raises(ConfigError, match="AGENTCOMPACT_TRIGGER"):
        module.callback  # noqa: B018
