"""The archive of what compaction left out: originals kept verbatim, found by handle.

Every part the cliff strategy drops or truncates (a tool result, a tool call's arguments,
assistant text) is written here under a **handle** derived from its content digest
(``handle_of``), and the compaction message carries that handle in a skim line. The agent
gets the original back with ``expand(handle)`` (see :mod:`agentcompact._expand`). The same
content always has the same handle, so skim lines are byte-stable between cliffs and
across restarts, and writing an item twice is a no-op.

Two backends:

* :class:`SQLiteArchive` — a SQLite file (WAL journal; the file and its ``-wal``/``-shm``
  companions 0600, a created folder 0700). It survives restarts and can be read by another
  process (the MCP server reads the proxy's archive).
* :class:`MemoryArchive` — a dict, for tests and in-process agents that need no file.

``open_archive(spec)`` turns a strategy setting into an archive: a path (``str`` or
``Path``) opens a SQLite file, ``":memory:"`` or ``None`` a new in-memory archive, an
object with ``put``/``get``/``search`` is used as it is, ``False`` means no archive.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import xxhash

from .errors import ArchiveError, ConfigError

__all__ = [
    "HANDLE_PREFIX",
    "Archive",
    "ArchivedItem",
    "MemoryArchive",
    "SQLiteArchive",
    "handle_of",
    "is_handle",
    "open_archive",
]

HANDLE_PREFIX = "ac-"
_HANDLE_HEX = 12  # 48 bits: no collision expected among a few million archived parts


def handle_of(text: str) -> str:
    """The handle of ``text``: ``ac-`` and the first 12 hex digits of its xxh3-64 digest."""
    digest = xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))
    return HANDLE_PREFIX + digest[:_HANDLE_HEX]


def is_handle(value: str) -> bool:
    """True when ``value`` has the shape of a handle (it may still be unknown)."""
    body = value[len(HANDLE_PREFIX):]
    return (value.startswith(HANDLE_PREFIX) and len(body) == _HANDLE_HEX
            and all(c in "0123456789abcdef" for c in body))


@dataclass(frozen=True, slots=True)
class ArchivedItem:
    """One archived original: its handle, its text verbatim, and its skim line."""

    handle: str
    text: str
    skim: str = ""


@runtime_checkable
class Archive(Protocol):
    """What the cliff strategy and the expand tools need of an archive."""

    def put_many(self, items: Iterable[ArchivedItem]) -> None:
        """Store items (an item already stored under its handle is left as it is)."""
        ...

    def get(self, handle: str) -> ArchivedItem | None:
        """The item stored under ``handle``, or ``None``."""
        ...

    def search(self, query: str, limit: int = 10) -> list[ArchivedItem]:
        """Items whose text contains ``query`` (case-insensitive), most recent first."""
        ...


def _check_item(item: ArchivedItem) -> None:
    if not isinstance(item, ArchivedItem):
        raise ArchiveError(f"archive items must be ArchivedItem, got {type(item).__name__}")
    if not is_handle(item.handle):
        raise ArchiveError("archive item has a malformed handle (expected ac- and 12 hex "
                           "digits)")


class MemoryArchive:
    """An archive in a dict (lost with the process)."""

    def __init__(self) -> None:
        self._items: dict[str, ArchivedItem] = {}
        self._lock = threading.Lock()

    def put_many(self, items: Iterable[ArchivedItem]) -> None:
        with self._lock:
            for item in items:
                _check_item(item)
                self._items.setdefault(item.handle, item)

    def get(self, handle: str) -> ArchivedItem | None:
        return self._items.get(handle)

    def search(self, query: str, limit: int = 10) -> list[ArchivedItem]:
        needle = query.casefold()
        with self._lock:
            items = list(self._items.values())
        hits = [it for it in reversed(items) if needle in it.text.casefold()]
        return hits[:max(0, limit)]

    def __len__(self) -> int:
        return len(self._items)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS dropped (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    handle TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    skim TEXT NOT NULL DEFAULT ''
)
"""


class SQLiteArchive:
    """An archive in a SQLite file (WAL; files 0600, a created folder 0700).

    One connection per archive, shared by threads under a lock; other processes (the MCP
    server beside a proxy) open the same file and see committed items.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            if not self.path.parent.exists():
                self.path.parent.mkdir(parents=True, mode=0o700)
            _touch_private(self.path)
            self._db = sqlite3.connect(self.path, check_same_thread=False,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            self._db.create_function("casefold", 1, _casefold, deterministic=True)
        except (OSError, sqlite3.Error) as exc:
            raise ArchiveError(f"cannot open the archive {str(self.path)!r}: "
                               f"{type(exc).__name__}: {exc}") from exc
        for suffix in ("-wal", "-shm"):
            companion = self.path.with_name(self.path.name + suffix)
            if companion.exists():
                os.chmod(companion, 0o600)
        self._lock = threading.Lock()

    def put_many(self, items: Iterable[ArchivedItem]) -> None:
        rows = []
        for item in items:
            _check_item(item)
            rows.append((item.handle, item.text, item.skim))
        if not rows:
            return
        with self._lock:
            try:
                self._db.executemany(
                    "INSERT OR IGNORE INTO dropped (handle, text, skim) VALUES (?, ?, ?)", rows)
            except sqlite3.Error as exc:
                raise ArchiveError(f"cannot write to the archive {str(self.path)!r}: "
                                   f"{type(exc).__name__}") from exc

    def get(self, handle: str) -> ArchivedItem | None:
        with self._lock:
            row = self._db.execute("SELECT handle, text, skim FROM dropped WHERE handle = ?",
                                   (handle,)).fetchone()
        return ArchivedItem(*row) if row else None

    def search(self, query: str, limit: int = 10) -> list[ArchivedItem]:
        if not query:
            return []
        with self._lock:
            rows = self._db.execute(
                "SELECT handle, text, skim FROM dropped WHERE instr(casefold(text), ?) > 0 "
                "ORDER BY seq DESC LIMIT ?", (query.casefold(), max(0, limit))).fetchall()
        return [ArchivedItem(*r) for r in rows]

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM dropped").fetchone()[0])

    def close(self) -> None:
        """Close the connection (``open_archive`` opens a new one for this path after)."""
        with _open_lock:
            for key, found in list(_open.items()):
                if found is self:
                    del _open[key]
        with self._lock:
            self._db.close()


def _casefold(text: object) -> str:
    """Case-insensitive search beyond ASCII (sqlite's ``lower`` folds ASCII only)."""
    return text.casefold() if isinstance(text, str) else ""


def _touch_private(path: Path) -> None:
    """Create ``path`` 0600 if absent (sqlite would create it with the umask's mode)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)


_open: dict[str, SQLiteArchive] = {}
_open_lock = threading.Lock()


def open_archive(spec: object) -> Archive | None:
    """The archive a strategy setting names (see the module docstring); a path opens one
    ``SQLiteArchive`` per file and process, shared by every strategy naming it."""
    if spec is False:
        return None
    if spec is None or spec == ":memory:":
        return MemoryArchive()
    if isinstance(spec, (str, os.PathLike)):
        key = os.path.realpath(os.path.expanduser(os.fspath(spec)))
        with _open_lock:  # one connection per file and process (a proxy has many engines)
            found = _open.get(key)
            if found is None:
                found = _open[key] = SQLiteArchive(key)
        return found
    if isinstance(spec, Archive):
        return spec
    raise ConfigError(f"archive must be a path, ':memory:', False or an object with "
                      f"put_many/get/search; got {type(spec).__name__}")
