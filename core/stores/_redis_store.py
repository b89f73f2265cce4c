"""The Redis backend (extra ``redis``): proxy replicas on several machines share one server.

Keys, under a namespace (``agentcompact:`` by default):

- ``<ns>e:<key>`` — an entry's bytes, with a TTL (``ttl`` seconds, 7 days by default; 0:
  none, then the server's ``maxmemory-policy`` bounds them);
- ``<ns>seq`` — the change counter;
- ``<ns>log`` — the keys of the last ``log_max`` saves, oldest first;
- ``<ns>epoch`` — a random id set by the first save after the server lost its data (a
  restart without persistence, ``FLUSHALL``): the counter starts again then, and a reader
  that knew another epoch re-reads every key;
- ``<ns>a:<handle>`` — an archived original (``agentcompact._archive``): a hash of its text
  ``t`` and skim line ``s`` (UTF-8, lone surrogates kept), with the same TTL;
- ``<ns>alog`` — the handles archived, oldest first (the last ``log_max``): what
  ``search_dropped`` reads, newest first;
- ``<ns>t:<tenant>:a:<handle>``, ``<ns>t:<tenant>:alog`` — the same for a tenant's
  archive (``agentcompact._tenants``): each tenant's originals and log apart.

Prefix keys (``e:``) and handles (``a:``, always ``ac-`` and 12 hex digits) never collide.
An archive write is one Lua script: each new handle's hash, its TTL and its place in the
log together, an existing handle left as it is.

A save is one ``MULTI``/``EXEC`` transaction (entry, counter, log), so a reader sees a
whole entry or none. "Nothing saved since counter n" is one ``MGET`` (counter, epoch);
"keys saved after counter n" one Lua script reading the counter and the tail of the log
together; when the log no longer reaches back (trimmed, or the
server lost its data) the caller re-reads every key (``SCAN``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from ..errors import StoreError
from ._shared import ArchiveRow

__all__ = ["RedisBackend"]

_CHANGES = """
local seq = tonumber(redis.call('GET', KEYS[1]) or '0')
local epoch = redis.call('GET', KEYS[3]) or ''
local since = tonumber(ARGV[1])
if epoch ~= ARGV[2] then return {seq, -1, epoch} end
if since == seq then return {seq, 0, epoch} end
local n = seq - since
if since < 0 or n < 0 or n > redis.call('LLEN', KEYS[2]) then return {seq, -1, epoch} end
return {seq, 1, epoch, redis.call('LRANGE', KEYS[2], -n, -1)}
"""

_ARCHIVE = """
local ttl, log_max, added = tonumber(ARGV[1]), tonumber(ARGV[2]), 0
for i = 1, #KEYS do
  local at = 3 * i + 1
  if redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('HSET', KEYS[i], 't', ARGV[at], 's', ARGV[at + 1])
    if ttl > 0 then redis.call('EXPIRE', KEYS[i], ttl) end
    redis.call('RPUSH', ARGV[3], ARGV[at + 2])
    added = added + 1
  end
