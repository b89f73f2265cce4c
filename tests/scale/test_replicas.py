"""Two real ``agentcompact proxy`` processes sharing one store serve alternate requests of
one session: the upstream receives exactly what one proxy alone would have sent. A proxy
restarted mid-session on its SQLite file does the same.

The strategy is ``summary`` with a summarizer (the simulator) that answers differently on
every call, as a sampling LLM does: a replica that compacted on its own would send its own
summary, and the bodies would differ (the control tests show it)."""

from __future__ import annotations

import itertools
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentcompact.testing import RunningServer, Script, UpstreamSim, serve

from .proxies import ProxyProcess, send, session_turn

pytestmark = pytest.mark.network

FLAGS = ["--trigger", "3000", "--target", "1500", "--counter", "chars", "--strategy",
         "summary"]
TURNS = range(8, 20)  # crosses the trigger several times
_calls = itertools.count()


def _sampled(body: dict[str, Any]) -> str:
    return f"Summary {next(_calls)}: the agent read the source files."


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningServer]:
    with serve(UpstreamSim(Script(then=_sampled))) as server:
        yield server


def _proxy(upstream: RunningServer, store: str, log: Path | None = None) -> ProxyProcess:
    env = {"AGENTCOMPACT_SUMMARIZER_BASE_URL": upstream.base_url + "/v1",
           "AGENTCOMPACT_SUMMARIZER_MODEL": "sim-model"}
    return ProxyProcess(upstream.base_url, store, extra=FLAGS, log=log, env=env)


@pytest.fixture(scope="module")
def reference(upstream: RunningServer) -> list[Any]:
    """What one proxy alone sends upstream for the session."""
    alone = _proxy(upstream, "memory:").start()
    try:
        bodies = _run(upstream, [alone])
    finally:
        alone.stop()
    assert _compactions(bodies) >= 2  # the session crosses the trigger more than once
    return bodies


def _run(upstream: RunningServer, proxies: list[ProxyProcess],
         restart_at: int | None = None) -> list[Any]:
    """Request ``i`` of the session goes to ``proxies[i % len]``; the bodies of the
    session's requests upstream got (summarizer calls left out)."""
    global _calls
    _calls = itertools.count()
    upstream.sim.clear()  # type: ignore[union-attr]
    for i, turns in enumerate(TURNS):
        if i == restart_at:  # killed, not stopped: nothing may depend on a clean shutdown
            for p in proxies:
                p.stop(signal.SIGKILL)
                p.start()
        send(proxies[i % len(proxies)], session_turn(turns))
    return [r.body for r in upstream.requests if r.path == "/v1/messages"]


def _compactions(bodies: list[Any]) -> int:
    return sum(1 for a, b in zip(bodies, bodies[1:])
               if b["messages"][:len(a["messages"])] != a["messages"])


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_replicas_sharing_a_store_send_what_one_proxy_sends(
        kind: str, upstream: RunningServer, reference: list[Any], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    url = (f"sqlite:///{tmp_path}/prefixes.db" if kind == "sqlite"
           else request.getfixturevalue("redis_url"))
    replicas = [_proxy(upstream, url, log=tmp_path / f"{n}.log") for n in "ab"]
    try:
        for p in replicas:
            p.start()
        bodies = _run(upstream, replicas)
        assert bodies == reference
        status = [p.status()["store"] for p in replicas]
        assert all(s["backend"] == kind and s["available"] for s in status)
        assert sum(s["fetched"] for s in status) >= 1, status  # one read the other's entry
    finally:
        for p in replicas:
            p.stop()


def test_replicas_without_a_shared_store_diverge(upstream: RunningServer,
                                                 reference: list[Any]) -> None:
    """The control: the same two replicas, each with its own memory, send other bodies."""
    replicas = [_proxy(upstream, "memory:").start() for _ in "ab"]
    try:
        assert _run(upstream, replicas) != reference
    finally:
        for p in replicas:
            p.stop()


def test_a_proxy_restarted_mid_session_keeps_the_prefix(
        upstream: RunningServer, reference: list[Any], tmp_path: Path) -> None:
    proxy = _proxy(upstream, f"sqlite:///{tmp_path}/prefixes.db")
    try:
        proxy.start()
        assert _run(upstream, [proxy], restart_at=len(TURNS) // 2) == reference
    finally:
        proxy.stop()
    memory = _proxy(upstream, "memory:")
    try:
        memory.start()
        assert _run(upstream, [memory], restart_at=len(TURNS) // 2) != reference  # control
    finally:
        memory.stop()
