"""A locked or frozen store stalls no other session: while another process holds the
SQLite file's write lock (or the Redis server is stopped), a session whose requests
compact (prefix saves, archive writes) pays at most the store's deadline per request, an
unrelated session's stream keeps flowing, and the status page says the store is degraded
(writes failing, reads answering) or down (reads failing too). Locks are held ~2.5 s here;
``benchmarks/proxy_faults.py`` holds them 30 s and prints the figures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agentcompact import Budget, new_plugin_manager
from agentcompact.integrations.proxy import ProxyConfig, ThreadedServer, create_app
from agentcompact.testing import LatencyModel, UpstreamSim, filler_text, serve
from tests.integrations.proxy.histories import chat_history

from .conftest import RedisServer

pytestmark = pytest.mark.network

HOLD_S = 2.5
DEADLINE_S = 0.3
SQLITE_DEADLINE_S = 0.5  # the SQLite store's default


class LockHolder:
    """Another process holding ``path``'s write lock (``BEGIN IMMEDIATE``) ``seconds``."""

    def __init__(self, path: Path, seconds: float) -> None:
        code = ("import sqlite3, sys, time\n"
                "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                "c.execute('BEGIN IMMEDIATE')\n"
                "print('locked', flush=True)\n"
                "time.sleep(float(sys.argv[2]))\n"
                "c.execute('ROLLBACK')\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(path), str(seconds)],
                                     stdout=subprocess.PIPE)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == b"locked\n"

    def wait(self) -> None:
        self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Streamer(threading.Thread):
    """Session A: one long streamed answer, each chunk's arrival time recorded."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.arrivals: list[float] = []
        self.started = threading.Event()

    def run(self) -> None:
        body = {"model": "m", "max_tokens": 4096, "stream": True,
                "messages": [{"role": "user", "content": filler_text(120)}]}
        with httpx.Client(timeout=60) as client, client.stream(
                "POST", self.url + "/v1/messages", content=orjson.dumps(body),
                headers={"x-session-id": "streamer"}) as answer:
            assert answer.status_code == 200
            for _ in answer.iter_raw():
                self.arrivals.append(time.monotonic())
                self.started.set()

    def largest_gap(self) -> float:
        return max(b - a for a, b in zip(self.arrivals, self.arrivals[1:]))


@pytest.fixture
def proxy_for() -> Iterator[Any]:
    """``proxy_for(store_url)``: a proxy whose Anthropic upstream streams slowly (session
    A) and whose OpenAI upstream answers at once (session B, compacting)."""
    servers: list[Any] = []

    def start(store: str) -> ThreadedServer:
        slow = serve(UpstreamSim(latency=LatencyModel(decode_tokens_per_s=40))).start()
        fast = serve().start()
        config = ProxyConfig(store=store, budget=Budget(3000, 1500), counter="chars",
                             anthropic_upstream=slow.base_url, openai_upstream=fast.base_url,
                             log_requests=False)
        proxy = ThreadedServer(create_app(config, plugins=new_plugin_manager())).start()
        servers.extend([proxy, slow, fast])
        return proxy

    yield start
    for server in servers:
        server.stop()


def compacting_request(url: str, session: str, n: int = 0) -> float:
    """Session B's request (a history over the trigger: compacted, stored, and tool
    outputs of its own archived); its time."""
    t0 = time.monotonic()
    answer = httpx.post(url + "/v1/chat/completions", timeout=30, headers={
        "x-session-id": session}, json={"model": "m", "messages": chat_history(12, 300 + n)})
    assert answer.status_code == 200
    return time.monotonic() - t0


def store_status(url: str) -> dict[str, Any]:
    status: dict[str, Any] = httpx.get(url + "/agentcompact/status", timeout=5).json()
    return status


class HeldLock:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> LockHolder:
        self.holder = LockHolder(self.path, HOLD_S)
        return self.holder

    def __exit__(self, *exc: object) -> None:
        self.holder.wait()


def test_a_locked_sqlite_store_costs_one_deadline_and_stalls_no_other_session(
        proxy_for: Any, tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    proxy = proxy_for(f"sqlite:///{path}?retry_after=0.5")  # the default deadline
    compacting_request(proxy.base_url, "warm-up")  # the file and its tables exist
    with HeldLock(path) as holder:
        streamer = Streamer(proxy.base_url)
        streamer.start()
        assert streamer.started.wait(10)
        times = [compacting_request(proxy.base_url, f"b-{i}", i + 1) for i in range(4)]
        during = store_status(proxy.base_url)
        holder.wait()
    streamer.join(30)
    assert streamer.largest_gap() < 1.0, streamer.largest_gap()
    # each request pays at most one deadline (then the writes wait for retry_after)
    assert max(times) < SQLITE_DEADLINE_S + 1.0, times
    for part in ("store", "archive"):
        assert during[part]["state"] == "degraded", during[part]  # reads answer
        assert during[part]["pending_write_back"] >= 1
    time.sleep(0.6)  # past retry_after: the next request writes back what waited
    compacting_request(proxy.base_url, "after")
    after = store_status(proxy.base_url)
    assert after["store"]["state"] == "ok" and after["store"]["pending_write_back"] == 0


def test_a_frozen_redis_store_costs_one_deadline_and_stalls_no_other_session(
        proxy_for: Any, redis_server: RedisServer) -> None:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    url = f"{redis_server.url}?timeout={DEADLINE_S}&retry_after=0.5&prefix=frozen{os.getpid()}:"
    proxy = proxy_for(url)
    compacting_request(proxy.base_url, "warm-up")
    assert redis_server.proc is not None
    pid = redis_server.proc.pid
    streamer = Streamer(proxy.base_url)
    streamer.start()
    assert streamer.started.wait(10)
    os.kill(pid, signal.SIGSTOP)
    try:
        until = time.monotonic() + HOLD_S
        times = []
        while time.monotonic() < until:
            times.append(compacting_request(proxy.base_url, f"b-{len(times)}", len(times) + 1))
        during = store_status(proxy.base_url)
    finally:
        os.kill(pid, signal.SIGCONT)
    streamer.join(30)
    # not one deadline (a blocked loop): the stream's chunks come every 25 ms
    assert streamer.largest_gap() < 0.8 * DEADLINE_S, streamer.largest_gap()
    assert max(times) < DEADLINE_S + 1.0, times
    assert during["store"]["state"] == "down", during["store"]


# ------------------------------------------------------------------ the store, in process


def test_reads_go_on_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    from agentcompact.stores import SharedPrefixStore
    from agentcompact.stores._sqlite_store import SQLiteBackend
    from tests.scale.test_stores import ENTRY

    path = tmp_path / "p.db"
    writer = SharedPrefixStore(SQLiteBackend(path, timeout=0.2), retry_after=0.0)
    writer.put("before", ENTRY)
    reader = SharedPrefixStore(SQLiteBackend(path, timeout=0.2))
    holder = LockHolder(path, 1.5)
    try:
        t0 = time.monotonic()
        writer.put("during", ENTRY)  # fails after the deadline: kept, written back later
        assert time.monotonic() - t0 < 0.2 + 0.3
        assert writer.status()["state"] == "degraded"
        assert reader.version and reader.get("before") == ENTRY  # reads answer
        assert reader.status()["state"] == "degraded"  # one file: one health
        t0 = time.monotonic()
        assert writer.status()["pending_write_back"] == 1
        assert time.monotonic() - t0 < 0.05  # never waits for a backend call
    finally:
        holder.wait()
    writer.refresh()
    assert writer.status()["state"] == "ok" and writer.status()["written_back"] == 1
    assert reader.version and reader.get("during") == ENTRY


def test_a_status_page_never_waits_for_a_backend_call(tmp_path: Path) -> None:
    """A call stuck in the backend (a thread inside ``save``) holds no lock the status or
    the store's local answers need."""
    from agentcompact.stores import SharedPrefixStore
    from agentcompact.stores._sqlite_store import SQLiteBackend
    from tests.scale.test_stores import ENTRY

    path = tmp_path / "p.db"
    store = SharedPrefixStore(SQLiteBackend(path, timeout=2.0))
    store.put("cached", ENTRY)
    holder = LockHolder(path, 1.5)
    try:
        stuck = threading.Thread(target=store.put, args=("stuck", ENTRY))
        stuck.start()
        time.sleep(0.2)  # inside SQLite's busy wait
        t0 = time.monotonic()
        store.status()
        assert store.get("cached") == ENTRY
        assert time.monotonic() - t0 < 0.1
        stuck.join(5)
    finally:
        holder.wait()


