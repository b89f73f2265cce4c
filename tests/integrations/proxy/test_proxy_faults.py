"""Failure handling: fail-open, relayed errors, dropped streams, disconnects, reactive
retry, shadow and strict modes, probes and passthrough routes."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from agentcompact import (
    Budget,
    CompactionEvent,
    Engine,
    get_dialect,
    hookimpl,
    new_plugin_manager,
    validate,
)
from agentcompact.integrations.proxy import ThreadedServer
from agentcompact.testing import (
    FAULT_HEADER,
    Fault,
    LatencyModel,
    Reply,
    serve,
)

from .conftest import ProxyFactory, Upstream
from .histories import anthropic_history, chat_history, responses_history

pytestmark = pytest.mark.network

MODEL = "sim-model"


def post(proxy: ThreadedServer, path: str, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        return client.post(path, content=content,
                           headers={"content-type": "application/json", **headers})


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def anthropic_body(turns: int = 20, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 256, "messages": anthropic_history(turns), **extra}


# ------------------------------------------------------------------------- fail-open


class Boom:
    name = "boom"

    def compact(self, request: Any) -> Any:
        raise RuntimeError("strategy exploded")


def test_strategy_error_falls_back_and_is_reported(start_proxy: ProxyFactory,
                                                   upstream: Upstream) -> None:
    events: list[CompactionEvent] = []

    class Plugin:
        @hookimpl
        def agentcompact_register_strategies(self, register: Any) -> None:
            register("boom", Boom)

        @hookimpl
        def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
            events.append(event)

    pm = new_plugin_manager()
    pm.register(Plugin())
    proxy = start_proxy(plugins=pm, strategy="boom", budget=Budget(3000), counter="chars")
    response = post(proxy, "/v1/messages", anthropic_body())
    assert response.status_code == 200
    assert events and all("RuntimeError" in (e.error or "") for e in events)
    assert not any("strategy exploded" in (e.error or "") for e in events)  # no content
    assert events[-1].fallback == "cliff"
    sent = upstream.requests[-1].body["messages"]
    validate(sent, get_dialect("anthropic"))


def test_engine_failure_forwards_the_original_bytes(
    proxy: ThreadedServer, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Engine, messages: Any, *, force: bool = False) -> Any:
        raise RuntimeError("engine broke")

    monkeypatch.setattr(Engine, "compact", broken)
    raw = orjson.dumps(anthropic_body()) + b"  "
    response = post(proxy, "/v1/messages", raw)
    assert response.status_code == 200
    assert upstream.tap.sent[-1].request == raw
    assert proxy.proxy.stats.snapshot()["fail_open"] == 1  # type: ignore[attr-defined]


def test_malformed_json_is_forwarded_as_is(proxy: ThreadedServer, upstream: Upstream) -> None:
    raw = b'{"model": "sim-model", "messages": [{"role": "user"'
    response = post(proxy, "/v1/chat/completions", raw)
    sent = upstream.tap.sent[-1]
    assert sent.request == raw
    assert (response.status_code, response.content) == (sent.status, sent.body)
    assert response.status_code == 400


@pytest.mark.parametrize(("path", "status"), [("/v1/messages", 529), ("/v1/messages", 429),
                                              ("/v1/chat/completions", 500),
                                              ("/v1/responses", 503),
                                              ("/v1/chat/completions", 401)])
def test_upstream_errors_are_relayed_unchanged(proxy: ThreadedServer, upstream: Upstream,
                                               path: str, status: int) -> None:
    body = {"/v1/messages": anthropic_body(2),
            "/v1/chat/completions": {"model": MODEL, "messages": chat_history(2)},
            "/v1/responses": {"model": MODEL, "input": responses_history(2)}}[path]
    response = post(proxy, path, body, **{FAULT_HEADER: f"status={status}"})
    sent = upstream.tap.sent[-1]
    assert response.status_code == sent.status == status
    assert response.content == sent.body
    assert response.headers["request-id"].startswith("req_sim")
    assert len(upstream.requests) == 1  # not a context error: no replay


def test_upstream_dropping_a_stream_midway(proxy: ThreadedServer, upstream: Upstream) -> None:
    upstream.sim.script.push(Reply.filler(400))
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        with pytest.raises(httpx.HTTPError), client.stream(
            "POST", "/v1/messages", json=anthropic_body(2, stream=True),
            headers={FAULT_HEADER: "drop_after=5"},
        ) as response:
            assert response.status_code == 200
            b"".join(response.iter_raw())
    stats = proxy.proxy.stats  # type: ignore[attr-defined]
    assert wait_for(lambda: stats.open_streams == 0)
    assert post(proxy, "/v1/messages", anthropic_body(2)).status_code == 200


def test_client_disconnect_closes_the_upstream_stream(proxy: ThreadedServer,
                                                      upstream: Upstream) -> None:
    upstream.sim.latency = LatencyModel(decode_tokens_per_s=50)
    upstream.sim.script.push(Reply.filler(5000))  # ~100 s of streaming
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client, client.stream(
        "POST", "/v1/messages", json=anthropic_body(2, stream=True, max_tokens=8000)
    ) as response:
        first = next(response.iter_raw())
        assert first.startswith(b"event: message_start")
    sent = upstream.tap.sent[-1]
    assert sent.finished.wait(5), "upstream stream still open after the client left"
    assert not sent.completed
    stats = proxy.proxy.stats  # type: ignore[attr-defined]
    assert wait_for(lambda: stats.open_streams == 0)


def test_client_leaving_before_the_answer_cancels_the_upstream_request(
    proxy: ThreadedServer, upstream: Upstream
) -> None:
    body = orjson.dumps(anthropic_body(2))
    head = (f"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"{FAULT_HEADER}: hang=60\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(head + body)
        # the upstream holds the request without answering (not even headers)
        assert wait_for(lambda: len(upstream.tap.sent) == 1 and upstream.requests)
    sent = upstream.tap.sent[-1]
    # the proxy closed its upstream connection: the simulator's hang ends early
    assert sent.finished.wait(10), "upstream request still open after the client left"
    stats = proxy.proxy.stats  # type: ignore[attr-defined]
    assert wait_for(lambda: stats.snapshot()["handled"] == 1)
    assert stats.open_streams == 0


# ------------------------------------------------------------------------- reactive


def test_reactive_retry_on_context_length_error_streaming(proxy: ThreadedServer,
                                                          upstream: Upstream) -> None:
    upstream.sim.script.push(Fault.context_length(limit=2000))
    history = anthropic_history(8)  # under the trigger: only the provider knows it is too long
    with anthropic.Anthropic(base_url=proxy.base_url, api_key="k", max_retries=0) as client:
        with client.messages.stream(model=MODEL, max_tokens=64, messages=history) as stream:
            final = stream.get_final_message()
    assert final.content[0].type == "text"
    first, second = upstream.requests
    assert first.body["messages"] == history
    assert len(second.body["messages"]) < len(history)
    validate(second.body["messages"], get_dialect("anthropic"))
    assert proxy.proxy.stats.snapshot()["reactive_retries"] == 1  # type: ignore[attr-defined]


def test_reactive_retry_openai_chat(proxy: ThreadedServer, upstream: Upstream) -> None:
    upstream.sim.script.push(Fault.context_length(limit=2000))
    with openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key="k", max_retries=0) as client:
        completion = client.chat.completions.create(model=MODEL, messages=chat_history(8))
    assert completion.choices[0].message.content.startswith("echo:")
    assert len(upstream.requests) == 2
    assert len(upstream.requests[1].body["messages"]) < len(chat_history(8))


def test_other_400_is_not_retried(proxy: ThreadedServer, upstream: Upstream) -> None:
    response = post(proxy, "/v1/messages", anthropic_body(8),
                    **{FAULT_HEADER: "status=400,message=invalid tool schema"})
    assert response.status_code == 400 and b"invalid tool schema" in response.content
    assert len(upstream.requests) == 1


# ------------------------------------------------------------------- shadow, strict


def test_shadow_forwards_the_original(start_proxy: ProxyFactory, upstream: Upstream) -> None:
    proxy = start_proxy(shadow=True, budget=Budget(3000), counter="chars")
    raw = orjson.dumps(anthropic_body())
    assert post(proxy, "/v1/messages", raw).status_code == 200
    assert upstream.tap.sent[-1].request == raw
    status = httpx.get(f"{proxy.base_url}/agentcompact/status").json()
    assert status["shadow"] and status["compactions"] == 1
    assert status["shadow_tokens_saved"] > 0 and status["tokens_saved"] == 0


def test_strict_refuses_what_stays_over_budget(start_proxy: ProxyFactory,
                                               upstream: Upstream) -> None:
    proxy = start_proxy(strict=True, budget=Budget(3000), counter="chars")
    history = anthropic_history(10)
    history.append({"role": "assistant", "content": [  # a tool call no cut can shrink
        {"type": "tool_use", "id": "toolu_big", "name": "write_file",
         "input": {"path": "big.txt", "content": "x" * 40_000}}]})
    history.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_big", "content": "ok"}]})
    with anthropic.Anthropic(base_url=proxy.base_url, api_key="k", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=MODEL, max_tokens=64, messages=history)
    assert "strict mode" in str(caught.value)
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert upstream.requests == []


# -------------------------------------------------------------- probes, passthrough


def test_probes_are_untouched(proxy: ThreadedServer, upstream: Upstream) -> None:
    raw = orjson.dumps(anthropic_body(20, max_tokens=1))
    assert post(proxy, "/v1/messages", raw).status_code == 200
    assert upstream.tap.sent[-1].request == raw
    assert proxy.proxy.stats.snapshot()["probes"] == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/messages/count_tokens", anthropic_body(20)),
    ("POST", "/v1/responses/compact", {"model": MODEL, "input": responses_history(20)}),
    ("GET", "/v1/models", None),
])
def test_other_routes_pass_through(proxy: ThreadedServer, upstream: Upstream, method: str,
                                   path: str, body: Any) -> None:
    raw = orjson.dumps(body) if body is not None else b""
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:
        response = client.request(method, path, content=raw or None,
                                  headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    sent = upstream.tap.sent[-1]
    assert (sent.path, sent.request) == (path, raw)
    assert (response.status_code, response.content) == (200, sent.body)
    seen = upstream.requests[-1].headers
    assert seen["x-api-key"] == "k" and seen["anthropic-version"] == "2023-06-01"


def test_path_and_query_go_upstream_as_sent(proxy: ThreadedServer, upstream: Upstream) -> None:
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:
        client.get(httpx.URL(proxy.base_url + "/v1/models/org%2Fmodel%20x?limit=5&q=a%20b%2Bc"))
        client.post(proxy.base_url + "/v1/messages?beta=true", content=orjson.dumps(
            anthropic_body(2)), headers={"content-type": "application/json"})
    first, second = upstream.tap.sent[-2:]
    assert (first.raw_path, first.query) == (b"/v1/models/org%2Fmodel%20x", b"limit=5&q=a%20b%2Bc")
    assert (second.raw_path, second.query) == (b"/v1/messages", b"beta=true")


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A catch-all upstream answering 200 with the request it got: path, headers, body."""
    assert scope["type"] == "http"
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = {k.decode(): v.decode() for k, v in scope["headers"]}
    payload = orjson.dumps({"path": scope["path"], "headers": headers,
                            "body": orjson.loads(body)})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})


