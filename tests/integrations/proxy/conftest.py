"""Fixtures for the proxy tests: a recording upstream simulator and a proxy in front of it,
both served on loopback sockets by uvicorn threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentcompact import Budget, new_plugin_manager
from agentcompact.integrations.proxy import ProxyConfig, ThreadedServer, create_app
from agentcompact.testing import RunningServer, UpstreamSim, serve

pytestmark = pytest.mark.network


@dataclass
class Sent:
    """What the upstream sent back for one request: status and the exact body bytes."""

    path: str
    raw_path: bytes = b""
    query: bytes = b""
    request: bytes = b""
    status: int = 0
    chunks: list[bytes] = field(default_factory=list)
    completed: bool = False
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class ResponseTap:
    """ASGI middleware recording every request body the wrapped app receives and every
    response it sends, byte for byte, and whether the response ended normally
    (``completed``) or was cut off by a disconnect."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent: list[Sent] = []
        self.state = getattr(app, "state", None)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = Sent(scope["path"], scope.get("raw_path") or b"", scope.get("query_string", b""))
        self.sent.append(record)

        async def listen() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                record.request += message.get("body", b"")
            return message

        async def tap(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            elif message["type"] == "http.response.body":
                record.chunks.append(message.get("body", b""))
                record.completed = not message.get("more_body", False)
            await send(message)

        try:
            await self.app(scope, listen, tap)
        finally:
            record.finished.set()


@dataclass
class Upstream:
    sim: UpstreamSim
    tap: ResponseTap
    server: RunningServer

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def requests(self) -> list[Any]:
        return self.sim.requests


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    sim = UpstreamSim()
    tap = ResponseTap(sim.app)
    with serve(tap) as server:
        yield Upstream(sim, tap, server)


ProxyFactory = Callable[..., ThreadedServer]


@pytest.fixture
def start_proxy(upstream: Upstream) -> Iterator[ProxyFactory]:
    """``start_proxy(**config_fields, plugins=pm, store=s)`` → a started proxy server."""
    servers: list[ThreadedServer] = []

    def start(*, plugins: Any = None, store: Any = None, **fields: Any) -> ThreadedServer:
        fields.setdefault("anthropic_upstream", upstream.base_url)
        fields.setdefault("openai_upstream", upstream.base_url)
        fields.setdefault("gemini_upstream", upstream.base_url)
        fields.setdefault("log_requests", False)
        config = ProxyConfig(**fields)
        app = create_app(config, plugins=plugins if plugins is not None else new_plugin_manager(),
                         store=store)
        server = ThreadedServer(app).start()
        server.proxy = app.state.proxy  # type: ignore[attr-defined]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def proxy(start_proxy: ProxyFactory) -> ThreadedServer:
    """A proxy with a low trigger (cliff strategy, chars/4 counting)."""
    return start_proxy(budget=Budget(3000, 1500), counter="chars")
