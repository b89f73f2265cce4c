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
bound); Redis ``prefix``, ``ttl``, ``log_max``, ``timeout``; both ``cache_entries`` and
``retry_after`` (``SharedPrefixStore``). See ``docs/deploy.md``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from .._store import InMemoryPrefixStore, PrefixStore
from ..errors import StoreError
from ._codec import decode_entry, encode_entry
from ._shared import Backend, SharedPrefixStore

__all__ = ["DEFAULT_STORE_FILE", "Backend", "SharedPrefixStore", "backend_from_url",
           "decode_entry", "default_state_dir", "default_store_url", "encode_entry",
           "store_from_url"]

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

_SHARED_OPTIONS = {"cache_entries": int, "retry_after": float, "max_staleness": float}
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


_SQLITE_OPTIONS: dict[str, Any] = {"max_entries": int, "timeout": float,
                                   "max_bytes": _parse_bytes, "max_age_days": float}


def store_from_url(url: str) -> PrefixStore:
    """The prefix store a URL names (table in the module docstring).

    :raises StoreError: an unknown scheme or option, or a value that does not parse (the
        message names the scheme or option, never a password).
    """
    if url.partition(":")[0].lower() == "memory":
        return InMemoryPrefixStore()
    backend, shared = backend_from_url(url)
    return SharedPrefixStore(backend, **shared)


def backend_from_url(url: str) -> tuple[Backend, dict[str, Any]]:
    """The backend a ``sqlite:`` or ``redis:`` URL names, and the ``SharedPrefixStore``
    options in its query (the archive of the same URL, ``agentcompact._archive``, reads
    ``retry_after``).

    :raises StoreError: as ``store_from_url``; ``memory:`` has no backend.
    """
    scheme = url.partition(":")[0].lower()
    base, _, raw_query = url.partition("?")
    query = {k: v[-1] for k, v in parse_qs(raw_query).items()}
    try:
        shared = {k: conv(query.pop(k)) for k, conv in _SHARED_OPTIONS.items() if k in query}
        backend = _backend(scheme, base, query)
    except ValueError as exc:
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"{scheme} store URL: an option value does not parse "
                         f"({type(exc).__name__})") from None
    return backend, shared


def _backend(scheme: str, base: str, query: dict[str, str]) -> Backend:
    if scheme == "sqlite":
        from ._sqlite_store import SQLiteBackend

        path = base[len("sqlite:///"):] if base.startswith("sqlite:///") else ""
        unknown = sorted(set(query) - set(_SQLITE_OPTIONS))
        if unknown:
            raise StoreError(f"sqlite store URL: unknown option(s) {unknown}")
        if not path:
            raise StoreError("sqlite store URL: write sqlite:///PATH (sqlite:////abs/path)")
        options = {k: _SQLITE_OPTIONS[k](v) for k, v in query.items()}
        if any(v < 0 for v in options.values()) or options.get("timeout", 1) <= 0:
            raise StoreError("sqlite store URL: option values must be positive "
                             "(0 for no bound)")
        return SQLiteBackend(path, **options)
    if scheme in ("redis", "rediss", "unix"):
        from ._redis_store import RedisBackend

        return RedisBackend(base + ("?" + urlencode(query) if query else ""))
    raise StoreError(f"store URL scheme {scheme!r}: use memory:, sqlite:///PATH or "
                     "redis://HOST:PORT")
