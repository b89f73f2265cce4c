"""A ``PrefixStore`` over a backend several processes share (SQLite file, Redis server).

The engine looks up every prefix length of a history, longest first: hundreds of
``get`` calls per request, nearly all misses. A round trip for each would cost
milliseconds, so this store keeps, per process:

- an **index** of the keys the backend holds, brought up to date by one backend call
  whenever the engine reads ``version`` (it does before every lookup) — misses are then
  answered locally, and an entry another replica put before this request is seen;
- a **cache** of decoded entries (an ``InMemoryPrefixStore``): a session's stored prefix
  is fetched once, not on every request. An entry in it is served even when the backend
  lost it (evicted, expired, a server restarted empty): it is still the right answer.

``version`` is this process's counter: it changes whenever the index learns a key (a put
here or elsewhere), as the ``PrefixStore`` protocol asks.

**Fail-open.** A backend call that fails (server down, disk full, lock timeout) never
fails the request: the store warns once, counts it (``status()``), and serves from its
cache — entries put meanwhile are kept locally and written back when the backend answers
again (tried at most every ``retry_after`` seconds), so the process stays consistent with
itself. Keys are opaque strings.

**Deadlines.** Every backend call is bounded (the SQLite backend's ``timeout`` for its
locks, the Redis client's socket timeout), and a failed call's kind — reads or writes —
is not tried again for ``retry_after`` seconds by any store of the same backend location
in this process (the prefix store and the archive of one file share it): a locked or slow
backend costs one deadline to the call that finds it so, then nothing until the retry.
Reads go on while only writes fail (another process holding a SQLite file's write lock):
``status()`` says ``degraded`` then, ``down`` when reads fail too. No lock of the store is
held during a backend call, so a caller that does not touch the backend (the status page)
never waits for one that does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from .._store import InMemoryPrefixStore, PrefixEntry
from ._codec import decode_entry, encode_entry

__all__ = ["FAILED", "ArchiveRow", "Backend", "FailOpen", "SharedPrefixStore"]

logger = logging.getLogger(__name__)

ArchiveRow = tuple[str, str, str]
"""(handle, text, skim) of an archived original, as backends store it."""

_MAX_PENDING = 4096  # entries put while the backend was down, written back on recovery
_DEFAULT_DEADLINE = 1.0  # a backend without a ``timeout``: how long a refresh waits for another
_WRITES = frozenset({"save", "archive_put", "archive_touch", "prune"})


class Backend(Protocol):
    """Bytes under opaque keys, with a change counter. Every method may raise one of
    ``errors`` (the store is then fail-open)."""

    name: str
    errors: tuple[type[BaseException], ...]

    def load(self, key: str) -> bytes | None:
        """The bytes under ``key``, or ``None``."""

    def save(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically and advance the change counter."""

    def changes(self, since: int | None) -> tuple[int, list[str] | None]:
        """``(counter, keys saved after counter since)``; keys ``None`` when they cannot
        be told (``since`` is ``None``, or the change log no longer reaches back)."""

    def keys(self) -> tuple[int, list[str]]:
        """``(counter, every key)``; the counter is read before the keys."""

    def close(self) -> None:
        """Release connections."""

    def describe(self) -> str:
        """Where the backend is (no password)."""


