"""Serve an ASGI app (the simulator, or a proxy under test) on a loopback port in a thread."""

from __future__ import annotations

from typing import Any

from agentcompact.integrations._threaded_server import ThreadedServer

from ._app import RecordedRequest, UpstreamSim, quiet_dropped_streams

__all__ = ["RunningServer", "serve"]


class RunningServer(ThreadedServer):
    """uvicorn serving the simulator (or any ASGI app) from a background thread; a sync and
    async context manager. ``with serve(sim) as server:`` starts it and stops it on exit.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sim: UpstreamSim | None = _sim_of(app)
        super().__init__(app.app if isinstance(app, UpstreamSim) else app, host, port,
                         lifespan="off", name="upstream-sim", start_timeout_s=5.0,
                         http="h11")

    @property
    def requests(self) -> list[RecordedRequest]:
        """The simulator's recorded requests (empty when serving some other app)."""
        return self.sim.requests if self.sim is not None else []

    def start(self) -> RunningServer:
        quiet_dropped_streams()
        if self.sim is not None:
            self.sim.closing.clear()
        return super().start()

    def stop(self) -> None:
        """Stop serving (hung replies end early) and join the thread; idempotent."""
        if self.sim is not None:
            self.sim.closing.set()
        super().stop()


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
