"""The archive of what compaction left out: originals kept verbatim, found by handle.

Every part the cliff strategy drops or truncates (a tool result, a tool call's arguments,
assistant text) is written here under a **handle** derived from its content digest
(``handle_of``), and the compaction message carries that handle in a skim line. The agent
gets the original back with ``expand(handle)`` (see :mod:`agentcompact._expand`). The same
content always has the same handle, so skim lines are byte-stable between cliffs and
across restarts, and writing an item twice is a no-op.

The backends are the prefix store's (``agentcompact.stores``), selected by the same URL:

* :class:`SharedArchive` — on a SQLite file or a Redis server (``redis://``: replicas
  expand what any of them dropped); fail-open like the prefix store.
* :class:`SQLiteArchive` — the ``SharedArchive`` of a SQLite file (WAL journal; the file
  and its ``-wal``/``-shm`` companions 0600, a created folder 0700). It survives restarts
  and can be read by another process (the MCP server reads the proxy's archive).
* :class:`MemoryArchive` — a dict, for tests and in-process agents that need no file.

**Tenants** (:mod:`agentcompact._tenants`): an archive several users share is read and
written through one tenant's view, ``archive.for_tenant(tenant)`` (:class:`TenantArchive`):
its items are stored under the tenant's scope (Redis keys ``<ns>t:<tenant>:a:<handle>``
and ``<ns>t:<tenant>:alog``, SQLite rows keyed ``t:<tenant>:<handle>``), ``get`` and
``search`` see that scope only, and its handles are keyed by the tenant's ``handle_key``
(``handle_of`` under :func:`handles_keyed`: a keyed BLAKE2b instead of the content
digest), so a handle says nothing about its text and names nothing in another tenant.
The single tenant's view is the archive itself (no scope, content-digest handles).

``open_archive(spec)`` turns a strategy setting into an archive: a path (``str`` or
``Path``) opens a SQLite file, a store URL (``sqlite:///PATH``, ``redis://HOST:PORT``, as
``--store``) the archive beside that store's prefixes (:class:`SharedArchive`),
``":memory:"``, ``"memory"`` (``memory:``) or ``None`` a new in-memory archive, an object with
``put_many``/``get``/``search`` is used as it is, ``False`` means no archive.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import xxhash

from ._tenants import Tenant
from .errors import ArchiveError, ConfigError
from .stores._shared import FAILED, FailOpen
from .stores._sqlite_store import SQLiteBackend

__all__ = [
    "HANDLE_PREFIX",
    "Archive",
    "ArchivedItem",
    "MemoryArchive",
    "SQLiteArchive",
    "SharedArchive",
    "TenantArchive",
    "current_handle_key",
    "handle_of",
    "handles_keyed",
    "is_handle",
    "open_archive",
]

HANDLE_PREFIX = "ac-"
_HANDLE_HEX = 12  # 48 bits: no collision expected among a few million archived parts


#: the key of the handles made now (``handles_keyed``): the engine sets its tenant's
#: around each call, so the strategy's skim lines and the dialect's truncation markers
#: name the same handles the archive stores
_HANDLE_KEY: ContextVar[bytes | None] = ContextVar("agentcompact_handle_key", default=None)


def handle_of(text: str) -> str:
    """The handle of ``text``: ``ac-`` and 12 hex digits — of its xxh3-64 digest, or, under
    :func:`handles_keyed` with a tenant's key, of its keyed BLAKE2b (48 bits either way)."""
    data = text.encode("utf-8", "surrogatepass")
    key = _HANDLE_KEY.get()
    if key is None:
        return HANDLE_PREFIX + xxhash.xxh3_64_hexdigest(data)[:_HANDLE_HEX]
    return HANDLE_PREFIX + hashlib.blake2b(data, key=key, digest_size=_HANDLE_HEX // 2
                                           ).hexdigest()


@contextmanager
def handles_keyed(key: bytes | None) -> Iterator[None]:
    """Within the block, ``handle_of`` makes handles keyed by ``key`` (a tenant's
    ``handle_key``; ``None``: content digests)."""
    token = _HANDLE_KEY.set(key)
    try:
        yield
    finally:
        _HANDLE_KEY.reset(token)