end
if added > 0 then redis.call('LTRIM', ARGV[3], -log_max, -1) end
return added
"""
_SEARCH_BATCH = 256


class RedisBackend:
    """``Backend`` on a Redis server (see the module docstring).

    :param url: ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``);
        query options ``prefix``, ``ttl``, ``log_max`` and ``timeout`` are read here, the
        rest are redis-py's.
    """

    name = "redis"

    def __init__(self, url: str, *, prefix: str = "agentcompact:", ttl: int = 7 * 24 * 3600,
                 log_max: int = 100_000, timeout: float = 0.5) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - the extra is missing
            raise StoreError("a redis:// store needs the 'redis' extra: "
                             "pip install 'agentcompact[redis]'") from exc
        from . import _option, check_store_url

        scheme = check_store_url(url)
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        self.prefix = query.pop("prefix", prefix)
        self.ttl = _option(scheme, "ttl", query.pop("ttl", str(ttl)), int, 0)
        self.log_max = _option(scheme, "log_max", query.pop("log_max", str(log_max)), int, 1)
        self.timeout = timeout = _option(scheme, "timeout", query.pop("timeout", str(timeout)),
                                         float, 0.001)
        rest = urlencode(query)
        host = parts.hostname or ""
        netloc = host if parts.port is None else f"{host}:{parts.port}"
        self._where = f"{parts.scheme}://{netloc}{parts.path}"  # no password
        self.errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        # the query replaced in the URL as given (``urlunsplit`` would turn unix:///path
        # into unix:/path, which redis-py refuses)
        target = url.partition("?")[0] + ("?" + rest if rest else "")
        try:
            self._redis: Any = redis.Redis.from_url(
                target, socket_timeout=timeout, socket_connect_timeout=timeout,
                health_check_interval=30)
        except ValueError:  # redis-py's own URL checks (an option's value)
            raise StoreError(f"{scheme} store URL: a redis-py option's value does not "
                             "parse") from None
        _check_options(scheme, self._redis.connection_pool,
                       [k for k, v in query.items() if not v])
        self._changes = self._redis.register_script(_CHANGES)
        self._archive = self._redis.register_script(_ARCHIVE)
        self._alog = f"{self.prefix}alog"  # the single tenant's archive log
        self._seq, self._log = f"{self.prefix}seq", f"{self.prefix}log"
        self._epoch_key = f"{self.prefix}epoch"
        self._epoch: bytes | None = None  # the epoch the last ``changes`` saw (b"": none)

    def load(self, key: str) -> bytes | None:
        data: bytes | None = self._redis.get(self.prefix + "e:" + key)
        return data

    def save(self, key: str, data: bytes) -> None:
        with self._redis.pipeline(transaction=True) as tx:
            tx.set(self.prefix + "e:" + key, data, ex=self.ttl or None)
            tx.setnx(self._epoch_key, uuid.uuid4().hex)
            tx.incr(self._seq)
            tx.rpush(self._log, key)
            tx.ltrim(self._log, -self.log_max, -1)
            tx.execute()

    def changes(self, since: int | None) -> tuple[int, list[str] | None]:
        if since is not None and self._epoch is not None:  # nothing new: one MGET
            seq, epoch = self._redis.mget(self._seq, self._epoch_key)
            if (epoch or b"") == self._epoch and int(seq or 0) == since:
                return since, []
        answer = self._changes(keys=[self._seq, self._log, self._epoch_key],
                               args=[-1 if since is None else since, self._epoch or b""])
        seq, kind, self._epoch = int(answer[0]), int(answer[1]), answer[2]
        if kind < 0 or since is None:
            return seq, None
        return seq, [k.decode() for k in answer[3]] if kind else []

    def keys(self) -> tuple[int, list[str]]:
        seq = int(self._redis.get(self._seq) or 0)
        start = len(self.prefix) + 2
        found = [k.decode()[start:] for k in self._redis.scan_iter(
            match=_glob_escape(self.prefix) + "e:*", count=1000)]
        return seq, found

    # --- archived originals -------------------------------------------------------
    # A tenant's keys live under ``<ns>t:<tenant>:`` (``scope``): its own hashes and log,
    # so a Redis ACL key pattern can confine a tenant's credentials to them.
    def _archive_ns(self, scope: str) -> str:
        return f"{self.prefix}t:{scope}:" if scope else self.prefix

    def archive_put(self, rows: Sequence[ArchiveRow], scope: str = "") -> None:
        """Store the rows whose handle is new (one script: atomic)."""
        if not rows:
            return
        ns = self._archive_ns(scope)
        keys = [ns + "a:" + handle for handle, _, _ in rows]
        args: list[Any] = [self.ttl, self.log_max, ns + "alog"]
        for handle, text, skim in rows:
            args += [_utf8(text), _utf8(skim), handle]
        self._archive(keys=keys, args=args)

    def archive_get(self, handle: str, scope: str = "") -> ArchiveRow | None:
        text, skim = self._redis.hmget(self._archive_ns(scope) + "a:" + handle, "t", "s")
        return None if text is None else (handle, _text(text), _text(skim or b""))

    def archive_search(self, query: str, limit: int, scope: str = "") -> list[ArchiveRow]:
        """Rows of ``scope`` whose text contains ``query`` case-insensitively, most recent
        first: its log read newest first in batches, the texts matched here (the server
        has no case-insensitive substring search)."""
        ns = self._archive_ns(scope)
        needle, end = query.casefold(), -1
        found: list[ArchiveRow] = []
        seen: set[bytes] = set()
        while len(found) < limit:
            handles = self._redis.lrange(ns + "alog", end - _SEARCH_BATCH + 1, end)
            if not handles:
                break
            with self._redis.pipeline(transaction=False) as pipe:
                for h in reversed(handles):
                    pipe.hmget(ns + "a:" + h.decode(), "t", "s")
                answers = pipe.execute()
            for h, (text, skim) in zip(reversed(handles), answers):
                if h in seen:  # archived again after its hash expired
                    continue
                seen.add(h)
                if text is not None and needle in _text(text).casefold():
                    found.append((h.decode(), _text(text), _text(skim or b"")))
            if len(handles) < _SEARCH_BATCH:
                break
            end -= _SEARCH_BATCH
        return found[:max(0, limit)]

    def archive_count(self, scope: str = "") -> int:
        return int(self._redis.llen(self._archive_ns(scope) + "alog"))

    def archive_touch(self, handles: Sequence[str], scope: str = "") -> None:
        """Expanded originals live ``ttl`` seconds from now (the server's expiry is the
        bound of a Redis store: least recently used go first)."""
        if not self.ttl:
            return
        namespace = self._archive_ns(scope)
        with self._redis.pipeline(transaction=False) as pipe:
            for handle in handles:
                pipe.expire(namespace + "a:" + handle, self.ttl)
            pipe.execute()

    # --- bounds -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """What the namespace holds (the change logs' lengths) and the server's memory
        and bounds: entries expire after ``ttl`` seconds unused, the server's
        ``maxmemory-policy`` evicts past ``maxmemory``."""
        memory = self._redis.info("memory")
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.llen(self._log)
            pipe.llen(self._alog)
            prefixes, archived = pipe.execute()
        return {"where": self._where, "ttl": self.ttl, "log_max": self.log_max,
                "used_memory": memory.get("used_memory"),
                "maxmemory": memory.get("maxmemory"),
                "maxmemory_policy": memory.get("maxmemory_policy"),
                "prefixes": {"logged": prefixes}, "archive": {"logged": archived}}

    def prune(self, **_bounds: Any) -> dict[str, int]:
        """Nothing to do here: keys expire on their own (``ttl``) and the server evicts
        past ``maxmemory``; the change logs are trimmed at every write (``log_max``)."""
        return {"prefix_entries": 0, "dropped": 0}

    def describe(self) -> str:
        return self._where

    def close(self) -> None:
        self._redis.close()


_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")
_OURS = "prefix, ttl, log_max, timeout, cache_entries, retry_after, max_staleness"


def _check_options(scheme: str, pool: Any, blank: list[str]) -> None:
    """Refuse, at start, a query option redis-py passes on to its connections and they
    do not take (``?bogus=1``): building one connection object (no I/O) raises the
    ``TypeError`` every request would otherwise fail with. Options left blank
    (``?tll=``), which redis-py skips, are tried by name too: a misspelt option is an
    error, not a setting silently lost."""
    try:
        pool.connection_class(**{**{k: None for k in blank}, **pool.connection_kwargs})
    except TypeError as exc:
        found = _UNEXPECTED.search(str(exc))
        name = repr(found.group(1)) if found else "in the query"
        raise StoreError(f"{scheme} store URL: unknown option {name}; agentcompact's are "
                         f"{_OURS}, the rest redis-py's connection options "
                         "(socket_keepalive, health_check_interval…)") from None


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
