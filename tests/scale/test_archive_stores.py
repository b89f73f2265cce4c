"""The archive of dropped originals on the store backends: one URL for prefixes and
archive (SQLite file, Redis server), keys that never collide, atomic writes, fail-open.
Two real proxy processes on one Redis store: what one drops, the other side expands — the
``mcp`` SDK's client through ``agentcompact mcp --store URL`` — and the other replica
sends the same compaction."""

from __future__ import annotations

import logging
import re
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentcompact import PrefixEntry, expand, tenant_of
from agentcompact._archive import (
    ArchivedItem,
    MemoryArchive,
    SharedArchive,
    TenantArchive,
    handle_of,
    open_archive,
)
from agentcompact.stores import store_from_url
from agentcompact.testing import RunningServer, UpstreamSim, serve

from .conftest import RedisServer
from .proxies import ProxyProcess, send, session_turn

TEXT = "".join(f"{i:04d} Ünïcode \U0001f600 lone \ud800 surrogate\n" for i in range(500))


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/store.sqlite"
    url: str = request.getfixturevalue("redis_url")
    return url


def _fresh(url: str) -> SharedArchive:
    found = open_archive(url)
    assert isinstance(found, SharedArchive)
    found.close()  # a new process: nothing cached
    again = open_archive(url)
    assert isinstance(again, SharedArchive)
    return again


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_archive_and_prefixes_share_a_url_without_colliding(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = _url(kind, tmp_path, request)
    handle = handle_of(TEXT)
    writer = _fresh(url)
    writer.put_many([ArchivedItem(handle, TEXT, "[skim]"),
                     ArchivedItem(handle_of("other"), "other text", "")])
    writer.put_many([ArchivedItem(handle, "not overwritten", "")])
    store = store_from_url(url)  # a prefix entry under the handle itself as key
    store.put(handle, PrefixEntry(1, 2, {"role": "user", "content": "m"}, 3, "cliff"))
    reader = _fresh(url)  # another process
    item = reader.get(handle)
    assert item is not None and item.text == TEXT and item.skim == "[skim]"
    assert expand(reader, handle, 0, 10**6).text == TEXT
    assert [h.handle for h in reader.search("0499 ÜNÏCODE")] == [handle]
    assert [h.handle for h in reader.search("TEXT")] == [handle_of("other")]
    assert reader.get(handle_of("missing")) is None and len(reader) == 2
    again = store_from_url(url)
    assert again.version and again.get(handle) == store.get(handle)  # both intact
    writer.close()
    reader.close()


def test_sqlite_archive_is_a_table_of_the_store_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.sqlite"
    _fresh(url).put_many([ArchivedItem(handle_of("x"), "x", "")])
    with sqlite3.connect(tmp_path / "store.sqlite") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"prefix_entries", "prefix_meta", "dropped"} <= tables


def test_redis_archive_keys_have_their_namespace(redis_url: str) -> None:
    import redis

    archive = _fresh(redis_url + "?prefix=team1:")
    archive.put_many([ArchivedItem(handle_of("x"), "x", "s")])
    store_from_url(redis_url + "?prefix=team1:").put(
        "k", PrefixEntry(1, 2, {"role": "user", "content": "m"}, 3, "cliff"))
    keys = sorted(k.decode() for k in redis.Redis.from_url(redis_url).keys("*"))
    assert keys == ["team1:a:" + handle_of("x"), "team1:alog", "team1:e:k", "team1:epoch",
                    "team1:log", "team1:seq"]
    assert _fresh(redis_url).get(handle_of("x")) is None  # another namespace
    archive.close()


