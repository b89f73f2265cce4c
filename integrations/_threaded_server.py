"""Serve an ASGI app under uvicorn from a daemon thread (the proxy, the upstream simulator)."""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time
from types import TracebackType
from typing import Any, Literal, TypeVar

import uvicorn

__all__ = ["ThreadedServer", "listening_socket"]

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
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._socket: socket.socket | None = None
        self.name = name
        self._start_timeout_s = start_timeout_s
        self.host, self.port = host, port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _serve(self) -> None:
        self._server.run(sockets=[self._socket] if self._socket is not None else None)

    def start(self: _S) -> _S:
        """Bind (a busy port raises :class:`~agentcompact.errors.ConfigError` here), then
        serve from the thread; returns once it accepts connections."""
        self._socket = listening_socket(self.host, self.port)
        self.port = self._socket.getsockname()[1]
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start on {self.host}:{self.port}")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        """Stop serving (graceful, then forced) and join the thread; idempotent."""
        self._server.should_exit = True
        if not self._thread.is_alive():
            self._close_socket()
            return
        self._thread.join(_STOP_TIMEOUT_S)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(_STOP_TIMEOUT_S)
        self._close_socket()

    def _close_socket(self) -> None:
        if self._socket is not None:
            self._socket.close()

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


def listening_socket(host: str, port: int, *, flag: str = "--port") -> socket.socket:
    """A socket bound to ``host:port`` and listening, for ``uvicorn.Server.run(sockets=...)``.

    Bound before anything announces the address, so a busy port is one clear
    :class:`~agentcompact.errors.ConfigError` naming the fix, not a log line after the
    banner and a traceback.
    """
    from agentcompact.errors import ConfigError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is already in use (another proxy or "
                              f"server?); stop it, or choose another port with {flag} "
                              f"(0: any free port)") from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                          f"check the host and {flag}") from None
    return sock
