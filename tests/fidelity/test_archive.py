"""The archive: SQLite file (WAL, 0600) read back after a restart by another process;
the in-memory one; expand pages and search."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agentcompact import expand, expand_text, search_dropped
from agentcompact._archive import (
    ArchivedItem,
    MemoryArchive,
    SQLiteArchive,
    handle_of,
    is_handle,
    open_archive,
)
from agentcompact.errors import ArchiveError, ConfigError

TEXT = "".join(f"{i:05d} ünïcode \U0001f600 line\n" for i in range(3_000))


def test_handle_is_a_content_digest() -> None:
    assert handle_of(TEXT) == handle_of(TEXT[:]) != handle_of(TEXT + " ")
    assert is_handle(handle_of(TEXT)) and not is_handle("ac-xyz")


def test_sqlite_archive_survives_a_restart_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "new" / "archive.sqlite"
    archive = SQLiteArchive(path)
    archive.put_many([ArchivedItem(handle_of(TEXT), TEXT, "[skim]")])
    archive.put_many([ArchivedItem(handle_of(TEXT), "not overwritten", "")])
    archive.close()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for file in path.parent.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file.name
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    code = ("import sys; from agentcompact._archive import SQLiteArchive; "
            "from agentcompact._expand import expand; "
            "sys.stdout.buffer.write(expand(SQLiteArchive(sys.argv[1]), sys.argv[2], 0, "
            "10**6).text.encode('utf-8', 'surrogatepass'))")
    out = subprocess.run([sys.executable, "-c", code, str(path), handle_of(TEXT)],
                         capture_output=True, check=True, env={**os.environ}).stdout
    assert out.decode("utf-8") == TEXT


def test_open_archive_specs(tmp_path: Path) -> None:
    assert open_archive(False) is None
    assert isinstance(open_archive(None), MemoryArchive)
    path = tmp_path / "a.sqlite"
    first = open_archive(str(path))
    assert first is open_archive(path) and isinstance(first, SQLiteArchive)  # one per file
    mine = MemoryArchive()
    assert open_archive(mine) is mine
    with pytest.raises(ConfigError, match="archive must be"):
        open_archive(42)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_expand_pages_and_search(kind: str, tmp_path: Path) -> None:
    archive = MemoryArchive() if kind == "memory" else SQLiteArchive(tmp_path / "x.sqlite")
    handle = handle_of(TEXT)
    archive.put_many([ArchivedItem(handle, TEXT, "[turn 1 · skim]"),
                      ArchivedItem(handle_of("other"), "other text", "")])
    pages, offset = [], 0
    while True:
        page = expand(archive, handle, offset, 7_000)
        pages.append(page.text)
        if page.next_offset is None:
            break
        offset = page.next_offset
    assert "".join(pages) == TEXT and len(pages) == -(-len(TEXT) // 7_000)
    hits = search_dropped(archive, "02999 ÜNÏCODE")
    assert [h.handle for h in hits] == [handle] and "02999 ünïcode" in hits[0].excerpt
    assert search_dropped(archive, "nowhere") == []
    with pytest.raises(ArchiveError, match="unknown handle"):
        expand(archive, "ac-000000000000")
    with pytest.raises(ArchiveError, match="not a handle"):
        expand(archive, "hello")
    with pytest.raises(ArchiveError, match="offset must be"):
        expand(archive, handle, len(TEXT) + 1)
    assert expand_text(archive, handle, 0, 50).startswith(
        f"[agentcompact expand {handle}: chars 0-50 of {len(TEXT)}; more: expand(")
