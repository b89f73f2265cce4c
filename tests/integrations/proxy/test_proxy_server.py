"""The proxy's HTTP server, for the ``proxy`` command and the embedded server alike
(``agentcompact run``, the embedding API): request-targets other than origin-form are
refused, and idle client connections are kept with the ``Keep-Alive`` hint sent."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentcompact.integrations.proxy import ThreadedServer, create_app
from agentcompact.integrations.proxy._config import ProxyConfig
from agentcompact.testing import serve

from .conftest import ProxyFactory, Upstream

pytestmark = pytest.mark.network


def raw_get(port: int, target: str, method: str = "GET") -> bytes:
    """One request with ``target`` as sent, and the whole answer (connection closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                     .encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def decoy() -> Iterator[Any]:
    """A server on 127.0.0.2 (loopback) that no request must ever reach."""
    with serve(host="127.0.0.2") as server:
        yield server


@pytest.fixture(params=["embedded", "command"])
def proxy_port(request: pytest.FixtureRequest, start_proxy: ProxyFactory,
               upstream: Upstream, tmp_path: Any) -> Iterator[int]:
    """The port of a proxy in front of ``upstream``: the embedded server (``ThreadedServer``)
    or the ``agentcompact proxy`` command in its own process."""
    if request.param == "embedded":
        yield start_proxy(store="memory:").port
        return
    port = free_port()
    env = {**os.environ, "AGENTCOMPACT_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentcompact.integrations.proxy", "--port", str(port),
         "--quiet", "--store", "memory:", "--anthropic-upstream", upstream.base_url,
         "--openai-upstream", upstream.base_url], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "proxy did not start"
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("target", ["@127.0.0.2:{port}/v1/models",
                                    "http://127.0.0.2:{port}/v1/models",
                                    "v1/models", "*"])
def test_targets_not_in_origin_form_are_refused(proxy_port: int, decoy: Any,
                                                upstream: Upstream, target: str) -> None:
    answer = raw_get(proxy_port, target.format(port=decoy.port))
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert not decoy.requests and not upstream.requests


def test_origin_form_and_options_star_are_served(proxy_port: int, upstream: Upstream) -> None:
    assert raw_get(proxy_port, "/v1/models?limit=1").startswith(b"HTTP/1.1 200 ")
    assert raw_get(proxy_port, "*", method="OPTIONS").startswith(b"HTTP/1.1 204 ")
    assert [r.path for r in upstream.requests] == ["/v1/models"]


async def test_the_app_refuses_them_under_any_server(upstream: Upstream) -> None:
    """``create_app`` under a server that passes such targets on (h11, as uvicorn's
    ``--http h11`` does): the app refuses them itself."""
    app = create_app(ProxyConfig(store="memory:", openai_upstream=upstream.base_url,
                                 anthropic_upstream=upstream.base_url))
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for raw in (b"@127.0.0.2:9/v1/models", b"http://127.0.0.2:9/v1/models"):
        sent.clear()
        scope = {"type": "http", "method": "GET", "path": raw.decode(), "raw_path": raw,
                 "query_string": b"", "headers": [], "http_version": "1.1",
                 "scheme": "http", "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2),
                 "root_path": "", "asgi": {"version": "3.0"}}
        await app(scope, receive, send)
        assert sent[0]["status"] == 400
    assert not upstream.requests


# --------------------------------------------------------------------------- keep-alive


def test_every_answer_carries_the_keep_alive_hint(start_proxy: ProxyFactory) -> None:
    proxy = start_proxy(store="memory:")
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        for answer in (client.get("/v1/models"), client.get("/agentcompact/status"),
                       client.post("/v1/chat/completions", json={
                           "model": "m", "messages": [{"role": "user", "content": "hi"}]})):
            assert answer.headers.get("keep-alive") == "timeout=75", answer.headers


def test_idle_connections_are_kept_as_configured(start_proxy: ProxyFactory) -> None:
    """A connection idle past uvicorn's default (5 s, here scaled down to a 2 s setting
    against 1 s of idling... and past it) is kept while within the setting, closed after."""
    proxy = start_proxy(store="memory:", keep_alive=2)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
        request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        conn.sendall(request)
        first = conn.recv(65536)
        assert b"keep-alive: timeout=2" in first.lower()
        time.sleep(1.0)
        conn.sendall(request)
        assert conn.recv(65536).startswith(b"HTTP/1.1 200 ")
        time.sleep(3.5)
        assert conn.recv(65536) == b""  # closed by the server once idle 2 s


def test_keep_alive_setting_is_validated() -> None:
    with pytest.raises(Exception, match="keep_alive"):
        ProxyConfig(keep_alive=0)
    assert ThreadedServer(create_app(ProxyConfig(store="memory:", keep_alive=30)))._server.config \
        .timeout_keep_alive == 30
