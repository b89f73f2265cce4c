"""Serve an ASGI app (the simulator, or a proxy under test) on a loopback port in a thread."""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

from .app import RecordedRequest, UpstreamSim, quiet_dropped_streams

__all__ = ["RunningServer", "serve"]

_START_TIMEOUT_S = 5.0
_STOP_TIMEOUT_S = 5.0


class RunningServer:
    """uvicorn serving ``app`` from a background thread; a sync and async context manager.

    ``with serve(sim) as server:`` starts it and ``stop()``\\ s it on exit, joining the thread.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sim: UpstreamSim | None = _sim_of(app)
        config = uvicorn.Config(
            app.app if isinstance(app, UpstreamSim) else app,
            host=host, port=port, log_config=None, log_level="warning", access_log=False,
            http="h11", ws="none", lifespan="off", timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="upstream-sim", daemon=True)
        self.host = host
        self.port = port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``, without ``/v1``."""
        return f"http://{self.host}:{self.port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """The simulator's recorded requests (empty when serving some other app)."""
        return self.sim.requests if self.sim is not None else []

    def start(self) -> RunningServer:
        quiet_dropped_streams()
        if self.sim is not None:
            self.sim.closing.clear()
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"upstream sim did not start on {self.host}:{self.port}")
            time.sleep(0.005)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Stop serving and join the thread; idempotent."""
        if self.sim is not None:
            self.sim.closing.set()
        self._server.should_exit = True
        if not self._thread.is_alive():
            return
        self._thread.join(_STOP_TIMEOUT_S)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(_STOP_TIMEOUT_S)

    def __enter__(self) -> RunningServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> RunningServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)


def serve(app: Any = None, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """A not-yet-started server for ``app``: an :class:`UpstreamSim`, its ``.app``, or any
    ASGI app; None serves a fresh default simulator. ``port=0`` picks a free port."""
    return RunningServer(app if app is not None else UpstreamSim(), host, port)


def _sim_of(app: Any) -> UpstreamSim | None:
    if isinstance(app, UpstreamSim):
        return app
    state = getattr(app, "state", None)
    sim = getattr(state, "upstream_sim", None)
    return sim if isinstance(sim, UpstreamSim) else None