def test_redis_archive_is_fail_open_and_writes_back(redis_server: RedisServer,
                                                    redis_url: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    archive = SharedArchive(open_archive(redis_url).backend, retry_after=0.0)  # type: ignore[attr-defined]
    archive.put_many([ArchivedItem(handle_of("before"), "before", "")])
    redis_server.stop()
    try:
        with caplog.at_level(logging.WARNING, "agentcompact"):
            for i in range(3):  # no exception, ever
                archive.put_many([ArchivedItem(handle_of(f"during {i}"), f"during {i}", "")])
        assert [r.getMessage().startswith("archive redis://") for r in caplog.records] == [True]
        # this process still has what it wrote, and searches it
        assert archive.get(handle_of("during 2")) is not None
        assert {h.text for h in archive.search("during")} == {f"during {i}" for i in range(3)}
        status = archive.status()
        assert status["available"] is False and status["pending_write_back"] == 3
        assert status["failures"] >= 1
    finally:
        redis_server.start()
    archive.put_many([ArchivedItem(handle_of("after"), "after", "")])
    assert archive.status()["written_back"] == 3 and archive.status()["available"]
    other = _fresh(redis_url)  # the server restarted empty: what was written since is there
    assert other.get(handle_of("during 1")) is not None and other.get(handle_of("after"))
    archive.close()


# --- two proxy processes -----------------------------------------------------------------
_HANDLE = re.compile(r"ac-[0-9a-f]{12}")
FLAGS = ["--trigger", "3000", "--target", "1500", "--counter", "chars"]


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningServer]:
    with serve(UpstreamSim()) as server:
        yield server


def _compaction_text(body: dict[str, Any]) -> str:
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, list) and content and str(
                content[0].get("text", "")).startswith("[agentcompact"):
            return str(content[0]["text"])
    raise AssertionError("no compaction message")


def _mcp_expand(url: str, handles: list[str], tenant: str = "sk-test") -> list[str]:
    """Each handle expanded by the ``mcp`` SDK's client through ``agentcompact mcp``, as
    the tenant whose API key is ``tenant`` (the key ``send`` sends)."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def go() -> list[str]:
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "agentcompact._cli", "mcp", "--store", url, "--page-chars", "100000"],
            env={"AGENTCOMPACT_TENANT": tenant})
        out = []
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            for handle in handles:
                result = await s.call_tool("expand", {"handle": handle})
                text = "".join(getattr(c, "text", "") for c in result.content)
                header, _, body = text.partition("\n")
                assert header.startswith(f"[agentcompact expand {handle}: chars 0-"), header
                out.append(body)
        return out

    return anyio.run(go)


@pytest.mark.network
def test_replica_b_expands_what_replica_a_dropped(sim: RunningServer, redis_url: str,
                                                  tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="the 'mcp' extra is not installed")
    a = ProxyProcess(sim.base_url, redis_url, extra=FLAGS, log=tmp_path / "a.log")
    b = ProxyProcess(sim.base_url, redis_url, extra=FLAGS, log=tmp_path / "b.log")
    try:
        a.start()
        b.start()
        sim.sim.clear()  # type: ignore[union-attr]
        send(a, session_turn(15), session="s1")  # A compacts: drops, archives
        # B: the next request of the session, under the trigger with A's compaction
        send(b, session_turn(16), session="s1")
        status = [p.status() for p in (a, b)]
    finally:
        a.stop()
        b.stop()
    first, second = [r.body for r in sim.requests if r.path == "/v1/messages"]
    dropped = _compaction_text(first)
    assert _compaction_text(second) == dropped  # B sends A's compaction (prompt cache)
    handles = sorted(set(_HANDLE.findall(dropped)))
    assert handles and status[0]["archive"]["written"] >= len(handles)
    assert status[1]["archive"]["written"] == 0  # B archived nothing itself
    texts = _mcp_expand(redis_url, handles)
    history = session_turn(15)["messages"]
    mine = TenantArchive(MemoryArchive(), tenant_of("sk-test"))  # the tenant's handles
    originals = {mine.handle_of(b["content"]) for m in history
                 if isinstance(m["content"], list) for b in m["content"]
                 if b.get("type") == "tool_result" and isinstance(b.get("content"), str)}
    for handle, text in zip(handles, texts):
        assert mine.handle_of(text) == handle  # the original, byte for byte
    assert originals & set(handles)  # tool results among them
    assert orjson.dumps(status[0]["archive"]["where"]).decode().count("@") == 0
