"""The SQLite backend: one file (WAL mode) several processes on one machine share.

Tables: ``prefix_entries(key, seq, data)`` and ``prefix_meta(name, value)`` holding the
change counter ``seq`` (the prefix store), and ``dropped(seq, handle, text, skim)`` (the
archive of dropped originals, ``agentcompact._archive``; a tenant's rows keyed
``t:<tenant>:<handle>``): the two never share a row. A
prefix save is one ``BEGIN IMMEDIATE`` transaction that advances the counter and writes the
row with it, so a reader sees a whole entry or none, and "keys saved after counter n" is
``seq > n`` on an index; an archive write is one transaction too. Prefix rows older than
the last ``max_entries`` saves are deleted (the store is a cache); archived originals are
kept. The file, its ``-wal`` and ``-shm`` are created 0600, a folder made for it 0700.

The file is opened on first use, not in the constructor: a file that cannot be created
or opened (a read-only folder, a full disk) makes each call raise one of ``errors``, which
the stores built on it turn into fail-open (``SharedPrefixStore``, ``SharedArchive``).
Two connections opening a new file at once can each be refused its switch to WAL (SQLite
answers ``database is locked`` at once there, without its busy wait): the opening is
retried until ``timeout``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ._shared import ArchiveRow

__all__ = ["SQLiteBackend"]

_BUSY, _LOCKED = 5, 6  # SQLite's primary result codes SQLITE_BUSY, SQLITE_LOCKED


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (``SQLITE_BUSY``/``SQLITE_LOCKED``
    or an extended code of either, such as ``SQLITE_BUSY_SNAPSHOT``). Python 3.10 has no
    ``sqlite_errorcode``: there the error's text tells, which is SQLite's for the code."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return str(exc) in ("database is locked", "database table is locked")
    return code & 0xFF in (_BUSY, _LOCKED)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS prefix_entries (
    key TEXT PRIMARY KEY, seq INTEGER NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS prefix_entries_seq ON prefix_entries(seq);
CREATE TABLE IF NOT EXISTS prefix_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO prefix_meta VALUES ('seq', 0);
CREATE TABLE IF NOT EXISTS dropped (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    handle TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    skim TEXT NOT NULL DEFAULT '');
"""

class SQLiteBackend:
    """``Backend`` on a SQLite file (see the module docstring), with the archive's rows.

    :param path: the database file (created 0600 if missing, on first use).
    :param max_entries: prefix rows kept: those of the last ``max_entries`` saves.
    :param timeout: seconds to wait for another process's write lock.
    """

    name = "sqlite"
    errors: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)

    def __init__(self, path: str | os.PathLike[str], *, max_entries: int = 100_000,
                 timeout: float = 5.0) -> None:
        self.path = Path(path)
        self.max_entries = max_entries
        self.timeout = timeout
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    @property
    def _db(self) -> sqlite3.Connection:
        """The connection, opened (file, schema) on first use; call under ``_lock``."""
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        deadline = time.monotonic() + self.timeout
        delay = 0.002
        while True:
            try:
                return self._open_once()
            except sqlite3.OperationalError as exc:
                # SQLite refuses a lock it sees would deadlock without calling the busy
                # handler (two connections switching one new file to WAL): wait and retry
                if not _busy(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _open_once(self) -> sqlite3.Connection:
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        # created 0600 before SQLite opens it: SQLite gives -wal and -shm the same mode
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        if self.path.stat().st_mode & 0o077:
            os.chmod(self.path, 0o600)
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                             check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; a cache
            db.create_function("casefold", 1, _casefold, deterministic=True)
            db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            db.close()
            raise
        for suffix in ("-wal", "-shm"):  # files an older SQLite made with the umask
            companion = self.path.with_name(self.path.name + suffix)
            if companion.exists() and companion.stat().st_mode & 0o077:
                os.chmod(companion, 0o600)
        return db

    # --- prefix entries -----------------------------------------------------------
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

    # --- archived originals -------------------------------------------------------
    # A tenant's rows are keyed ``t:<tenant>:<handle>`` (``scope``), the single tenant's
    # by the handle alone (``ac-…``): a scope is a range of the unique index on handle.
    def archive_put(self, rows: Sequence[ArchiveRow], scope: str = "") -> None:
        """Insert the rows whose handle is new, in one transaction."""
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany("INSERT OR IGNORE INTO dropped (handle, text, skim) "
                               "VALUES (?, ?, ?)",
                               [(_key(scope, h), _utf8(t), _utf8(s)) for h, t, s in rows])
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def archive_get(self, handle: str, scope: str = "") -> ArchiveRow | None:
        with self._lock:
            row = self._db.execute("SELECT text, skim FROM dropped WHERE handle = ?",
                                   (_key(scope, handle),)).fetchone()
        return None if row is None else (handle, _str(row[0]), _str(row[1]))

    def archive_search(self, query: str, limit: int, scope: str = "") -> list[ArchiveRow]:
        """Rows of ``scope`` whose text contains ``query`` case-insensitively, most recent
        first."""
        lo, hi = _range(scope)
        # a tenant's rows: the handle index's range; the single tenant's (most rows, or
        # all): newest first in table order, stopping at ``limit`` (``+`` keeps SQLite off
        # the index, which would read every row and sort them)
        column = "handle" if scope else "+handle"
        with self._lock:
            rows = self._db.execute(
                f"SELECT handle, text, skim FROM dropped WHERE {column} >= ? AND {column} < ? "
                "AND instr(casefold(text), ?) > 0 ORDER BY seq DESC LIMIT ?",
                (lo, hi, _utf8(query.casefold()), max(0, limit))).fetchall()
        return [(r[0][len(lo):] if scope else r[0], _str(r[1]), _str(r[2])) for r in rows]

    def archive_count(self, scope: str = "") -> int:
        with self._lock:
            return int(self._db.execute(
                "SELECT count(*) FROM dropped WHERE handle >= ? AND handle < ?",
                _range(scope)).fetchone()[0])

    def describe(self) -> str:
        return f"sqlite:///{self.path}"

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _key(scope: str, handle: str) -> str:
    return f"t:{scope}:{handle}" if scope else handle


def _range(scope: str) -> tuple[str, str]:
    """The handle column's range holding ``scope``'s rows (``;`` follows ``:``, ``.``
    follows ``-``)."""
    return (f"t:{scope}:", f"t:{scope};") if scope else ("ac-", "ac.")


def _utf8(text: str) -> bytes:
    """Archived text as UTF-8 bytes (a BLOB): lone surrogates kept, as the original had
    them (SQLite's TEXT binding refuses them)."""
    return text.encode("utf-8", "surrogatepass")


def _str(value: str | bytes) -> str:
    """A stored text: a BLOB of ``_utf8``, or TEXT of an archive written before."""
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


def _casefold(text: object) -> bytes:
    """Case-insensitive search beyond ASCII (sqlite's ``lower`` folds ASCII only), as
    UTF-8 bytes: ``instr`` of two BLOBs is a byte search, and UTF-8 keeps substrings."""
    return _utf8(_str(text).casefold()) if isinstance(text, (str, bytes)) else b""