def current_handle_key() -> bytes | None:
    """The key ``handle_of`` uses now (``None``: content digests)."""
    return _HANDLE_KEY.get()


_HANDLE = operator.attrgetter("handle")


def _scoped(scope: str, handle: str) -> str:
    """Where an item of ``scope`` (a tenant id; ``""``: none) is kept: its handle, under
    the tenant's prefix (handles start with ``ac-``, so the two never collide)."""
    return f"t:{scope}:{handle}" if scope else handle


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
    """An archive in a dict (lost with the process); ``scope`` keeps tenants apart
    (:meth:`for_tenant`)."""

    def __init__(self) -> None:
        self._scopes: dict[str, dict[str, ArchivedItem]] = {}
        self._lock = threading.Lock()

    def put_many(self, items: Iterable[ArchivedItem], scope: str = "") -> None:
        with self._lock:
            found = self._scopes.setdefault(scope, {})
            for item in items:
                _check_item(item)
                found.setdefault(item.handle, item)

    def get(self, handle: str, scope: str = "") -> ArchivedItem | None:
        return self._scopes.get(scope, {}).get(handle)

    def search(self, query: str, limit: int = 10, scope: str = "") -> list[ArchivedItem]:
        needle = query.casefold()
        with self._lock:
            items = list(self._scopes.get(scope, {}).values())
        hits = [it for it in reversed(items) if needle in it.text.casefold()]
        return hits[:max(0, limit)]

    def for_tenant(self, tenant: Tenant) -> Archive:
        """``tenant``'s view (this archive itself for the single tenant)."""
        return self if tenant.id == "" else TenantArchive(self, tenant)

    def __len__(self) -> int:
        return len(self._scopes.get("", {}))


class TenantArchive:
    """One tenant's view of a shared archive (``MemoryArchive`` or ``SharedArchive``):
    what it puts, gets and searches is in the tenant's scope only, and its
    ``handle_key`` keys the handles the engine makes for it (module docstring)."""

    def __init__(self, base: MemoryArchive | SharedArchive, tenant: Tenant) -> None:
        self.base, self.tenant = base, tenant

    @property
    def handle_key(self) -> bytes | None:
        return self.tenant.handle_key

    def handle_of(self, text: str) -> str:
        """The handle this tenant's compactions give ``text``."""
        with handles_keyed(self.tenant.handle_key):
            return handle_of(text)

    def put_many(self, items: Iterable[ArchivedItem]) -> None:
        self.base.put_many(items, self.tenant.id)

    def get(self, handle: str) -> ArchivedItem | None:
        return self.base.get(handle, self.tenant.id)

    def search(self, query: str, limit: int = 10) -> list[ArchivedItem]:
        return self.base.search(query, limit, self.tenant.id)

    def status(self) -> dict[str, Any] | None:
        status = getattr(self.base, "status", None)
        return status() if callable(status) else None

    def __len__(self) -> int:
        return self.base.count(self.tenant.id) if isinstance(self.base, SharedArchive) \
            else len(self.base._scopes.get(self.tenant.id, {}))

    def __repr__(self) -> str:
        return f"TenantArchive({self.base!r}, {self.tenant!r})"


_CACHE_ITEMS = 512
_CACHE_CHARS = 32 * 1024 * 1024
_WRITTEN = 65_536  # handles this process knows are stored: not sent again
_MAX_PENDING = 4096  # items written while the backend was down, written back on recovery


