"""The SQLite backend: one file (WAL mode) several processes on one machine share.

Tables: ``prefix_entries(key, seq, data)`` and ``prefix_meta(name, value)`` holding the
change counter ``seq``. A save is one ``BEGIN IMMEDIATE`` transaction that advances the
counter and writes the row with it, so a reader sees a whole entry or none, and "keys saved
after counter n" is ``seq > n`` on an index. Rows older than the last ``max_entries`` saves
are deleted (the store is a cache). The file, its ``-wal`` and ``-shm`` are created 0600,
a folder made for it 0700.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

__all__ = ["SQLiteBackend"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS prefix_entries (
    key TEXT PRIMARY KEY, seq INTEGER NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS prefix_entries_seq ON prefix_entries(seq);
CREATE TABLE IF NOT EXISTS prefix_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO prefix_meta VALUES ('seq', 0);
"""


class SQLiteBackend:
    """``Backend`` on a SQLite file (see the module docstring).

    :param path: the database file (created 0600 if missing).
    :param max_entries: rows kept: those of the last ``max_entries`` saves.
    :param timeout: seconds to wait for another process's write lock.
    """

    name = "sqlite"
    errors: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)

    def __init__(self, path: str | os.PathLike[str], *, max_entries: int = 100_000,
                 timeout: float = 5.0) -> None:
        self.path = Path(path)
        self.max_entries = max_entries
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, mode=0o700)
        # created 0600 before SQLite opens it: SQLite gives -wal and -shm the same mode
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; a cache
        try:
            self._db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            self._db.close()
            raise

    def load(self, key: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT data FROM prefix_entries WHERE key = ?",
                                   (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def save(self, key: str, data: bytes) -> None:
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                (seq,) = db.execute("UPDATE prefix_meta SET value = value + 1 "
                                    "WHERE name = 'seq' RETURNING value").fetchone()
                db.execute("INSERT OR REPLACE INTO prefix_entries VALUES (?, ?, ?)",
                           (key, seq, data))
                if seq > self.max_entries and seq % 64 == 0:
                    db.execute("DELETE FROM prefix_entries WHERE seq <= ?",
                               (seq - self.max_entries,))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def changes(self, since: int | None) -> tuple[int, list[str] | None]:
        with self._lock:
            db = self._db
            db.execute("BEGIN")  # one snapshot for the counter and the keys
            try:
                (seq,) = db.execute("SELECT value FROM prefix_meta WHERE name = 'seq'"
                                    ).fetchone()
                if since is None or since > seq:  # new file, or another file swapped in
                    return seq, None
                if since == seq:
                    return seq, []
                rows = db.execute("SELECT key FROM prefix_entries WHERE seq > ?",
                                  (since,)).fetchall()
                return seq, [r[0] for r in rows]
            finally:
                db.execute("COMMIT")

    def keys(self) -> tuple[int, list[str]]:
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                (seq,) = db.execute("SELECT value FROM prefix_meta WHERE name = 'seq'"
                                    ).fetchone()
                rows = db.execute("SELECT key FROM prefix_entries").fetchall()
                return seq, [r[0] for r in rows]
            finally:
                db.execute("COMMIT")

    def describe(self) -> str:
        return f"sqlite:///{self.path}"

    def close(self) -> None:
        with self._lock:
            self._db.close()
