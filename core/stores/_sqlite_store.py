"""The SQLite backend: one file (WAL mode) several processes on one machine share.

Tables: ``prefix_entries(key, seq, data, used)`` and ``prefix_meta(name, value)`` holding
the change counter ``seq`` (the prefix store), and ``dropped(seq, handle, text, skim, used)``
(the archive of dropped originals, ``agentcompact._archive``; a tenant's rows keyed
``t:<tenant>:<handle>``): the two never share a row. A
prefix save is one ``BEGIN IMMEDIATE`` transaction that advances the counter and writes the
row with it, so a reader sees a whole entry or none, and "keys saved after counter n" is
``seq > n`` on an index; an archive write is one transaction too. Prefix rows older than
the last ``max_entries`` saves are deleted (the store is a cache). The file, its ``-wal``
and ``-shm`` are created 0600, a folder made for it 0700.

**Deadlines.** Reads and writes go through two connections, each behind its own lock: in
WAL mode a reader never waits for a writer, so while another process holds the file's write
lock (a second replica, ``sqlite3``, a ``VACUUM``) lookups go on and only writes wait. No
call waits longer than ``timeout`` (default ``DEFAULT_TIMEOUT``) in all, for this process's
lock and SQLite's busy wait together; past it the call raises one of ``errors``, which the
stores built on it (``SharedPrefixStore``, ``SharedArchive``) turn into fail-open.

**Bounded growth.** The file holds at most ``max_bytes`` of live pages (default
``DEFAULT_MAX_BYTES``) and nothing unused for ``max_age_days`` (default
``DEFAULT_MAX_AGE_DAYS``): past either bound the least recently used rows go first —
archived originals by their last archiving or expansion, prefix entries by their last save
(a cache: an evicted one is computed again, identically). Eviction runs in a background
thread, a few hundred rows per short transaction, when a write finds the file over its
bound (checked every ``_CHECK_EVERY`` writes, and at most hourly for age); ``prune()``
runs it at once (``agentcompact store prune``). Freed pages are reused, not returned: the
file stops growing at its bound (``prune(vacuum=True)`` shrinks it).

The file is opened on first use, not in the constructor: a file that cannot be created
or opened (a read-only folder, a full disk) makes each call raise one of ``errors``.
Two connections opening a new file at once can each be refused its switch to WAL (SQLite
answers ``database is locked`` at once there, without its busy wait): the opening is
retried until ``timeout``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ._shared import ArchiveRow

__all__ = ["DEFAULT_MAX_AGE_DAYS", "DEFAULT_MAX_BYTES", "DEFAULT_TIMEOUT", "SQLiteBackend"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 0.5
"""Seconds a call may wait for the file's locks before it fails (fail-open)."""
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
"""Live bytes the file holds at most (prefix entries and archived originals together)."""
DEFAULT_MAX_AGE_DAYS = 30.0
"""Days a row unused (not saved, archived or expanded again) is kept."""

_BUSY, _LOCKED = 5, 6  # SQLite's primary result codes SQLITE_BUSY, SQLITE_LOCKED
_CHECK_EVERY = 32  # writes between two checks of the size bound (3 pragmas)
_AGE_CHECK_S = 3600.0
_LOW_WATER = 0.9  # eviction brings the file down to this share of max_bytes
_BATCH = 256  # rows per eviction transaction: the write lock is held milliseconds
_DAY = 86_400.0


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
# ``used`` (unix seconds of the last use) came after the tables: added to older files
_USED = {"prefix_entries": "prefix_entries_used", "dropped": "dropped_used"}


