"""What the proxy reports when things go wrong (issue 12 items 12-13, issue 13): failed and
fallen-back compactions in the log line and on the status page, strict mode refusing an
over-limit request that nothing could shrink, ``OPTIONS *`` with proxy variables set, and
the warning about a trigger the client's fixed prompt fills."""

from __future__ import annotations

import logging
import socket
from typing import Any

import httpx
import orjson
import pytest

from agentcompact import Budget, hookimpl, new_plugin_manager

from .conftest import ProxyFactory, Upstream
from .histories import anthropic_history
from .test_proxy_faults import MODEL, Boom, post

pytestmark = pytest.mark.network


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [orjson.loads(r.getMessage()) for r in caplog.records
            if r.getMessage().startswith('{"event":"proxy_request"')]


def _status(proxy: Any) -> dict[str, Any]:
    return httpx.get(f"{proxy.base_url}/agentcompact/status", timeout=10).json()


def test_fallback_and_error_in_the_log_line_and_counted_on_the_status_page(
        start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    class Plugin:
        @hookimpl
        def agentcompact_register_strategies(self, register: Any) -> None:
            register("boom", Boom)

    pm = new_plugin_manager()
    pm.register(Plugin())
    proxy = start_proxy(plugins=pm, strategy="boom", budget=Budget(3000), counter="chars",
                        log_requests=True)
    caplog.set_level(logging.INFO, logger="agentcompact")
    for turns in (20, 22):
        body = {"model": MODEL, "max_tokens": 64, "messages": anthropic_history(turns),
                "metadata": {"user_id": '{"session_id":"s-1"}'}}
        assert post(proxy, "/v1/messages", body).status_code == 200
    lines = _lines(caplog)
    assert lines and lines[0]["fallback"] == "cliff"
    assert "boom: RuntimeError" in lines[0]["error"] and not lines[0]["fail_open"]
    assert "strategy exploded" not in caplog.text  # the exception's text is not logged
    status = _status(proxy)
    failed = sum(1 for line in lines if line["error"])
    assert status["errors"] == failed >= 1
    assert status["fallbacks"] == sum(1 for line in lines if line["fallback"])
    assert status["fail_open"] == 0
    (session,) = status["sessions"].values()
    assert session["errors"] == failed and session["fallbacks"] >= 1
    warnings = [r for r in caplog.records if "compaction failed in session" in r.getMessage()]
    assert len(warnings) == 1  # once per session


def test_strict_refuses_an_over_limit_request_nothing_could_shrink(
        start_proxy: ProxyFactory, upstream: Upstream) -> None:
    proxy = start_proxy(strict=True, budget=Budget(3000), counter="chars")
    body = {"model": MODEL, "max_tokens": 64,
            "messages": [{"role": "user", "content": "word " * 4000}]}  # one turn: no cut
    response = post(proxy, "/v1/messages", body)
    assert response.status_code == 400
    assert "strict mode" in response.json()["error"]["message"]
    assert upstream.requests == []
    assert _status(proxy)["refused"] == 1


def test_strict_forwards_what_is_within_the_limit(start_proxy: ProxyFactory,
                                                  upstream: Upstream) -> None:
    proxy = start_proxy(strict=True, budget=Budget(3000), counter="chars")
    body = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    assert post(proxy, "/v1/messages", body).status_code == 200
    assert len(upstream.requests) == 1


def _raw_request(proxy: Any, request: bytes) -> bytes:
    host, port = proxy.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(request)
        return sock.recv(65536)


@pytest.mark.parametrize("variable", ["NO_PROXY", "HTTPS_PROXY", "no_proxy"])
def test_options_star_is_answered_with_a_proxy_variable_set(
        start_proxy: ProxyFactory, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "http://127.0.0.1:9" if "HTTPS" in variable else "x.test")
    proxy = start_proxy()
    answer = _raw_request(proxy, b"OPTIONS * HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 204"), status_line
    assert b"allow: " in answer.lower() and b"POST" in answer


def test_a_trigger_the_fixed_prompt_fills_is_warned_about_once(
        start_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture) -> None:
    proxy = start_proxy(budget=Budget(3000), counter="chars")
    caplog.set_level(logging.INFO, logger="agentcompact")
    system = [{"type": "text", "text": "rule " * 2000}]  # ~2,500 tokens of chars/4
    tools = [{"name": "t", "description": "d " * 400, "input_schema": {"type": "object"}}]
    for _ in range(2):
        body = {"model": MODEL, "max_tokens": 64, "system": system, "tools": tools,
                "messages": [{"role": "user", "content": "hi"}],
                "metadata": {"user_id": '{"session_id":"s-2"}'}}
        assert post(proxy, "/v1/messages", body).status_code == 200
    warned = [r.getMessage() for r in caplog.records if "too small for this client" in
              r.getMessage()]
    assert len(warned) == 1 and "--trigger" in warned[0]


def test_a_trigger_with_room_is_not_warned_about(start_proxy: ProxyFactory,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    proxy = start_proxy(budget=Budget(100_000), counter="chars")
    caplog.set_level(logging.INFO, logger="agentcompact")
    body = {"model": MODEL, "max_tokens": 64, "system": "be brief",
            "messages": [{"role": "user", "content": "hi"}]}
    assert post(proxy, "/v1/messages", body).status_code == 200
    assert not [r for r in caplog.records if "too small" in r.getMessage()]
