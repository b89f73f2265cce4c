"""The SQLite and Redis prefix stores: shared between processes' stores, atomic entries,
serialization errors that name the type, and fail-open when the backend is away."""

from __future__ import annotations

import argparse
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentcompact import Budget, Engine, PrefixEntry
from agentcompact.errors import StoreError
from agentcompact.stores import SharedPrefixStore, store_from_url
from agentcompact.stores._sqlite_store import SQLiteBackend, _busy
from tests.integrations.proxy.histories import chat_history

from .conftest import RedisServer
from .proxies import free_port

ENTRY = PrefixEntry(1, 4, {"role": "user", "content": "[compacted] 3 messages"}, 9, "cliff",
                    1, {5: ("d1g3st", {"role": "tool", "tool_call_id": "c", "content": "x…"}, 2)})

StoreFactory = Callable[[], SharedPrefixStore]


@pytest.fixture(params=["sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state/prefixes.db"
    value: str = request.getfixturevalue("redis_url")
    return value


@pytest.fixture
def open_store(url: str) -> Iterator[StoreFactory]:
    """Each call: a new store on the same backend, as another process would open it."""
    opened: list[SharedPrefixStore] = []

    def make() -> SharedPrefixStore:
        store = store_from_url(url)
        assert isinstance(store, SharedPrefixStore)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def test_an_entry_put_by_one_store_is_read_by_another(open_store: StoreFactory) -> None:
    a, b = open_store(), open_store()
    before = b.version
    assert b.get("k") is None
    a.put("k", ENTRY)
    assert b.version != before  # the protocol: version changes when an entry was added
    assert b.get("k") == ENTRY
    assert b.get("k").overrides[5][1]["content"] == "x…"  # type: ignore[union-attr]
    assert b.status()["fetched"] == 1
    b.version  # noqa: B018 - a refresh: the cached copy stays valid
    assert b.get("k") == ENTRY and b.status()["fetched"] == 1


def test_a_replaced_entry_is_fetched_again(open_store: StoreFactory) -> None:
    a, b = open_store(), open_store()
    a.put("k", ENTRY)
    assert b.version and b.get("k") == ENTRY
    newer = PrefixEntry(1, 4, {"role": "user", "content": "harder"}, 3, "cliff", 2)
    a.put("k", newer)
    b.version  # noqa: B018
    assert b.get("k") == newer


def test_engines_on_two_stores_send_the_same_compacted_prefix(open_store: StoreFactory) -> None:
    """Engine A compacts a history; engine B (another process's store) gets the history
    grown by a turn and must send the same compacted prefix, read from the store."""
    history = chat_history(12)
    a, b = open_store(), open_store()

    def engine(store: SharedPrefixStore) -> Engine:
        return Engine("cliff", "openai_chat", Budget(trigger_tokens=3000, target_tokens=1500),
                      counter="chars", store=store)

    first = engine(a).compact(history)
    assert first.compacted
    second = engine(b).compact(history + chat_history(13)[len(history):])
    assert not second.compacted  # substituted, not compacted again
    assert second.messages[:len(first.messages)] == first.messages
    assert b.status()["fetched"] == 1


def test_a_message_that_is_not_json_names_its_type_never_its_content(
        open_store: StoreFactory) -> None:
    class FrameworkMessage:
        content = "secret-content"

    store = open_store()
    with pytest.raises(StoreError, match="FrameworkMessage") as err:
        store.put("k", PrefixEntry(0, 2, FrameworkMessage(), 3, "cliff"))
    assert "secret" not in str(err.value)
    with pytest.raises(StoreError, match="type str") as err:
        store.put("k", PrefixEntry(0, 2, {"content": "secret\ud800"}, 3, "cliff"))
    assert "secret" not in str(err.value)
    assert store.get("k") is None


def test_sqlite_files_are_private(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path}/new/prefixes.db")
    store.put("k", ENTRY)
    folder = tmp_path / "new"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["prefixes.db", "prefixes.db-shm", "prefixes.db-wal"]
    for p in folder.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name
    assert store_from_url(f"sqlite:///{folder}/prefixes.db").get("k") == ENTRY


def test_sqlite_keeps_the_last_max_entries(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path}/p.db?max_entries=64")
    for i in range(200):
        store.put(f"k{i}", ENTRY)
    other = store_from_url(f"sqlite:///{tmp_path}/p.db")
    assert other.get("k0") is None and other.get("k199") == ENTRY
    assert 64 <= len(other) <= 128


def test_sqlite_locked_by_another_process_is_fail_open(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "p.db"
    store = SharedPrefixStore(SQLiteBackend(path, timeout=0.05), retry_after=0.0)
    store.put("before", ENTRY)
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with caplog.at_level(logging.WARNING, "agentcompact.stores"):
            store.put("during", ENTRY)  # no exception: kept locally
            store.put("during2", ENTRY)
        assert store.get("during") == ENTRY
        status = store.status()
        assert status["failures"] >= 2 and not status["available"]
        assert status["pending_write_back"] == 2
        assert status["last_error"] == "save: OperationalError"
        warnings = [r for r in caplog.records if "failed" in r.getMessage()]
        assert len(warnings) == 1 and "compacting locally" in warnings[0].getMessage()
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    store.version  # noqa: B018 - the backend answers: entries written back
    assert store.status()["written_back"] == 2 and store.status()["available"]
    assert store_from_url(f"sqlite:///{path}").get("during2") == ENTRY


def test_sqlite_first_open_waits_for_another_connections_write(tmp_path: Path) -> None:
    """Switching a file to WAL while another connection is writing to it: SQLite answers
    ``database is locked`` at once, without its busy wait (two processes opening one new
    store file at once hit this: a CI run of the concurrent-writers test); the opening
    waits and retries."""
    path = tmp_path / "p.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE other (x)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO other VALUES (1)")
    done = threading.Timer(0.2, lambda: writer.execute("COMMIT"))
    done.start()
    try:
        backend = SQLiteBackend(path, timeout=5.0)
        backend.save("k", b"entry")  # raised OperationalError before
        assert backend.load("k") == b"entry"
    finally:
        done.join()
        writer.close()
    backend.close()


def test_sqlite_busy_errors_are_told_from_other_operational_errors(tmp_path: Path) -> None:
    """The opening retries "database is locked" only: SQLite's busy and locked codes,
    their extended codes, and on Python 3.10 (no ``sqlite_errorcode``) SQLite's text."""
    path = tmp_path / "b.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as locked:
        other.execute("SELECT * FROM t")
    holder.execute("COMMIT")
    with pytest.raises(sqlite3.OperationalError) as missing:
        other.execute("SELECT * FROM absent")
    holder.close()
    other.close()
    assert _busy(locked.value)
    assert not _busy(missing.value)
    extended = sqlite3.OperationalError("database is locked")
    extended.sqlite_errorcode = 517  # SQLITE_BUSY_SNAPSHOT
    assert _busy(extended)
    assert _busy(sqlite3.OperationalError("database is locked"))  # 3.10: no code
    assert not _busy(sqlite3.OperationalError("disk I/O error"))


def test_redis_down_and_back(redis_server: RedisServer, redis_url: str) -> None:
    store = store_from_url(redis_url + "?retry_after=0")
    other = store_from_url(redis_url)
    assert isinstance(store, SharedPrefixStore)
    store.put("k", ENTRY)
    other.put("theirs", ENTRY)
    assert store.version  # knows "theirs", has not fetched it
    redis_server.stop()
    try:
        assert store.get("k") == ENTRY  # from this process's cache
        assert store.get("theirs") is None  # cannot be fetched now: a miss, no error
        store.put("down", ENTRY)
        engine = Engine("cliff", "openai_chat", Budget(trigger_tokens=3000, target_tokens=1500),
                        counter="chars", store=store)
        assert engine.compact(chat_history(12)).compacted  # compacts locally
        assert store.status()["failures"] >= 1 and not store.status()["available"]
        pending = store.status()["pending_write_back"]
        assert pending >= 2
    finally:
        redis_server.start()
    store.version  # noqa: B018
    assert store.status()["written_back"] == pending
    assert store.get("theirs") is None  # the server restarted empty: lost with it
    assert store_from_url(redis_url).get("down") == ENTRY


def test_redis_unreachable_from_the_start() -> None:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    store = store_from_url(f"redis://127.0.0.1:{free_port()}/0?timeout=0.2")
    engine = Engine("cliff", "openai_chat", budget=Budget(trigger_tokens=3000, target_tokens=1500),
                    counter="chars", store=store)
    history = chat_history(12)
    first = engine.compact(history)
    assert first.compacted
    # the process stays consistent with itself: the prefix is reused from its cache
    grown = engine.compact(history + chat_history(13)[len(history):])
    assert grown.messages[:len(first.messages)] == first.messages
    assert isinstance(store, SharedPrefixStore) and store.status()["failures"] >= 1


def test_redis_lost_its_data(redis_server: RedisServer, redis_url: str) -> None:
    """A server restarted without persistence: the counter went back; a full re-read."""
    a, b = store_from_url(redis_url), store_from_url(redis_url)
    a.put("k", ENTRY)
    assert b.version and b.get("k") == ENTRY
    redis_server.flush()
    a.put("k2", ENTRY)  # counter 1 again, below what b saw
    b.version  # noqa: B018
    assert b.get("k2") == ENTRY and b.get("k") == ENTRY  # k: b's own cache
    assert store_from_url(redis_url).get("k") is None  # gone from the server


def test_damaged_bytes_are_a_miss(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    store = store_from_url(f"sqlite:///{path}")
    backend = SQLiteBackend(path)
    backend.save("bad", b"{not json")
    backend.save("old", b'{"f": 0}')
    assert store.version and store.get("bad") is None and store.get("old") is None
    assert isinstance(store, SharedPrefixStore) and store.status()["undecodable"] == 2


@pytest.mark.parametrize(("url", "match"), [
    ("mongodb://x", "scheme 'mongodb'"),
    ("sqlite:///p.db?colour=red", "unknown option"),
    ("sqlite:p.db", "sqlite:///PATH"),
    ("sqlite:///p.db?max_entries=many", "option max_entries must be an integer"),
])
def test_bad_urls(url: str, match: str, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=match):
        store_from_url(url)


def test_redis_where_has_no_password() -> None:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    store = store_from_url(f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    assert isinstance(store, SharedPrefixStore)
    assert "hunter2" not in str(store.status())
    assert store.status()["where"].startswith("redis://127.0.0.1:")


def test_memory_url() -> None:
    store = store_from_url("memory:")
    store.put("k", ENTRY)
    assert store.get("k") == ENTRY and not os.environ.get("NOTHING_WRITTEN")


def test_proxy_store_flag_and_environment(tmp_path: Path) -> None:
    from agentcompact.integrations.proxy import ProxyConfig, create_app
    from agentcompact.integrations.proxy._cli import _add_arguments, build_config

    config = ProxyConfig.from_env({"AGENTCOMPACT_STORE": f"sqlite:///{tmp_path}/p.db"})
    app = create_app(config)
    assert isinstance(app.state.proxy.store, SharedPrefixStore)
    parser = argparse.ArgumentParser()
    _add_arguments(parser)
    assert build_config(parser.parse_args(["--store", "memory:"])).store == "memory:"
    with pytest.raises(StoreError, match="scheme 'mongodb'"):  # cli.run: exit status 2
        create_app(config.replace(store="mongodb://x"))


def test_concurrent_writers_leave_whole_entries(open_store: StoreFactory) -> None:
    """Two writers (own connections, as two processes) each put their own entry under the
    same 150 keys at once: every entry read back is whole, one of the two written."""
    writers = [open_store(), open_store()]
    entries = {w: PrefixEntry(1, 4, {"role": "user", "content": f"writer {w} " * 200}, 9,
                              "cliff") for w in range(2)}

    def write(w: int) -> None:
        for i in range(150):
            writers[w].put(f"k{i}", entries[w])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader = open_store()
    assert reader.version
    for i in range(150):
        assert reader.get(f"k{i}") in entries.values()
    assert all(w.status()["failures"] == 0 for w in writers)
