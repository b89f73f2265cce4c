"""Prefix stores past one process: ``store_from_url`` and the shared backends.

=========================  ==================================================
``memory:``                ``InMemoryPrefixStore`` — this process only
``sqlite:///PATH``         SQLite file (WAL) — processes on one machine; PATH as
                           SQLAlchemy reads it: ``sqlite:///rel.db``,
                           ``sqlite:////abs/path.db``
``redis://host:port/db``   Redis server (extra ``redis``) — replicas anywhere
=========================  ==================================================

Query options: SQLite ``max_entries``; Redis ``prefix``, ``ttl``, ``log_max``,
``timeout``; both ``cache_entries`` and ``retry_after`` (``SharedPrefixStore``). See
``docs/deploy.md``.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode

from .._store import InMemoryPrefixStore, PrefixStore
from ..errors import StoreError
from ._codec import decode_entry, encode_entry
from ._shared import Backend, SharedPrefixStore

__all__ = ["Backend", "SharedPrefixStore", "decode_entry", "encode_entry", "store_from_url"]

_SHARED_OPTIONS = {"cache_entries": int, "retry_after": float, "max_staleness": float}


def store_from_url(url: str) -> PrefixStore:
    """The prefix store a URL names (table in the module docstring).

    :raises StoreError: an unknown scheme or option, or a value that does not parse (the
        message names the scheme or option, never a password).
    """
    scheme = url.partition(":")[0].lower()
    if scheme == "memory":
        return InMemoryPrefixStore()
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
    return SharedPrefixStore(backend, **shared)


def _backend(scheme: str, base: str, query: dict[str, str]) -> Backend:
    if scheme == "sqlite":
        from ._sqlite_store import SQLiteBackend

        path = base[len("sqlite:///"):] if base.startswith("sqlite:///") else ""
        unknown = sorted(set(query) - {"max_entries"})
        if unknown:
            raise StoreError(f"sqlite store URL: unknown option(s) {unknown}")
        if not path:
            raise StoreError("sqlite store URL: write sqlite:///PATH (sqlite:////abs/path)")
        return SQLiteBackend(path, max_entries=int(query.get("max_entries", 100_000)))
    if scheme in ("redis", "rediss", "unix"):
        from ._redis_store import RedisBackend

        return RedisBackend(base + ("?" + urlencode(query) if query else ""))
    raise StoreError(f"store URL scheme {scheme!r}: use memory:, sqlite:///PATH or "
                     "redis://HOST:PORT")