class SharedPrefixStore:
    """``PrefixStore`` over a shared ``Backend``; see the module docstring.

    :param cache_entries: decoded entries kept in this process (LRU).
    :param cache_bytes: their bound in serialized bytes.
    :param retry_after: seconds between two attempts to reach a failed backend.
    :param max_staleness: a ``get`` refreshes the index first if it was last refreshed
        longer ago (for callers that do not read ``version`` before looking up).
    """

    def __init__(self, backend: Backend, *, cache_entries: int = 4096,
                 cache_bytes: int = 64 * 1024 * 1024, retry_after: float = 5.0,
                 max_staleness: float = 1.0) -> None:
        self.backend = backend
        self._cache = InMemoryPrefixStore(cache_entries, cache_bytes)
        self._cached = self._cache._data  # our own cache: membership tests need no lock
        self._known: set[str] = set()
        self._stale: set[str] = set()  # cached, but re-put elsewhere since
        self._mine: set[str] = set()  # saved by this process since the last refresh
        self._pending: OrderedDict[str, bytes] = OrderedDict()
        self._counter: int | None = None  # the backend's counter at the last refresh
        self._synced_at = 0.0
        self._max_staleness = max_staleness
        self._lock = threading.RLock()  # local state only: never held during I/O
        self._refreshing = threading.Lock()
        self._deadline = float(getattr(backend, "timeout", _DEFAULT_DEADLINE))
        self._version = 0
        self._guard = FailOpen(backend, "prefix store", "compacting locally", retry_after,
                               lambda: len(self._pending))
        self._stats = {"refreshes": 0, "fetched": 0, "written": 0, "written_back": 0,
                       "undecodable": 0}

    # --- PrefixStore --------------------------------------------------------------
    @property
    def version(self) -> int:
        """Refreshes the index (one backend call), then this process's counter."""
        self.refresh()
        return self._version

    def get(self, key: str) -> PrefixEntry | None:
        if key not in self._known and key not in self._cached:
            if time.monotonic() - self._synced_at <= self._max_staleness:
                return None
            self.refresh()
            if key not in self._known:
                return None
        with self._lock:
            if key not in self._stale:
                hit = self._cache.get(key)
                if hit is not None:
                    return hit
        raw = self._call("load", key)  # no lock held: see the module docstring
        if raw is FAILED:  # backend down: what this process has
            return self._cache.get(key)
        entry = decode_entry(raw) if raw is not None else None
        with self._lock:
            if raw is None:  # gone (evicted, expired): forget it
                self._known.discard(key)
                self._stale.discard(key)
                return None
            self._stats["fetched"] += 1
            if entry is None:
                self._stats["undecodable"] += 1
                self._known.discard(key)
                return None
            self._stale.discard(key)
            self._cache.put(key, entry)
        return entry

    def put(self, key: str, entry: PrefixEntry) -> None:
        data = encode_entry(entry)  # StoreError for a value that is not JSON-able
        with self._lock:
            self._cache.put(key, entry)
            self._stale.discard(key)
            self._known.add(key)
            self._version += 1
        saved = self._call("save", key, data) is not FAILED
        with self._lock:
            if not saved:
                self._pending[key] = data
                self._pending.move_to_end(key)
                while len(self._pending) > _MAX_PENDING:
                    self._pending.popitem(last=False)
            else:
                self._mine.add(key)
                self._stats["written"] += 1

    def __len__(self) -> int:
        return len(self._known)

    # --- index --------------------------------------------------------------------
    def refresh(self) -> None:
        """Bring the index up to date with the backend (one call; none while it is down,
        or while another thread's refresh has taken longer than the backend's deadline)."""
        if not self._refreshing.acquire(timeout=self._deadline):
            return
        try:
            result = self._call("changes", self._counter)
            if result is FAILED:
                return
            if self._pending:
                self._write_back()
            counter, keys = result
            full = None
            if keys is None:
                full = self._call("keys")
                if full is FAILED:
                    return
                counter, keys = full
            self._merge(counter, keys, full is not None)
        finally:
            self._refreshing.release()

    def _merge(self, counter: int, keys: list[str], full: bool) -> None:
        """What a refresh learned, into the index (under the lock: no I/O)."""
        with self._lock:
            self._stats["refreshes"] += 1
            self._synced_at = time.monotonic()
            if full:
                self._known = set(keys)
                self._stale = (set(keys) & set(self._cached)) - self._mine
                self._version += 1
            elif keys:
                self._known.update(keys)
                self._stale.update(k for k in keys if k not in self._mine)
                self._version += 1
            self._mine.clear()
            self._counter = counter

    def _write_back(self) -> None:
        with self._lock:
            waiting = list(self._pending.items())
        for key, data in waiting:
            if self._call("save", key, data) is FAILED:
                return
            with self._lock:
                if self._pending.get(key) is data:
                    del self._pending[key]
                self._stats["written_back"] += 1

    def _call(self, op: str, *args: Any) -> Any:
        return self._guard.call(op, *args)

    def status(self) -> dict[str, Any]:
        """Counters for a status page: backend, state, failures, cache (read without the
        lock: a status page never waits for a backend call)."""
        return {**self._guard.status(), "keys": len(self._known),
                "cached": len(self._cached), "pending_write_back": len(self._pending),
                **self._stats}

    def close(self) -> None:
        self.backend.close()


