"""Serve an ASGI app under uvicorn: one server configuration (``server_config``) for the
``proxy`` command and for the threaded server (``agentcompact run``, the embedding API,
the upstream simulator), so both parse requests alike.

**Request-targets.** The proxy joins the target onto its upstream's URL, so only
origin-form (``/path?query``) and ``OPTIONS *`` are served: any other form is answered 400
by the parser (``@host:port/…`` would become userinfo and a host of the client's choosing;
``http://host/…``, which llhttp would reduce to its path silently, is refused too), and
the proxy app refuses the same targets under any other server (``ProxyApp``).

**Keep-alive.** uvicorn closes a client connection idle 5 s by default and says nothing
about it; a client reusing the connection just then (httpx's own idle limit is 5 s too)
loses its request with a read error before it reaches the proxy. The proxy keeps idle
connections ``keep_alive`` seconds (``DEFAULT_KEEP_ALIVE``) and says so on every response
(``Keep-Alive: timeout=N``, RFC 9112 §9.3 / the de-facto hint undici and other clients
read to close a connection before the server does).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import math
import socket
import threading
import time
from types import TracebackType
from typing import Any, Literal, TypeVar

import uvicorn

__all__ = ["DEFAULT_KEEP_ALIVE", "ThreadedServer", "keep_alive_of", "listening_socket",
           "server_config"]

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_S = TypeVar("_S", bound="ThreadedServer")

DEFAULT_KEEP_ALIVE = 75.0
"""Seconds an idle client connection stays open (nginx's default; longer than the idle
limit of the clients agents use: httpx 5 s, undici 4 s, so the client closes first)."""


@functools.cache
def _http_protocol() -> Any:
    """uvicorn's httptools protocol refusing targets not in origin-form, or ``"h11"``
    when httptools is not installed (the proxy app refuses them then)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is in the proxy extra
        return "h11"

    class OriginFormProtocol(HttpToolsProtocol):
        def on_headers_complete(self) -> None:
            url = self.url
            if url[:1] != b"/" and not (url == b"*" and self.parser.get_method() == b"OPTIONS"):
                # raised in a parser callback: the parser fails, uvicorn answers 400
                raise ValueError("request-target not in origin-form")
            super().on_headers_complete()

    return OriginFormProtocol


def server_config(app: Any, host: str, port: int, *, keep_alive: float = DEFAULT_KEEP_ALIVE,
                  lifespan: Literal["auto", "on", "off"] = "on", **options: Any
                  ) -> uvicorn.Config:
    """The uvicorn configuration every agentcompact server runs with: one HTTP parser
    (httptools, the ``proxy`` extra's, refusing targets not in origin-form), idle
    connections kept ``keep_alive`` seconds and the ``Keep-Alive: timeout=N`` hint on
    every response."""
    seconds = max(1, math.ceil(keep_alive))
    return uvicorn.Config(app, host=host, port=port, log_config=None, log_level="warning",
                          access_log=False, ws="none", lifespan=lifespan,
                          timeout_keep_alive=seconds,
                          headers=[("keep-alive", f"timeout={seconds}")],
                          **{"http": _http_protocol(), **options})


def keep_alive_of(app: Any) -> float:
    """The keep-alive a proxy app is configured with (``ProxyConfig.keep_alive``), else
    ``DEFAULT_KEEP_ALIVE``."""
    proxy = getattr(app, "proxy", None)
    value = getattr(getattr(proxy, "config", None), "keep_alive", None)
    return float(value) if isinstance(value, (int, float)) else DEFAULT_KEEP_ALIVE


class ThreadedServer:
    """uvicorn serving ``app`` from a daemon thread. A sync and async context manager;
    ``port=0`` picks a free port, read back from ``.port`` / ``.base_url`` once started.
    ``lifespan="on"`` (the proxy: its upstream client is closed at shutdown) or ``"off"``.
    ``keep_alive``: idle seconds a client connection stays open (default: the proxy app's
    ``ProxyConfig.keep_alive``, else ``DEFAULT_KEEP_ALIVE``). ``http``: uvicorn's HTTP
    implementation, default the proxy's (``server_config``); the upstream simulator passes
    ``"h11"``, which serves absolute-form targets (a test plays a forward proxy with it)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *,
                 lifespan: Literal["auto", "on", "off"] = "on", name: str = "agentcompact-proxy",
                 start_timeout_s: float = _START_TIMEOUT_S,
                 keep_alive: float | None = None, http: Any = None) -> None:
        options = {} if http is None else {"http": http}
        config = server_config(app, host, port, lifespan=lifespan, timeout_graceful_shutdown=1,
                               keep_alive=keep_alive_of(app) if keep_alive is None
                               else keep_alive, **options)
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
