"""The SQLite store's bounded growth: a size and an age bound, least recently used rows
evicted first (archived originals by their last archiving or expansion, prefix entries by
their last save), in the background as writes find the file over its bound, or at once by
``agentcompact store prune``; ``agentcompact store stats`` reports it."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from agentcompact._archive import SharedArchive, handle_of
from agentcompact._cli import main
from agentcompact.stores import SharedPrefixStore, store_from_url
from agentcompact.stores._sqlite_store import (
    DEFAULT_MAX_AGE_DAYS,
    DEFAULT_MAX_BYTES,
    DEFAULT_TIMEOUT,
    SQLiteBackend,
)
from tests.scale.test_stores import ENTRY

KIB = 1024


def text(i: int, size: int = 4000) -> str:
    return f"output {i} " + "x" * size


def fill(backend: SQLiteBackend, n: int, size: int = 4000) -> list[str]:
    handles = [handle_of(text(i, size)) for i in range(n)]
    for i, h in enumerate(handles):
        backend.archive_put([(h, text(i, size), "")])
    return handles


def wait_for_eviction(backend: SQLiteBackend) -> None:
    """Until the background eviction the writes started is over."""
    with backend._pruning:  # held by the eviction thread while it runs
        pass


def live_bytes(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * db.execute("PRAGMA page_size").fetchone()[0])
    finally:
        db.close()


def test_defaults_are_documented_figures(tmp_path: Path) -> None:
    assert DEFAULT_MAX_BYTES == 512 * 1024 * 1024 and DEFAULT_MAX_AGE_DAYS == 30
    assert DEFAULT_TIMEOUT == 0.5
    store = store_from_url(f"sqlite:///{tmp_path}/s.db")
    backend = store.backend  # type: ignore[attr-defined]
    assert (backend.max_bytes, backend.max_age_days, backend.timeout) == (
        DEFAULT_MAX_BYTES, DEFAULT_MAX_AGE_DAYS, DEFAULT_TIMEOUT)
    set_by_url = store_from_url(f"sqlite:///{tmp_path}/s.db?max_bytes=2GB&max_age_days=7"
                                "&timeout=0.25").backend  # type: ignore[attr-defined]
    assert (set_by_url.max_bytes, set_by_url.max_age_days, set_by_url.timeout) == (
        2 * 1000**3, 7, 0.25)
    assert not list(tmp_path.iterdir())  # opened on first use only


def test_the_file_stops_growing_at_its_size_bound(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    backend = SQLiteBackend(path, max_bytes=256 * KIB)
    handles = fill(backend, 400)  # ~1.6 MB of originals written
    wait_for_eviction(backend)
    backend.prune()  # whatever the last writes added since the last check
    assert live_bytes(path) <= 256 * KIB
    assert backend.archive_get(handles[-1]) is not None  # the newest are kept
    assert backend.archive_get(handles[0]) is None  # the oldest went first


def test_prefix_entries_and_originals_share_the_bound_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    backend = SQLiteBackend(path, max_bytes=0)
    store = SharedPrefixStore(backend)
    store.put("old-prefix", ENTRY)
    handles = fill(backend, 60)
    db = sqlite3.connect(path, isolation_level=None)
    now = int(time.time())
    db.execute("UPDATE prefix_entries SET used = ?", (now - 1000,))
    db.execute("UPDATE dropped SET used = ? + seq", (now - 500,))
    db.close()
    removed = backend.prune(max_bytes=live_bytes(path) // 2)
    assert removed["prefix_entries"] == 1 and removed["dropped"] > 0
    assert backend.load("old-prefix") is None
    assert backend.archive_get(handles[-1]) is not None


def test_an_expanded_original_is_evicted_last(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    backend = SQLiteBackend(path, max_bytes=0)
    handles = fill(backend, 40)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE dropped SET used = ? + seq", (int(time.time()) - 10_000,))
    db.close()
    archive = SharedArchive(backend)
    assert archive.get(handles[0]) is not None  # the oldest, expanded now
    backend.prune(max_bytes=live_bytes(path) // 3)
    assert backend.archive_get(handles[0]) is not None
    assert backend.archive_get(handles[1]) is None


def test_rows_unused_past_the_age_bound_go(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    backend = SQLiteBackend(path, max_age_days=30)
    handles = fill(backend, 10)
    store = SharedPrefixStore(backend)
    store.put("recent", ENTRY)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE dropped SET used = ? WHERE seq <= 5", (int(time.time()) - 31 * 86_400,))
    db.close()
    removed = backend.prune()
    assert removed == {"prefix_entries": 0, "dropped": 5}
    assert [backend.archive_get(h) is not None for h in handles] == [False] * 5 + [True] * 5
    assert backend.load("recent") is not None


def test_a_file_written_before_the_bounds_gets_them(tmp_path: Path) -> None:
    """A store file of the layout without ``used`` columns: opened, its rows count as
    used at the opening (the whole age bound ahead of them)."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript("""
        PRAGMA journal_mode=WAL;
        CREATE TABLE prefix_entries (key TEXT PRIMARY KEY, seq INTEGER NOT NULL,
                                     data BLOB NOT NULL);
        CREATE TABLE prefix_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
        INSERT INTO prefix_meta VALUES ('seq', 1);
        INSERT INTO prefix_entries VALUES ('k', 1, x'7b7d');
        CREATE TABLE dropped (seq INTEGER PRIMARY KEY AUTOINCREMENT, handle TEXT NOT NULL
                              UNIQUE, text TEXT NOT NULL, skim TEXT NOT NULL DEFAULT '');
        INSERT INTO dropped (handle, text, skim) VALUES ('ac-000000000000', 'old', '');
    """)
    db.close()
    backend = SQLiteBackend(path)
    backend.save("k2", b"{}")
    assert backend.prune() == {"prefix_entries": 0, "dropped": 0}
    stats = backend.stats()
    assert stats["prefixes"]["rows"] == 2 and stats["archive"]["rows"] == 1
    assert stats["archive"]["oldest_use"] >= int(time.time()) - 60


# ------------------------------------------------------------------------------- the CLI


def test_store_stats_and_prune_from_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "state" / "store.sqlite"
    backend = SQLiteBackend(path, max_bytes=0)
    fill(backend, 50)
    SharedPrefixStore(backend).put("p", ENTRY)
    backend.close()
    assert main(["store", "stats", "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["archive"]["rows"] == 50 and before["prefixes"]["rows"] == 1
    assert before["max_bytes"] == DEFAULT_MAX_BYTES and before["live_bytes"] > 100 * KIB
    assert main(["store", "prune", "--store", f"sqlite:///{path}", "--max-bytes", "64KiB",
                 "--vacuum"]) == 0
    out = capsys.readouterr().out
    assert "pruned:" in out and "archived originals" in out
    assert path.stat().st_size <= 64 * KIB + 8 * KIB  # vacuumed to what it holds


@pytest.mark.parametrize("argv, message", [
    (["store", "stats", "--store", "sqlite:///{tmp}/absent.db"], "no store at"),
    (["store", "prune", "--store", "sqlite:///{tmp}/absent.db"], "no store at"),
    (["store", "stats", "--store", "postgres://h/db"], "store URL scheme 'postgres'"),
    (["store", "prune", "--store", "sqlite:///{tmp}/s.db", "--max-bytes", "lots"], "not a size"),
])
def test_store_command_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           argv: list[str], message: str) -> None:
    existing = SQLiteBackend(tmp_path / "s.db")
    existing.save("k", b"{}")
    existing.close()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main([a.format(tmp=tmp_path) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("agentcompact store: ") and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created


def test_store_stats_of_a_redis_store(redis_url: str, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    pytest.importorskip("redis", reason="the redis extra is not installed")
    url = redis_url + "?prefix=bounds-cli:"
    store_from_url(url).put("k", ENTRY)
    assert main(["store", "stats", "--store", url, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["prefixes"]["logged"] == 1 and stats["ttl"] == 7 * 24 * 3600
    assert main(["store", "prune", "--store", url]) == 0  # the server bounds itself
    assert "pruned: 0 prefix entries, 0 archived originals" in capsys.readouterr().out
