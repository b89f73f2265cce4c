"""Prefix stores past one process: ``store_from_url`` and the shared backends.

One URL names where the prefix store and the archive of dropped originals live
(``agentcompact._archive.open_archive(url)``): they share the backend (one SQLite file,
one Redis server) under keys that never collide.

=========================  ==================================================
``memory:``                ``InMemoryPrefixStore`` — this process only
``sqlite:///PATH``         SQLite file (WAL) — processes on one machine; PATH as
                           SQLAlchemy reads it: ``sqlite:///rel.db``,
                           ``sqlite:////abs/path.db``
``redis://host:port/db``   Redis server (extra ``redis``) — replicas anywhere
=========================  ==================================================

Query options: SQLite ``max_entries``, ``timeout`` (seconds a call waits for the file's
locks), ``max_bytes`` (``512MB``, ``2GB``…; 0: no bound) and ``max_age_days`` (0: no
bound); Redis ``prefix``, ``ttl``, ``log_max``, ``timeout`` and redis-py's own connection
options; both ``cache_entries``, ``retry_after`` and ``max_staleness``
(``SharedPrefixStore``). See ``docs/deploy.md``. A URL is checked whole when the store is
made (``check_store_url``, every option and its range): an unknown option or a value out
of range is a ``StoreError`` at start, never a failure of each request later.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from .._store import InMemoryPrefixStore, PrefixStore
from ..errors import StoreError
from ._codec import decode_entry, encode_entry
from ._shared import Backend, SharedPrefixStore

__all__ = ["DEFAULT_STORE_FILE", "Backend", "SharedPrefixStore", "backend_from_url",
           "check_store_url", "decode_entry", "default_state_dir", "default_store_url",
           "encode_entry", "store_from_url"]

DEFAULT_STORE_FILE = "store.sqlite"
"""The proxy's default store in its state folder: prefixes and archive in one file."""


def default_state_dir() -> Path:
    """Where the proxy keeps its state by default: ``$AGENTCOMPACT_STATE_DIR``, else
    ``~/.agentcompact`` (created 0700 on first use)."""
    configured = os.environ.get("AGENTCOMPACT_STATE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".agentcompact"


def default_store_url(state_dir: str | os.PathLike[str] | None = None) -> str:
    """``sqlite:///<state_dir>/store.sqlite`` (``default_state_dir()`` when not given)."""
    folder = Path(state_dir).expanduser() if state_dir else default_state_dir()
    return "sqlite:///" + str(folder.absolute() / DEFAULT_STORE_FILE)

_FORMS = ("memory:, sqlite:///PATH (sqlite:////abs/path), redis://[:PASSWORD@]HOST:PORT/DB, "
          "rediss://… or unix:///PATH.sock")
_SCHEMES = frozenset({"memory", "sqlite", "redis", "rediss", "unix"})
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
#: ``SharedPrefixStore`` options read from any URL: name -> (type, least value)
_SHARED_OPTIONS: dict[str, tuple[type, float]] = {
    "cache_entries": (int, 1), "retry_after": (float, 0.0), "max_staleness": (float, 0.0)}


def check_store_url(url: object) -> str:
    """The scheme of a store URL (``memory``, ``sqlite``, ``redis``, ``rediss``, ``unix``),
    its form checked without connecting to anything.

    :raises StoreError: no scheme, an unknown one, or a URL missing what its scheme needs
        (a path, a host, a numeric port or database); the message names the accepted
        forms and never repeats the URL (it may hold a password).
    """
    if not isinstance(url, str):
        raise StoreError(f"a store URL must be a string, got {type(url).__name__}")
    if url.lower() == "memory":
        return "memory"
    found = _SCHEME.match(url)
    if found is None:
        raise StoreError(f"a store URL needs a scheme: use {_FORMS}")
    scheme = found.group(1).lower()
    if scheme not in _SCHEMES:
        raise StoreError(f"store URL scheme {scheme!r} is not one agentcompact reads: use "
                         f"{_FORMS}")
    rest = url.partition("?")[0][len(scheme) + 1:]
    if scheme == "sqlite" and not (rest.startswith("///") and rest[3:]):
        raise StoreError("sqlite store URL: write sqlite:///PATH (sqlite:////abs/path)")
    if scheme in ("redis", "rediss"):
        _check_redis(scheme, url)
    if scheme == "unix" and not (rest.startswith("//") and urlsplit(url).path):
        raise StoreError("unix store URL: write unix:///PATH/TO/redis.sock")
    return scheme


def _check_redis(scheme: str, url: str) -> None:
    form = f"{scheme} store URL: write {scheme}://[:PASSWORD@]HOST:PORT/DB"
    parts = urlsplit(url)
    if not url[len(scheme) + 1:].startswith("//") or not parts.hostname:
        raise StoreError(f"{form} (no host)")
    try:
        _ = parts.port  # urlsplit checks the port when asked for it
    except ValueError:
        raise StoreError(f"{form} (the port is not a number in 0-65535)") from None
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise StoreError(f"{form} (the database is a number, as /0)")


def _option(scheme: str, name: str, raw: str, kind: type, least: float) -> Any:
    """A numeric URL option ``name`` parsed as ``kind`` and at least ``least``.

    :raises StoreError: naming the option and the values it takes (never the value given:
        query options sit beside credentials)."""
    what = "an integer" if kind is int else "a number"
    try:
        value = kind(raw)
    except ValueError:
        raise StoreError(f"{scheme} store URL: option {name} must be {what} "
                         f">= {least:g}") from None
    if value < least or value != value:  # NaN is never a setting
        raise StoreError(f"{scheme} store URL: option {name} must be {what} >= {least:g}")
    return value


_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KIB": 1024,
          "MIB": 1024**2, "GIB": 1024**3, "K": 1024, "M": 1024**2, "G": 1024**3}


