"""--record, --debug-dir, the status page and per-request log lines."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from agentcompact import Budget
from agentcompact.testing import Reply, ToolCall
from tests.conftest import QWEN_TOKENIZER, needs_shared_data

from .conftest import ProxyFactory, Upstream
from .histories import anthropic_history, chat_history, responses_history

pytestmark = pytest.mark.network

MODEL = "sim-model"
CLAUDE_USER_ID = orjson.dumps({"device_id": "dev-1", "account_uuid": "acct-secret",
                               "session_id": "5f0c-claude-session"}).decode()

#: credential headers of common gateways (Cloudflare AI Gateway, Helicone, Azure APIM…)
GATEWAY_HEADERS = {"cf-aig-authorization": "Bearer cf-gateway-secret",
                   "helicone-auth": "Bearer helicone-secret",
                   "ocp-apim-subscription-key": "apim-secret",
                   "x-api-token": "token-secret", "x-portkey-api-key": "portkey-secret",
                   "x-trace-id": "trace-1"}


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines]


def test_record_anthropic_stream_reassembled(start_proxy: ProxyFactory, upstream: Upstream,
                                             tmp_path: Path) -> None:
    proxy = start_proxy(record=str(tmp_path / "run"), budget=Budget(3000), counter="chars")
    upstream.sim.script.push(
        Reply.calling(ToolCall("read_file", {"path": "a.py"}), ToolCall("ls", {}), text="Go.")
        .thinking_first("plan it", "sig-rec"))
    with anthropic.Anthropic(base_url=proxy.base_url, api_key="k", max_retries=0) as client:
        with client.messages.stream(model=MODEL, max_tokens=256, messages=anthropic_history(20),
                                    metadata={"user_id": CLAUDE_USER_ID}) as stream:
            final = stream.get_final_message()
    proxy.stop()  # closes the recorder
    events = read_events(tmp_path / "run")
    calls = [e["data"] for e in events if e["kind"] == "model_call"]
    compactions = [e["data"] for e in events if e["kind"] == "compaction"]
    (call,) = calls
    assert call["messages"] == upstream.requests[-1].body["messages"]
    assert call["compacted"] and compactions
    assert {c["episode_id"] for c in compactions} == {call["episode_id"]}
    (response,) = call["response"]
    assert response["content"] == [b.model_dump(exclude_none=True) for b in final.content]
    assert response["content"][0]["signature"] == "sig-rec"
    assert call["usage"]["output_tokens"] == final.usage.output_tokens
    # the account and device ids inside Claude Code's user_id go; its session id stays
    assert orjson.loads(call["request"]["metadata"]["user_id"]) == {
        "device_id": "[redacted]", "account_uuid": "[redacted]",
        "session_id": "5f0c-claude-session"}
    text = (tmp_path / "run" / "events.jsonl").read_text()
    assert "dev-1" not in text and "acct-secret" not in text
    assert "messages" not in call["request"]


def test_record_chat_and_responses_streams(start_proxy: ProxyFactory, upstream: Upstream,
                                           tmp_path: Path) -> None:
    proxy = start_proxy(record=str(tmp_path / "run"), budget=Budget(3000), counter="chars")
    upstream.sim.script.push(Reply.calling(ToolCall("a", {"x": 1}), ToolCall("b", {}), text="T"),
                             Reply.tool("shell", {"cmd": "ls"}).thinking_first("r", "enc-9"))
    with openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key="k", max_retries=0) as client:
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=chat_history(3), stream=True,
            stream_options={"include_usage": True}))
        events = list(client.responses.create(model=MODEL, input=responses_history(3),
                                              stream=True))
    proxy.stop()
    chat, resp = (e["data"] for e in read_events(tmp_path / "run") if e["kind"] == "model_call")
    (message,) = chat["response"]
    assert message["content"] == "T"
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"])
            for c in message["tool_calls"]] == [
        ("call_sim0001_0", "a", '{"x":1}'), ("call_sim0001_1", "b", "{}")]
    assert chat["usage"] == chunks[-1].usage.model_dump(exclude_none=True) | chat["usage"]
    final = events[-1].response
    assert resp["response"] == [item.model_dump(exclude_none=True) for item in final.output] \
        or [i["type"] for i in resp["response"]] == [i.type for i in final.output]
    assert resp["response"][0]["encrypted_content"] == "enc-9"
    assert resp["usage"]["output_tokens"] == final.usage.output_tokens


def test_debug_dir_is_private_and_redacted(start_proxy: ProxyFactory, upstream: Upstream,
                                           tmp_path: Path) -> None:
    debug = tmp_path / "debug"
    proxy = start_proxy(debug_dir=str(debug), budget=Budget(3000), counter="chars")
    body = {"model": MODEL, "max_tokens": 64, "messages": anthropic_history(20),
            "metadata": {"user_id": CLAUDE_USER_ID, "api_key": "sk-in-body-secret"}}
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:
        response = client.post("/v1/messages", json=body, headers={
            "x-api-key": "sk-ant-secret-key", "authorization": "Bearer oauth-secret-token",
            "cookie": "session=cookie-secret", **GATEWAY_HEADERS})
    assert response.status_code == 200
    assert stat.S_IMODE(debug.stat().st_mode) == 0o700
    files = sorted(debug.iterdir())
    assert [f.name.rsplit("-", 1)[1] for f in files] == ["in.json", "out.json"]
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        text = f.read_text()
        for secret in ("sk-ant-secret-key", "oauth-secret-token", "cookie-secret",
                       "sk-in-body-secret", "dev-1", "acct-secret",
                       *(v for k, v in GATEWAY_HEADERS.items() if k != "x-trace-id")):
            assert secret not in text
    dumped_in, dumped_out = (orjson.loads(f.read_bytes()) for f in files)
    assert len(dumped_in["body"]["messages"]) == len(body["messages"])
    assert len(dumped_out["body"]["messages"]) == len(upstream.requests[-1].body["messages"])
    assert dumped_in["body"]["max_tokens"] == 64  # not mistaken for a credential
    assert orjson.loads(dumped_in["body"]["metadata"]["user_id"])["session_id"] == \
        "5f0c-claude-session"
    assert dumped_in["headers"]["x-trace-id"] == "trace-1"  # not a credential
    assert os.stat(files[0]).st_uid == os.getuid()


def test_status_and_request_log(start_proxy: ProxyFactory, upstream: Upstream,
                                caplog: pytest.LogCaptureFixture) -> None:
    proxy = start_proxy(budget=Budget(3000), counter="chars", log_requests=True)
    with caplog.at_level(logging.INFO, logger="agentcompact.proxy"), \
            anthropic.Anthropic(base_url=proxy.base_url, api_key="sk-ant-never-logged",
                                max_retries=0) as client:
        for turns in (20, 21):
            client.messages.create(model=MODEL, max_tokens=64, messages=anthropic_history(turns),
                                   metadata={"user_id": CLAUDE_USER_ID})
        client.messages.create(model=MODEL, max_tokens=64, messages=anthropic_history(2))
    status = httpx.get(f"{proxy.base_url}/agentcompact/status").json()
    assert status["requests"] == status["handled"] == 3
    assert status["compactions"] >= 1 and status["tokens_saved"] > 0
    assert status["uptime_s"] > 0 and status["strategy"] == "cliff"
    assert len(status["sessions"]) == 2
    claude_session = max(status["sessions"].values(), key=lambda s: s["requests"])
    assert claude_session["requests"] == 2 and claude_session["dialect"] == "anthropic"
    lines = [orjson.loads(r.getMessage()) for r in caplog.records
             if r.getMessage().startswith("{")]
    assert len(lines) == 3
    assert {"session", "tokens_in", "tokens_out", "compacted", "strategy",
            "added_ms"} <= set(lines[0])
    assert lines[0]["compacted"] and lines[0]["tokens_out"] < lines[0]["tokens_in"]
    assert lines[0]["session"] == lines[1]["session"] != lines[2]["session"]
    assert "sk-ant-never-logged" not in caplog.text and "acct-secret" not in caplog.text



@needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")
@pytest.mark.parametrize("stream", [False, True])
def test_record_keeps_the_servers_token_ids_and_logprobs(tmp_path: Path, stream: bool) -> None:
    """--record keeps what a vLLM-style server reports of its sampled tokens (prompt ids,
    response ids, logprobs), plain and streamed — the rows RL export trains on."""
    transformers = pytest.importorskip("transformers")
    from agentcompact.integrations.proxy import ProxyConfig, ThreadedServer, create_app
    from agentcompact.testing import Script, UpstreamSim, serve

    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    sim = UpstreamSim(Script(Reply("Done: the tests pass.")), tokenizer=hf)
    with serve(sim) as upstream:
        config = ProxyConfig(openai_upstream=upstream.base_url,
                             anthropic_upstream=upstream.base_url, log_requests=False,
                             record=str(tmp_path / "run"), store="memory")
        server = ThreadedServer(create_app(config)).start()
        try:
            with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="k",
                               max_retries=0) as client:
                kw: dict[str, Any] = {"model": MODEL, "logprobs": True,
                                      "messages": [{"role": "user", "content": "run the tests"}],
                                      "extra_body": {"return_token_ids": True}}
                if stream:
                    chunks = [c.model_dump() for c in client.chat.completions.create(
                        stream=True, **kw)]
                    ids = [i for c in chunks if c["choices"]
                           for i in c["choices"][0].get("token_ids") or []]
                    prompt_ids = chunks[0]["prompt_token_ids"]
                else:
                    plain = client.chat.completions.create(**kw).model_dump()
                    ids, prompt_ids = plain["choices"][0]["token_ids"], plain["prompt_token_ids"]
        finally:
            server.stop()
    (call,) = (e["data"] for e in read_events(tmp_path / "run") if e["kind"] == "model_call")
    assert ids and call["response_token_ids"] == ids
    assert prompt_ids and call["prompt_token_ids"] == prompt_ids
    assert len(call["response_logprobs"]) == len(ids)
    assert all(lp < 0 for lp in call["response_logprobs"])
    assert hf.decode(ids).startswith("Done: the tests pass.")
