"""Serve an ASGI app under uvicorn from a daemon thread (the proxy, the upstream simulator)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType
from typing import Any, Literal, TypeVar

import uvicorn

__all__ = ["ThreadedServer"]

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_S = TypeVar("_S", bound="ThreadedServer")


class ThreadedServer:
    """uvicorn serving ``app`` from a daemon thread. A sync and async context manager;
    ``port=0`` picks a free port, read back from ``.port`` / ``.base_url`` once started.
    ``lifespan="on"`` (the proxy: its upstream client is closed at shutdown) or ``"off"``."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *,
                 lifespan: Literal["auto", "on", "off"] = "on", name: str = "agentcompact-proxy",
                 start_timeout_s: float = _START_TIMEOUT_S) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_config=None,
                                log_level="warning", access_log=False, http="h11", ws="none",
                                lifespan=lifespan, timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=name, daemon=True)
        self.name = name
        self._start_timeout_s = start_timeout_s
        self.host, self.port = host, port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self: _S) -> _S:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start on {self.host}:{self.port}")
            time.sleep(0.005)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Stop serving (graceful, then forced) and join the thread; idempotent."""
        self._server.should_exit = True
        if not self._thread.is_alive():
            return
        self._thread.join(_STOP_TIMEOUT_S)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(_STOP_TIMEOUT_S)

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self: _S) -> _S:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)