def test_codex_backend_path_is_compacted_as_responses(start_proxy: ProxyFactory) -> None:
    items = responses_history(20)
    with serve(echo_app) as chatgpt:
        proxy = start_proxy(openai_upstream=chatgpt.base_url, budget=Budget(3000), counter="chars")
        response = post(proxy, "/backend-api/codex/responses", {"model": MODEL, "input": items},
                        authorization="Bearer chatgpt-oauth-token", session_id="codex-1")
    seen = response.json()
    assert seen["path"] == "/backend-api/codex/responses"
    assert seen["headers"]["authorization"] == "Bearer chatgpt-oauth-token"
    assert seen["headers"]["session_id"] == "codex-1"
    forwarded = seen["body"]["input"]
    assert len(forwarded) < len(items)
    validate(forwarded, get_dialect("openai_responses"))


async def cookie_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An upstream that sets a cookie and echoes the request's cookie header."""
    while (await receive()).get("more_body"):
        pass
    cookie = dict(scope["headers"]).get(b"cookie", b"")
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"set-cookie", b"upstream-session=secret; Path=/"),
                            (b"content-length", str(len(cookie)).encode())]})
    await send({"type": "http.response.body", "body": cookie})


def test_upstream_cookies_are_relayed_but_never_replayed(start_proxy: ProxyFactory) -> None:
    with serve(cookie_app) as provider:  # a host name: cookie jars skip bare IP hosts
        proxy = start_proxy(openai_upstream=provider.base_url.replace("127.0.0.1",
                                                                      "localhost"))
        first = post(proxy, "/v1/models", b"")
        second = post(proxy, "/v1/models", b"")  # another client: no cookie of its own
    assert first.headers["set-cookie"].startswith("upstream-session=")
    assert first.headers["content-length"] == "0"  # the upstream's length, not re-chunked
    assert (first.content, second.content) == (b"", b"")
