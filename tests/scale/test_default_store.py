"""The proxy's default store: a SQLite file in its state folder (WAL, 0600 in a 0700
folder). Two runs of ``agentcompact proxy`` with the default settings over one folder
send the session's compacted prefix byte for byte as one run does — so the provider's
prompt cache (modelled as the longest common prefix with the previous request) keeps
its share after the restart; ``--store memory`` opts out and loses it. A store that cannot
be opened is fail-open: every request answered, compacted locally, warned once, counted
on the status page.

The strategy is ``summary`` with a summarizer answering differently on every call (see
``test_replicas``): a restarted proxy that had forgotten the prefix sends a new summary."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest

from .proxies import ProxyProcess, send, session_turn
from .test_replicas import TURNS, _compactions, _proxy, _run, reference, upstream

pytestmark = pytest.mark.network
__all__ = ["reference", "upstream"]  # module fixtures, shared with test_replicas


def _default(upstream: Any, state: Path, log: Path | None = None,
             store: str | None = None) -> ProxyProcess:
    proxy = _proxy(upstream, "", log=log)
    proxy.store = store  # None: no --store flag, the default
    proxy.extra += ["--state-dir", str(state)]
    return proxy


def _cached_share(bodies: list[Any], start: int) -> float:
    """Share of the characters of requests ``start``… that repeat the previous request's
    messages from the start (what a provider's prompt cache serves)."""
    cached = total = 0
    for prev, body in zip(bodies[start - 1:], bodies[start:]):
        n = 0
        while n < min(len(prev["messages"]), len(body["messages"])) and \
                prev["messages"][n] == body["messages"][n]:
            n += 1
        size = [len(str(m)) for m in body["messages"]]
        cached, total = cached + sum(size[:n]), total + sum(size)
    return cached / total


def test_default_store_keeps_every_prefix_across_a_restart(
        upstream: Any, reference: list[Any], tmp_path: Path) -> None:
    state = tmp_path / "state"
    restart = len(TURNS) // 2
    proxy = _default(upstream, state)
    try:
        proxy.start()
        store = proxy.status()["store"]
        assert store["backend"] == "sqlite" and store["where"].endswith("/state/store.sqlite")
        bodies = _run(upstream, [proxy], restart_at=restart)
    finally:
        proxy.stop()
    assert bodies == reference  # byte-identical prefixes after the restart
    assert _compactions(reference[:restart]) >= 1  # the restart hit a compacted session
    assert _cached_share(bodies, restart) == _cached_share(reference, restart) > 0.5
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    files = sorted(state.iterdir())
    assert [f.name for f in files][0] == "store.sqlite"
    for file in files:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file.name
    with sqlite3.connect(state / "store.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT count(*) FROM prefix_entries").fetchone()[0] >= 1

    memory = _default(upstream, tmp_path / "other", store="memory")  # the opt-out
    try:
        memory.start()
        assert memory.status()["store"] is None  # not a shared store
        forgot = _run(upstream, [memory], restart_at=restart)
    finally:
        memory.stop()
    assert forgot != reference
    assert _cached_share(forgot, restart) < _cached_share(reference, restart)
    assert not (tmp_path / "other").exists()


def test_a_store_that_cannot_be_opened_is_fail_open(upstream: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    log = tmp_path / "proxy.log"
    proxy = _default(upstream, blocker / "state", log=log)
    proxy.extra = [*proxy.extra, "--strategy", "cliff"]  # the default one: it archives
    try:
        proxy.start()
        upstream.sim.clear()
        for turns in TURNS:
            send(proxy, session_turn(turns))  # 200 every time (asserted by send)
        status = proxy.status()
    finally:
        proxy.stop()
    bodies = [r.body for r in upstream.requests if r.path == "/v1/messages"]
    assert _compactions(bodies) >= 1  # compacted locally all the same
    for part in ("store", "archive"):
        # tried and failed, or not tried: the other store of the same file had failed
        assert status[part]["available"] is False, part
        assert status[part]["failures"] + status[part]["skipped"] >= 1, part
        assert status[part]["last_error"].endswith("NotADirectoryError"), part
    assert status["store"]["pending_write_back"] >= 1
    assert status["archive"]["pending_write_back"] >= 1
    lines = log.read_text().splitlines()
    assert sum("prefix store sqlite:///" in line and "failed" in line for line in lines) == 1
    assert sum(line.startswith("archive sqlite:///") for line in lines) == 1
    assert not (blocker / "state").exists()