def _parse_bytes(text: str) -> int:
    """``512MB``, ``2GiB``, ``1.5G``, ``1000`` as a byte count (``K``/``M``/``G`` alone
    are binary).

    :raises ValueError: not a size.
    """
    raw = text.strip().upper().replace(" ", "")
    number = raw.rstrip("KMGIB")
    unit = _UNITS.get(raw[len(number):])
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit is None or not value >= 0:
        raise ValueError(f"not a size: {text!r}")
    return int(value * unit)


#: SQLite URL options: name -> (type, least value); ``max_bytes`` / ``max_age_days`` 0: no
#: bound
_SQLITE_OPTIONS: dict[str, tuple[type, float]] = {
    "max_entries": (int, 1), "timeout": (float, 0.001), "max_bytes": (int, 0),
    "max_age_days": (float, 0.0)}


def store_from_url(url: str) -> PrefixStore:
    """The prefix store a URL names (table in the module docstring).

    :raises StoreError: an unknown scheme or option, or a value that does not parse (the
        message names the scheme or option, never a password).
    """
    if check_store_url(url) == "memory":
        return InMemoryPrefixStore()
    backend, shared = backend_from_url(url)
    return SharedPrefixStore(backend, **shared)


def backend_from_url(url: str) -> tuple[Backend, dict[str, Any]]:
    """The backend a ``sqlite:`` or ``redis:`` URL names, and the ``SharedPrefixStore``
    options in its query (the archive of the same URL, ``agentcompact._archive``, reads
    ``retry_after``). Every option is checked here, before any request: an unknown one or
    a value out of range is refused, not found failing later.

    :raises StoreError: as ``store_from_url``; ``memory:`` has no backend.
    """
    scheme = check_store_url(url)
    if scheme == "memory":
        raise StoreError("a memory: store has no shared backend: use sqlite:///PATH or "
                         "redis://HOST:PORT/DB")
    base, _, raw_query = url.partition("?")
    query = {k: v[-1] for k, v in parse_qs(raw_query, keep_blank_values=True).items()}
    shared = {k: _option(scheme, k, query.pop(k), kind, least)
              for k, (kind, least) in _SHARED_OPTIONS.items() if k in query}
    return _backend(scheme, base, query), shared


def _backend(scheme: str, base: str, query: dict[str, str]) -> Backend:
    if scheme == "sqlite":
        from ._sqlite_store import SQLiteBackend

        unknown = sorted(set(query) - set(_SQLITE_OPTIONS))
        if unknown:
            raise StoreError(f"sqlite store URL: unknown option(s) {unknown}; it takes "
                             f"{', '.join(sorted(_SQLITE_OPTIONS))}, cache_entries, "
                             "retry_after, max_staleness")
        options: dict[str, Any] = {}
        for name, raw in query.items():
            kind, least = _SQLITE_OPTIONS[name]
            if name == "max_bytes":
                try:
                    raw = str(_parse_bytes(raw))
                except ValueError:
                    raise StoreError("sqlite store URL: option max_bytes must be a size "
                                     "(512MB, 2GiB, …; 0 for no bound)") from None
            options[name] = _option(scheme, name, raw, kind, least)
        return SQLiteBackend(base[len("sqlite:///"):], **options)
    from ._redis_store import RedisBackend

    return RedisBackend(base + ("?" + urlencode(query) if query else ""))