class _Lane:
    """The health of one kind of call (reads or writes) to one backend location, shared
    by every store of this process on it: when to try again, and why it failed."""

    __slots__ = ("down_until", "error")

    def __init__(self) -> None:
        self.down_until = 0.0
        self.error: str | None = None


_lanes: dict[tuple[str, str], _Lane] = {}
_lanes_lock = threading.Lock()


def _lane(where: str, kind: str) -> _Lane:
    with _lanes_lock:
        return _lanes.setdefault((where, kind), _Lane())


class FailOpen:
    """Calls into a shared backend that never fail their caller: a failure is warned about
    once (until the backend answers again), counted, and that kind of call (reads or
    writes) is left alone for ``retry_after`` seconds by every store on the same backend
    location (an outage costs one timeout per interval, not per call or per store).

    :param what: what the backend serves, for the log lines (``prefix store``, ``archive``).
    :param meanwhile: what the caller does without it, for the warning.
    :param pending: how many writes wait for the backend (for the recovery log line).
    """

    def __init__(self, backend: Any, what: str, meanwhile: str, retry_after: float,
                 pending: Callable[[], int] = lambda: 0) -> None:
        self.backend, self.what, self.retry_after = backend, what, retry_after
        self.meanwhile = meanwhile
        self._pending = pending
        self.failures = self.skipped = 0
        self.last_error: str | None = None
        self._warned = False
        where = backend.describe()
        self._read, self._write = _lane(where, "read"), _lane(where, "write")

    def call(self, op: str, *args: Any) -> Any:
        """``backend.<op>(*args)``, or ``FAILED`` when it raised one of the backend's
        ``errors`` (or was not tried: that kind of call failed less than ``retry_after``
        ago)."""
        lane = self._write if op in _WRITES else self._read
        if time.monotonic() < lane.down_until:
            self.skipped += 1
            if not self._warned:  # another store of this backend found it failing
                self._warn(op, (lane.error or "").rpartition(" ")[2] or "failing")
            return FAILED
        try:
            result = getattr(self.backend, op)(*args)
        except self.backend.errors as exc:
            self._fail(op, exc, lane)
            return FAILED
        lane.error = None
        if lane is self._write:  # a write answered: reads would too
            self._read.error = None
        if self.last_error is not None and self._read.error is None and self._write.error is None:
            if self._warned:
                logger.warning("%s %s answers again; %d writes to write back", self.what,
                               self.backend.describe(), self._pending())
                self._warned = False
            self.last_error = None
        return result

    def _fail(self, op: str, exc: BaseException, lane: _Lane) -> None:
        self.failures += 1
        self.last_error = lane.error = f"{op}: {type(exc).__name__}"
        lane.down_until = time.monotonic() + self.retry_after
        if lane is self._read:  # reads fail: writes would too (not tried: one deadline)
            self._write.down_until, self._write.error = lane.down_until, lane.error
        if not self._warned:
            self._warn(op, type(exc).__name__)

    def _warn(self, op: str, error: str) -> None:
        self._warned = True
        logger.warning("%s %s failed (%s in %s); %s, retrying every %g s", self.what,
                       self.backend.describe(), error, op, self.meanwhile, self.retry_after)

    def state(self) -> str:
        """``ok``; ``degraded`` (reads answer, writes fail: kept here and written back);
        ``down`` (reads fail: this process serves what it has)."""
        if self._read.error is not None:
            return "down"
        return "ok" if self._write.error is None and self.last_error is None else "degraded"

    def status(self) -> dict[str, Any]:
        """Backend, where it is, its state and the failure counters."""
        state = self.state()
        return {"backend": self.backend.name, "where": self.backend.describe(),
                "available": state == "ok", "state": state,
                "last_error": self.last_error or self._read.error or self._write.error,
                "failures": self.failures, "skipped": self.skipped}


class _Failed:
    """Marker: a backend call failed or was skipped (``None`` is a valid answer)."""


FAILED: Any = _Failed()