class _Connection:
    """One connection to the file and the lock its calls take turns on."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.db: sqlite3.Connection | None = None


class SQLiteBackend:
    """``Backend`` on a SQLite file (see the module docstring), with the archive's rows.

    :param path: the database file (created 0600 if missing, on first use).
    :param max_entries: prefix rows kept: those of the last ``max_entries`` saves.
    :param timeout: seconds a call may wait for locks (this process's and the file's).
    :param max_bytes: live bytes the file holds at most (0: no bound).
    :param max_age_days: days an unused row is kept (0: no bound).
    """

    name = "sqlite"
    errors: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)

    def __init__(self, path: str | os.PathLike[str], *, max_entries: int = 100_000,
                 timeout: float = DEFAULT_TIMEOUT, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_age_days: float = DEFAULT_MAX_AGE_DAYS) -> None:
        self.path = Path(path)
        self.max_entries = max_entries
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_age_days = max_age_days
        self._reader, self._writer = _Connection(), _Connection()
        self._writes = 0
        self._aged_at: float | None = None  # when eviction last applied the age bound
        self._pruning = threading.Lock()  # one eviction at a time

    # --- connections ----------------------------------------------------------------
    @contextlib.contextmanager
    def _using(self, conn: _Connection) -> Iterator[sqlite3.Connection]:
        """``conn``'s connection (opened on first use) under its lock, within ``timeout``
        for the lock and SQLite's busy wait together."""
        t0 = time.monotonic()
        if not conn.lock.acquire(timeout=self.timeout):
            raise TimeoutError(f"sqlite store busy in this process for {self.timeout} s")
        try:
            if conn.db is None:
                conn.db = self._open(write=conn is self._writer)
            left = self.timeout - (time.monotonic() - t0)
            if left < self.timeout - 0.001:  # the lock took some: SQLite gets the rest
                conn.db.execute(f"PRAGMA busy_timeout = {max(1, int(left * 1000))}")
                try:
                    yield conn.db
                finally:
                    conn.db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            else:
                yield conn.db
        finally:
            conn.lock.release()

    def _open(self, *, write: bool) -> sqlite3.Connection:
        deadline = time.monotonic() + self.timeout
        delay = 0.002
        while True:
            try:
                return self._open_once(write)
            except sqlite3.OperationalError as exc:
                # SQLite refuses a lock it sees would deadlock without calling the busy
                # handler (two connections switching one new file to WAL): wait and retry
                if not _busy(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _open_once(self, write: bool) -> sqlite3.Connection:
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        # created 0600 before SQLite opens it: SQLite gives -wal and -shm the same mode.
        # Only a new file: closing a descriptor of a file this process has open in SQLite
        # would drop every POSIX lock the process holds on it (fcntl locks are per
        # process), the other connections' included (a reader then gets "disk I/O error")
        if not self.path.exists():
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        if self.path.stat().st_mode & 0o077:
            os.chmod(self.path, 0o600)
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                             check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; a cache
            db.create_function("casefold", 1, _casefold, deterministic=True)
            # the reader of a file with its tables never takes the write lock: it opens
            # while another process holds it
            if write or not _has_tables(db):
                _ensure_schema(db)
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

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``) on the writer, committed on exit."""
        with self._using(self._writer) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction on the reader: one snapshot for several statements."""
        with self._using(self._reader) as db:
            db.execute("BEGIN")
            try:
                yield db
            finally:
                db.execute("COMMIT")

    # --- prefix entries -----------------------------------------------------------
    def load(self, key: str) -> bytes | None:
        with self._using(self._reader) as db:
            row = db.execute("SELECT data FROM prefix_entries WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def save(self, key: str, data: bytes) -> None:
        with self._transaction() as db:
            (seq,) = db.execute("UPDATE prefix_meta SET value = value + 1 "
                                "WHERE name = 'seq' RETURNING value").fetchone()
            db.execute("INSERT OR REPLACE INTO prefix_entries (key, seq, data, used) "
                       "VALUES (?, ?, ?, ?)", (key, seq, data, int(time.time())))
            if seq > self.max_entries and seq % 64 == 0:
                db.execute("DELETE FROM prefix_entries WHERE seq <= ?",
                           (seq - self.max_entries,))
        self._wrote()

    def changes(self, since: int | None) -> tuple[int, list[str] | None]:
        with self._snapshot() as db:  # one snapshot for the counter and the keys
            (seq,) = db.execute("SELECT value FROM prefix_meta WHERE name = 'seq'").fetchone()
            if since is None or since > seq:  # new file, or another file swapped in
                return seq, None
            if since == seq:
                return seq, []
            rows = db.execute("SELECT key FROM prefix_entries WHERE seq > ?",
                              (since,)).fetchall()
            return seq, [r[0] for r in rows]

    def keys(self) -> tuple[int, list[str]]:
        with self._snapshot() as db:
            (seq,) = db.execute("SELECT value FROM prefix_meta WHERE name = 'seq'").fetchone()
            rows = db.execute("SELECT key FROM prefix_entries").fetchall()
            return seq, [r[0] for r in rows]

    # --- archived originals -------------------------------------------------------
    # A tenant's rows are keyed ``t:<tenant>:<handle>`` (``scope``), the single tenant's
    # by the handle alone (``ac-…``): a scope is a range of the unique index on handle.
    def archive_put(self, rows: Sequence[ArchiveRow], scope: str = "") -> None:
        """Insert the rows whose handle is new, in one transaction; a handle stored
        already is marked used now."""
        now = int(time.time())
        with self._transaction() as db:
            db.executemany("INSERT INTO dropped (handle, text, skim, used) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT(handle) DO UPDATE SET used = excluded.used",
                           [(_key(scope, h), _utf8(t), _utf8(s), now) for h, t, s in rows])
        self._wrote()

    def archive_touch(self, handles: Sequence[str], scope: str = "") -> None:
        """Mark archived originals used now (expanded): eviction takes them last."""
        now = int(time.time())
        with self._transaction() as db:
            db.executemany("UPDATE dropped SET used = ? WHERE handle = ?",
                           [(now, _key(scope, h)) for h in handles])

    def archive_get(self, handle: str, scope: str = "") -> ArchiveRow | None:
        with self._using(self._reader) as db:
            row = db.execute("SELECT text, skim FROM dropped WHERE handle = ?",
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
        with self._using(self._reader) as db:
            rows = db.execute(
                f"SELECT handle, text, skim FROM dropped WHERE {column} >= ? AND {column} < ? "
                "AND instr(casefold(text), ?) > 0 ORDER BY seq DESC LIMIT ?",
                (lo, hi, _utf8(query.casefold()), max(0, limit))).fetchall()
        return [(r[0][len(lo):] if scope else r[0], _str(r[1]), _str(r[2])) for r in rows]

    def archive_count(self, scope: str = "") -> int:
        with self._using(self._reader) as db:
            return int(db.execute(
                "SELECT count(*) FROM dropped WHERE handle >= ? AND handle < ?",
                _range(scope)).fetchone()[0])

    # --- bounds -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Rows, bytes and ages of both tables, the file's sizes and its bounds."""
        with self._snapshot() as db:
            tables = {"prefixes": _table_stats(db, "prefix_entries", "length(data)"),
                      "archive": _table_stats(db, "dropped", "length(text) + length(skim)")}
            live = _live_bytes(db)
        files = sum(p.stat().st_size for p in _files(self.path) if p.exists())
        return {"where": self.describe(), "live_bytes": live, "file_bytes": files,
                "max_bytes": self.max_bytes, "max_age_days": self.max_age_days, **tables}

    def prune(self, *, max_bytes: int | None = None, max_age_days: float | None = None,
              vacuum: bool = False) -> dict[str, int]:
        """Evict what is over the bounds now (least recently used first), waiting for an
        eviction under way; ``vacuum`` then rewrites the file to its live size. Returns
        the rows removed per table."""
        with self._pruning:
            removed = self._evict(self.max_bytes if max_bytes is None else max_bytes,
                                  self.max_age_days if max_age_days is None else max_age_days)
        if vacuum:
            with self._using(self._writer) as db:
                db.execute("VACUUM")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # into the file, WAL emptied
        return removed

    def _wrote(self) -> None:
        """After a write: every ``_CHECK_EVERY`` writes, start an eviction in the
        background when the file is over a bound."""
        self._writes += 1
        if self._writes % _CHECK_EVERY or not (self.max_bytes or self.max_age_days):
            return
        aged = self.max_age_days and (self._aged_at is None
                                      or time.monotonic() - self._aged_at > _AGE_CHECK_S)
        if not aged:
            try:
                with self._using(self._reader) as db:
                    if not self.max_bytes or _live_bytes(db) <= self.max_bytes:
                        return
            except self.errors:  # the write is done; the check waits for the next one
                return
        if self._pruning.acquire(blocking=False):
            threading.Thread(target=self._evict_in_background, name="agentcompact-store-prune",
                             daemon=True).start()

    def _evict_in_background(self) -> None:
        try:
            removed = self._evict(self.max_bytes, self.max_age_days)
            if any(removed.values()):
                logger.info("store %s: evicted %d prefix entries and %d archived originals "
                            "(bounds: %d bytes, %g days)", self.describe(),
                            removed["prefix_entries"], removed["dropped"], self.max_bytes,
                            self.max_age_days)
        except self.errors as exc:  # busy or gone: tried again at a later write
            logger.info("store %s: eviction stopped (%s)", self.describe(), type(exc).__name__)
        finally:
            self._pruning.release()

    def _evict(self, max_bytes: int, max_age_days: float) -> dict[str, int]:
        """Delete what is past ``max_age_days`` unused, then the least recently used
        rows until the live bytes are under ``_LOW_WATER`` of ``max_bytes``; in short
        transactions (the caller holds ``_pruning``)."""
        removed = dict.fromkeys(_USED, 0)
        if max_age_days:
            self._aged_at = time.monotonic()
            cutoff = int(time.time() - max_age_days * _DAY)
            for table in _USED:
                while n := self._delete_batch(table, cutoff):
                    removed[table] += n
        while max_bytes:
            with self._using(self._reader) as db:
                live = _live_bytes(db)
                excess = live - int(max_bytes * _LOW_WATER)
                oldest = _oldest_table(db) if excess > 0 else None
                # about the rows holding ``excess`` bytes, at an average row's size
                rows = sum(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in _USED)
            if oldest is None:
                break
            batch = min(_BATCH, max(1, -(-excess * rows // max(live, 1))))
            deleted = self._delete_batch(oldest, None, batch)
            if not deleted:
                break
            removed[oldest] += deleted
        return removed

    def _delete_batch(self, table: str, older_than: int | None, limit: int = _BATCH) -> int:
        """Delete up to ``limit`` of ``table``'s least recently used rows (only those
        used before ``older_than`` when given); the count deleted."""
        where = "" if older_than is None else f"WHERE used < {int(older_than)}"
        with self._transaction() as db:
            cursor = db.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM "
                                f"{table} {where} ORDER BY used, rowid LIMIT {int(limit)})")
            return max(0, cursor.rowcount)

    def describe(self) -> str:
        return f"sqlite:///{self.path}"

    def close(self) -> None:
        for conn in (self._reader, self._writer):
            with conn.lock:
                if conn.db is not None:
                    conn.db.close()
                    conn.db = None


def _has_tables(db: sqlite3.Connection) -> bool:
    return bool(db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                      "('prefix_entries', 'prefix_meta', 'dropped')").fetchone()[0] == 3)


def _ensure_schema(db: sqlite3.Connection) -> None:
    """Create the tables, and the ``used`` columns an older file lacks (its rows count as
    used now: they get the whole age bound)."""
    db.executescript("BEGIN IMMEDIATE;" + _SCHEMA)
    now = int(time.time())
    for table, index in _USED.items():
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if "used" not in columns:
            db.execute(f"ALTER TABLE {table} ADD COLUMN used INTEGER NOT NULL DEFAULT 0")
            db.execute(f"UPDATE {table} SET used = ?", (now,))
        db.execute(f"CREATE INDEX IF NOT EXISTS {index} ON {table}(used)")
    db.execute("COMMIT")


def _live_bytes(db: sqlite3.Connection) -> int:
    """Bytes of the pages in use (the file's pages less its free list)."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    return int((pages - free) * db.execute("PRAGMA page_size").fetchone()[0])


def _oldest_table(db: sqlite3.Connection) -> str | None:
    """The table whose least recently used row is older (``None``: both are empty)."""
    oldest = {t: db.execute(f"SELECT min(used) FROM {t}").fetchone()[0] for t in _USED}
    found = [(used, t) for t, used in oldest.items() if used is not None]
    return min(found)[1] if found else None


def _table_stats(db: sqlite3.Connection, table: str, size: str) -> dict[str, Any]:
    rows, size_sum, oldest, newest = db.execute(
        f"SELECT count(*), coalesce(sum({size}), 0), min(used), max(used) FROM {table}"
    ).fetchone()
    return {"rows": rows, "bytes": size_sum, "oldest_use": oldest, "newest_use": newest}


def _files(path: Path) -> list[Path]:
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]


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