class SlowAsyncStrategy:
    """An async strategy recording the thread its ``acompact`` runs on."""

    name = "slow-async"
    threads: list[str] = []

    def compact(self, request: Any) -> Any:
        raise NotImplementedError

    async def acompact(self, request: Any) -> Any:
        from agentcompact.strategies import CliffStrategy

        SlowAsyncStrategy.threads.append(threading.current_thread().name)
        return CliffStrategy().compact(request)


def test_an_async_strategy_with_a_file_store_runs_off_the_event_loop(tmp_path: Path) -> None:
    from agentcompact import hookimpl

    class Plugin:
        @hookimpl
        def agentcompact_register_strategies(self, register: Any) -> None:
            register("slow-async", SlowAsyncStrategy)

    pm = new_plugin_manager()
    pm.register(Plugin())
    SlowAsyncStrategy.threads.clear()
    with serve() as upstream:
        config = ProxyConfig(store=f"sqlite:///{tmp_path}/s.db", strategy="slow-async",
                             budget=Budget(3000, 1500), counter="chars",
                             openai_upstream=upstream.base_url,
                             anthropic_upstream=upstream.base_url, log_requests=False)
        with ThreadedServer(create_app(config, plugins=pm)) as proxy:
            compacting_request(proxy.base_url, "async")
    assert SlowAsyncStrategy.threads == ["agentcompact-engines"]