class SharedArchive:
    """An archive on a shared backend (``agentcompact.stores``: a SQLite file, a Redis
    server), the same backends and URL as the prefix store: replicas given one ``--store``
    URL expand what any of them dropped.

    Fail-open, like the prefix store: a backend call that fails never fails a compaction
    or an expand. It is warned about once, counted (``status()``); items written meanwhile
    stay in this process (served by ``get`` and ``search``) and are written back when the
    backend answers again (tried at most every ``retry_after`` seconds). A process keeps
    the items it wrote or read last (content-addressed: a cached item is always right).
    """

    def __init__(self, backend: Any, *, retry_after: float = 5.0) -> None:
        self.backend = backend
        self._lock = threading.RLock()
        # keyed by ``_scoped(scope, handle)``: tenants' items never meet here either
        self._recent: OrderedDict[str, ArchivedItem] = OrderedDict()
        self._recent_chars = 0
        self._written: OrderedDict[str, None] = OrderedDict()
        self._pending: OrderedDict[str, tuple[str, ArchivedItem]] = OrderedDict()
        self._guard = FailOpen(backend, "archive", "keeping dropped originals in this "
                               "process", retry_after, lambda: len(self._pending))
        self._stats = {"written": 0, "written_back": 0, "fetched": 0}

    def for_tenant(self, tenant: Tenant) -> Archive:
        """``tenant``'s view (this archive itself for the single tenant)."""
        return self if tenant.id == "" else TenantArchive(self, tenant)

    def put_many(self, items: Iterable[ArchivedItem], scope: str = "") -> None:
        batch: dict[str, ArchivedItem] = {}
        written = self._written
        items = list(items)
        if set(map(type, items)) <= {ArchivedItem}:
            # a compaction puts every cycle's originals, thousands of them stored already
            # in a long history: those are left out at C speed before the loop below
            keys = [_scoped(scope, handle) for handle in map(_HANDLE, items)] if scope \
                else list(map(_HANDLE, items))
            fresh = set(itertools.filterfalse(written.__contains__, keys))
            items = list(itertools.compress(items, map(fresh.__contains__, keys)))
        for item in items:
            if type(item) is ArchivedItem and _scoped(scope, item.handle) in written:
                continue  # checked and stored already (a compaction puts every cycle's)
            _check_item(item)
            batch.setdefault(_scoped(scope, item.handle), item)
        if self._pending:
            self._write_back()
        with self._lock:  # local state only: no lock is held during a backend call
            new = [(k, it) for k, it in batch.items()
                   if k not in self._written and k not in self._pending]
            for key, item in new:
                self._remember(key, item)
        if not new:
            return
        if self._guard.call("archive_put", [_row(it) for _, it in new], scope) is FAILED:
            with self._lock:
                for key, item in new:
                    self._pending[key] = (scope, item)
                while len(self._pending) > _MAX_PENDING:
                    self._pending.popitem(last=False)
            return
        with self._lock:
            self._stats["written"] += len(new)
            self._mark_written(k for k, _ in new)

    def get(self, handle: str, scope: str = "") -> ArchivedItem | None:
        key = _scoped(scope, handle)
        with self._lock:
            waiting = self._pending.get(key)
            hit = self._recent.get(key) or (waiting[1] if waiting else None)
        if hit is not None:
            return hit
        row = self._guard.call("archive_get", handle, scope)
        if row is FAILED or row is None:
            return None
        item = ArchivedItem(*row)
        with self._lock:
            self._stats["fetched"] += 1
            self._remember(key, item)
        if hasattr(self.backend, "archive_touch"):  # expanded: evicted last
            self._guard.call("archive_touch", [handle], scope)
        return item

    def search(self, query: str, limit: int = 10, scope: str = "") -> list[ArchivedItem]:
        if not query:
            return []
        limit = max(0, limit)
        needle = query.casefold()
        with self._lock:
            found = [it for s, it in reversed(self._pending.values())
                     if s == scope and needle in it.text.casefold()]
        rows = self._guard.call("archive_search", query, limit, scope)
        if rows is FAILED:  # what this process holds
            with self._lock:
                rows = [_row(it) for k, it in reversed(self._recent.items())
                        if k == _scoped(scope, it.handle) and needle in it.text.casefold()]
        seen = {it.handle for it in found}
        found += [ArchivedItem(*r) for r in rows if r[0] not in seen]
        return found[:limit]

    def count(self, scope: str = "") -> int:
        """Items stored in ``scope`` (what this process holds while the backend is away)."""
        count = self._guard.call("archive_count", scope)
        with self._lock:
            pending = sum(1 for s, _ in self._pending.values() if s == scope)
            if count is FAILED:
                count = sum(1 for k, it in self._recent.items()
                            if k == _scoped(scope, it.handle))
        return int(pending + count)

    def __len__(self) -> int:
        return self.count()

    def status(self) -> dict[str, Any]:
        """Counters for a status page: backend, state, failures, writes (read without
        the lock: a status page never waits for a backend call)."""
        return {**self._guard.status(), "cached": len(self._recent),
                "pending_write_back": len(self._pending), **self._stats}

    def close(self) -> None:
        """Close the backend's connection (``open_archive`` opens a new archive for this
        file after)."""
        with _open_lock:
            for key, found in list(_open.items()):
                if found is self:
                    del _open[key]
        self.backend.close()

    def _write_back(self) -> None:
        with self._lock:
            waiting = list(self._pending.items())
        by_scope: dict[str, list[tuple[str, ArchivedItem]]] = {}
        for key, (scope, item) in waiting:
            by_scope.setdefault(scope, []).append((key, item))
        for scope, items in by_scope.items():
            if self._guard.call("archive_put", [_row(it) for _, it in items], scope) is FAILED:
                return
            with self._lock:
                for key, item in items:
                    entry = self._pending.get(key)
                    if entry is not None and entry[1] is item:
                        del self._pending[key]
                self._stats["written_back"] += len(items)
                self._mark_written(k for k, _ in items)

    def _mark_written(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._written[key] = None
        while len(self._written) > _WRITTEN:
            self._written.popitem(last=False)

    def _remember(self, key: str, item: ArchivedItem) -> None:
        old = self._recent.pop(key, None)
        if old is not None:
            self._recent_chars -= len(old.text)
        self._recent[key] = item
        self._recent_chars += len(item.text)
        while len(self._recent) > 1 and (len(self._recent) > _CACHE_ITEMS
                                         or self._recent_chars > _CACHE_CHARS):
            _, evicted = self._recent.popitem(last=False)
            self._recent_chars -= len(evicted.text)


def _row(item: ArchivedItem) -> tuple[str, str, str]:
    return item.handle, item.text, item.skim


class SQLiteArchive(SharedArchive):
    """An archive in a SQLite file (WAL; files 0600, a created folder 0700): the
    ``dropped`` table of the prefix store's SQLite backend, so one file can hold both.

    Other processes (the MCP server beside a proxy) open the same file and see committed
    items. The file is opened on first use; one that cannot be (a read-only folder) is
    fail-open as for every ``SharedArchive``.
    """

    def __init__(self, path: str | os.PathLike[str], *, retry_after: float = 5.0) -> None:
        self.path = Path(path)
        super().__init__(SQLiteBackend(self.path), retry_after=retry_after)


_open: dict[str, SharedArchive] = {}
_open_lock = threading.Lock()
_URL_SCHEMES = ("sqlite:", "redis:", "rediss:", "unix:")
#: a string of this shape is a URL, never a file name: an unknown scheme is refused
#: (``postgres://…`` must not become a SQLite file named after the URL)
_URL_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")


def open_archive(spec: object) -> Archive | None:
    """The archive a strategy setting names (see the module docstring); a path or a store
    URL opens one ``SharedArchive`` per file (or URL) and process, shared by every strategy
    naming it.

    :raises StoreError: a store URL that does not parse (as ``store_from_url``), or a
        string shaped as a URL (``scheme://…``) whose scheme is not a store's.
    """
    if spec is False:
        return None
    if spec is None or spec == ":memory:" or (
            isinstance(spec, str) and spec.partition(":")[0].lower() == "memory"):
        return MemoryArchive()
    if isinstance(spec, str) and (spec.lower().startswith(_URL_SCHEMES)
                                  or _URL_LIKE.match(spec)):
        from .stores import backend_from_url

        with _open_lock:
            found = _open.get(spec)
            if found is None:
                backend, options = backend_from_url(spec)
                found = _open[spec] = SharedArchive(
                    backend, retry_after=options.get("retry_after", 5.0))
        return found
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
