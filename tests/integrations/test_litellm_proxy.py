"""The real LiteLLM proxy server, started from a ``config.yaml`` naming the agentcompact
callback, between real clients and the upstream simulator: the OpenAI SDK (chat
completions and Responses), the Anthropic SDK (``/v1/messages``) and mini-swe-agent's
``LitellmModel`` run tool loops through it, and every request reaching the provider is
valid and within the trigger.

It needs the proxy's own dependencies (``pip install "litellm[proxy]"``), which cannot be
installed beside every other extra (see tox.ini, env ``litellm-proxy``); without them it
skips. ``AGENTCOMPACT_LITELLM_PROXY`` may name a ``litellm`` executable installed elsewhere.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentcompact.testing import RunningServer, Script, UpstreamSim, serve

from .conftest import sent_tokens
from .hosts_loop import DONE, check_requests, step_output, tool_loop

pytestmark = [pytest.mark.network, pytest.mark.slow]

TRIGGER = 3000
STEPS = 24
KEY = "sk-agentcompact-test-" + "0123456789abcdef" * 2
SYSTEM = "You are a careful engineer. " * 150
#: a body converted by LiteLLM into another wire shape (Anthropic or Responses in, chat
#: completions out) is counted in the shape the provider received, not the one compacted
CONVERSION_SLACK = 1.10


def _proxy_executable() -> str | None:
    given = os.environ.get("AGENTCOMPACT_LITELLM_PROXY")
    if given:
        return given
    runtime = ("backoff", "apscheduler", "litellm_enterprise", "fastapi")
    if any(importlib.util.find_spec(name) is None for name in runtime):
        return None
    return shutil.which("litellm", path=str(Path(sys.executable).parent))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningServer]:
    with serve(UpstreamSim(Script(then=tool_loop(STEPS)))) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(upstream: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = _proxy_executable()
    if exe is None:
        pytest.skip("the LiteLLM proxy's dependencies are not installed "
                    "(pip install 'litellm[proxy]'; tox -e litellm-proxy)")
    home = tmp_path_factory.mktemp("litellm-proxy")
    config = home / "config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: sim\n"
        "    litellm_params:\n"
        "      model: openai/sim-model\n"
        f"      api_base: {upstream.base_url}/v1\n"
        "      api_key: sk-upstream\n"
        "litellm_settings:\n"
        "  callbacks: agentcompact.integrations.litellm.callback\n"
        "general_settings:\n"
        f"  master_key: {KEY}\n")
    port = _free_port()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "TIKTOKEN_CACHE_DIR": os.environ.get("TIKTOKEN_CACHE_DIR", ""),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "AGENTCOMPACT_TRIGGER": str(TRIGGER),
           "NO_PROXY": "*"}
    log = (home / "proxy.log").open("wb")
    process = subprocess.Popen([exe, "--config", str(config), "--host", "127.0.0.1",
                                "--port", str(port)], env=env, cwd=home, stdout=log,
                               stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, process, home / "proxy.log")
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_ready(base: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"the LiteLLM proxy exited with {process.returncode}:\n{tail}")
        try:
            if httpx.get(f"{base}/health/liveliness", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail("the LiteLLM proxy did not start within 180 s")


_PATHS = {"/v1/chat/completions": ("openai_chat", "messages"),
          "/v1/responses": ("openai_responses", "input")}


def _check(upstream: RunningServer, since: int, limit: float) -> int:
    """Checks what reached the provider since request ``since``; returns how many did."""
    found = [(r.body, *_PATHS[r.path]) for r in upstream.requests[since:] if r.path in _PATHS]
    assert found, "no request reached the provider"
    assert len({dialect for _, dialect, _ in found}) == 1
    dialect, key = found[0][1], found[0][2]
    bodies = [body for body, _, _ in found]
    check_requests(bodies, dialect)
    assert max(sent_tokens(b, dialect) for b in bodies) <= limit
    assert any("[agentcompact" in str(m) for b in bodies for m in b[key]), (
        "no compaction reached the provider")
    return len(bodies)


def test_openai_chat_through_the_proxy(proxy: str, upstream: RunningServer) -> None:
    import openai

    since = len(upstream.requests)
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key=KEY, max_retries=0)
    tools = [{"type": "function", "function": {
        "name": "read_file", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    messages: list[Any] = [{"role": "system", "content": SYSTEM},
                           {"role": "user", "content": "Read every step file."}]
    for _ in range(STEPS + 1):
        reply = client.chat.completions.create(model="sim", messages=messages,
                                               tools=tools)  # type: ignore[arg-type]
        message = reply.choices[0].message
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id,
                      "content": step_output(c.function.arguments, 700)}
                     for c in message.tool_calls]  # type: ignore[union-attr]
    assert message.content == DONE
    _check(upstream, since, TRIGGER)


def test_anthropic_messages_through_the_proxy(proxy: str, upstream: RunningServer) -> None:
    import anthropic

    since = len(upstream.requests)
    client = anthropic.Anthropic(base_url=proxy, api_key=KEY, max_retries=0)
    tools = [{"name": "read_file", "description": "Read a file.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    messages: list[Any] = [{"role": "user", "content": "Read every step file."}]
    for _ in range(STEPS + 1):
        reply = client.messages.create(model="sim", max_tokens=512, system=SYSTEM,
                                       messages=messages, tools=tools)  # type: ignore[arg-type]
        calls = [b for b in reply.content if b.type == "tool_use"]
        if not calls:
            break
        messages.append({"role": "assistant",
                         "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id,
             "content": step_output(str(b.input), 700)} for b in calls]})
    assert reply.content[0].type == "text" and reply.content[0].text == DONE
    _check(upstream, since, TRIGGER * CONVERSION_SLACK)


def test_mini_swe_agent_through_the_proxy(proxy: str, upstream: RunningServer,
                                          tmp_path: Path) -> None:
    """mini-swe-agent's own agent and ``LitellmModel`` (the LiteLLM SDK) pointed at the
    gateway by configuration: nothing in the agent knows about agentcompact."""
    if importlib.util.find_spec("minisweagent") is None:  # importing it writes to ~/.config
        pytest.skip("mini-swe-agent is not installed")
    for i in range(1, STEPS + 1):
        (tmp_path / f"step_{i}.txt").write_text(step_output(f"step_{i}", 700))
    script = tmp_path / "run_mini.py"
    script.write_text(_MINI_SCRIPT)
    since = len(upstream.requests)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
           "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea"), "MSWEA_SILENT_STARTUP": "1",
           "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "PROXY_URL": f"{proxy}/v1", "PROXY_KEY": KEY, "NO_PROXY": "*"}
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("exit_status=Submitted")
    assert _check(upstream, since, TRIGGER) == STEPS + 1


_MINI_SCRIPT = '''
import os
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

model = LitellmModel(model_name="openai/sim", cost_tracking="ignore_errors",
                     model_kwargs={"api_base": os.environ["PROXY_URL"],
                                   "api_key": os.environ["PROXY_KEY"]})
agent = DefaultAgent(model, LocalEnvironment(cwd=os.getcwd()),
                     system_template="You are a careful engineer. " * 150,
                     instance_template="Read every step file: {{task}}", step_limit=60)
result = agent.run("step_1.txt onwards")
print("exit_status=" + str(result.get("exit_status")))
'''
