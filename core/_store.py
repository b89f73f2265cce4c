"""The prefix store: original prefix → its compacted replacement.

An entry is stored under the chain digest of the original prefix ``messages[:cut]`` it
replaced (a chain seeded with the engine's configuration fingerprint and episode, so
engines of other settings sharing the store never see it), and holds the head length, the
messages of the span kept verbatim and the compaction message. Only validated outputs are
stored. A later call whose
history starts with the same original prefix sends ``messages[:head_len] + [message] +
messages[cut:]``: the compacted prefix is byte-identical until the next cliff, so provider
prompt caches keep hitting. Kept messages that escalation truncated are stored as
``overrides`` (index → truncated copy, with the original's digest as a guard).

The store is a cache: compaction is deterministic, so an evicted entry is recomputed
identically. ``InMemoryPrefixStore`` is an LRU bounded by entries and bytes; anything with
``get(key)`` / ``put(key, entry)`` works (e.g. a Redis-backed store for several proxy
workers: entries round-trip through ``to_dict`` / ``from_dict``). A store may also expose
an integer ``version`` that changes whenever an entry is added, replaced or removed: a
:class:`PrefixScan` (the engine's lookup) then re-checks only the prefixes it has not
checked since (``InMemoryPrefixStore`` has one; without it every lookup checks every prefix
length of the history).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import orjson
import xxhash

__all__ = ["InMemoryPrefixStore", "PrefixEntry", "PrefixStore", "chain_digests", "extend_chain"]


def chain_digests(digests: Sequence[str], start: Sequence[str] = (), seed: str = ""
                  ) -> list[str]:
    """``chain[i]`` identifies ``messages[:i+1]`` as a sequence; extends ``start``.

    ``seed`` starts the chain: the engine seeds it with the fingerprint of everything that
    changes its output (and the episode), so its chain digests are its store keys."""
    chain = list(start)
    extend_chain(chain, digests[len(chain):], seed)
    return chain


def extend_chain(chain: list[str], digests: Sequence[str], seed: str = "") -> None:
    """Append to ``chain`` (the chain digests of the messages before) the chain digests
    of the messages whose digests are ``digests``, in place."""
    prev = chain[-1] if chain else seed
    digest = xxhash.xxh3_128_hexdigest
    append = chain.append
    for d in digests:
        prev = digest((prev + d).encode())
        append(prev)


@dataclass(frozen=True)
class PrefixEntry:
    """A compacted replacement of ``messages[:cut]`` (see module docstring)."""

    head_len: int
    cut: int
    message: Any
    message_tokens: int
    strategy: str
    level: int = 0
    overrides: dict[int, tuple[str, Any, int]] = field(default_factory=dict)
    """index → (digest of the original, truncated copy, its tokens)"""
    kept: tuple[int, ...] = ()
    """indices in ``[head_len, cut)`` sent verbatim before the compaction message:
    instructions, items the dialect does not model, compaction messages fed back in"""
    folds: tuple[tuple[int, str], ...] = ()
    """(index, digest) of the large tool outputs of the newest kept turn, whole because
    the agent had not read them: truncated at the first call after it has (the engine's
    fold; ``()`` once done)"""
    length: int = 0
    """the length of the prefix the entry is stored under, when not ``cut``: a folded
    entry is stored under the first prefix that holds the agent's read of the outputs it
    folds, so a history without that read (a retried request) still finds the unfolded one"""

    @property
    def key_length(self) -> int:
        """The length of the prefix whose chain digest keys this entry."""
        return self.length or self.cut

    def to_dict(self) -> dict[str, Any]:
        return {
            "head_len": self.head_len, "cut": self.cut, "message": self.message,
            "message_tokens": self.message_tokens, "strategy": self.strategy,
            "level": self.level,
            "overrides": {str(k): list(v) for k, v in self.overrides.items()},
            "kept": list(self.kept),
            "folds": [list(f) for f in self.folds],
            "length": self.length,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrefixEntry:
        overrides = {int(k): (v[0], v[1], int(v[2])) for k, v in data["overrides"].items()}
        return cls(data["head_len"], data["cut"], data["message"], data["message_tokens"],
                   data["strategy"], data.get("level", 0), overrides,
                   tuple(int(i) for i in data.get("kept", ())),
                   tuple((int(i), str(d)) for i, d in data.get("folds", ())),
                   int(data.get("length", 0)))

    def nbytes(self) -> int:
        """Approximate memory of the entry (messages of framework objects: their repr)."""
        return _size(self.message) + sum(_size(v[1]) for v in self.overrides.values())


def _size(message: Any) -> int:
    try:
        return len(orjson.dumps(message))
    except TypeError:  # a framework message object (LangChain, LlamaIndex)
        return len(repr(message))


@runtime_checkable
class PrefixStore(Protocol):
    """Where compacted prefixes are kept. Must be safe to call from several threads.

    Optional: an ``int`` attribute ``version`` that changes on every ``put`` and every
    removal (eviction, expiry) lets engines skip prefixes they already found absent.
    """

    def get(self, key: str) -> PrefixEntry | None: ...

    def put(self, key: str, entry: PrefixEntry) -> None: ...


class PrefixScan:
    """The longest stored prefix of a history: the engine's lookup in one store.

    Every prefix length is a candidate, longest first. With a store that has a ``version``,
    the lengths the previous scan found empty are skipped while the version is unchanged
    and the history up to them is the same (the same answer: nothing was put since): a call
    that adds a message asks the store about that message only, and one that changes or
    replaces later messages (a request parsed afresh with another last message, an edit)
    about the lengths from the first changed message on. O(1) store lookups per appended
    message at any history length. Not thread-safe on its own (the engine calls it under
    its lock).
    """

    def __init__(self, store: PrefixStore) -> None:
        self.store = store
        # the last scan: (store version, its chain, n, length of the hit or 0)
        self._memo: tuple[int, Sequence[str], int, int] | None = None

    def forget(self) -> None:
        """Scan every prefix next time (the chain's seed changed)."""
        self._memo = None

    def find(self, chain: Sequence[str], n: int) -> PrefixEntry | None:
        """The stored entry replacing the longest prefix of the first ``n`` messages whose
        chain digests are ``chain`` (``entry.key_length`` is its length). ``chain`` is kept for
        the next scan: its first ``n`` entries must not be changed afterwards (the engine
        appends to it, :meth:`Engine._grow_view`)."""
        get = self.store.get
        version = getattr(self.store, "version", None)
        memo = self._memo
        low = hit = 0
        if memo is not None and memo[0] == version:
            shared = _shared_length(chain, memo[1], min(n, memo[2]))
            if memo[3] <= shared:  # the lengths up to ``shared`` were all checked then
                low, hit = shared, memo[3]
        found: PrefixEntry | None = None
        at = 0
        whole = False  # an entry that would replace the whole history was passed over
        for i in range(n, low, -1):
            entry = get(chain[i - 1])
            if entry is not None and entry.key_length == i and entry.head_len <= i:
                if entry.cut >= n:  # stored for a longer history: nothing of this one
                    whole = True  # would follow it (a retry, a fork); a later call may
                    continue      # use it, so this scan is not remembered
                found, at = entry, i
                break
        else:
            if hit:
                entry = get(chain[hit - 1])
                if (entry is not None and entry.key_length == hit and entry.head_len <= hit
                        and entry.cut < n):
                    found, at = entry, hit
                else:  # removed without a version change, or it would replace the whole
                    self._memo = None  # history: check every prefix
                    return self.find(chain, n)
        if version is not None and n and not whole:
            self._memo = (version, chain, n, at)
        elif whole:
            self._memo = None
        return found


def _shared_length(a: Sequence[str], b: Sequence[str], limit: int) -> int:
    """The longest ``m <= limit`` with ``a[m-1] == b[m-1]``: chain digests, so equal at
    ``m-1`` means equal before it too (a binary search, O(log limit))."""
    if limit <= 0 or a[limit - 1] == b[limit - 1]:
        return max(limit, 0)
    lo, hi = 0, limit  # a[:lo] == b[:lo]; a[hi-1] != b[hi-1]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid
    return lo


class InMemoryPrefixStore:
    """Thread-safe LRU store bounded by entry count and serialized bytes.

    ``version`` counts the ``put`` calls (evictions happen only in ``put``).
    """

    def __init__(self, max_entries: int = 4096, max_bytes: int = 256 * 1024 * 1024) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._data: OrderedDict[str, tuple[PrefixEntry, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.version = 0

    def get(self, key: str) -> PrefixEntry | None:
        if key not in self._data:  # lock-free miss: the common case of a prefix scan
            return None
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            self._data.move_to_end(key)
            return hit[0]

    def put(self, key: str, entry: PrefixEntry) -> None:
        size = entry.nbytes()
        with self._lock:
            self.version += 1
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._data[key] = (entry, size)
            self._bytes += size
            while len(self._data) > 1 and (
                len(self._data) > self._max_entries or self._bytes > self._max_bytes
            ):
                _, (_, evicted) = self._data.popitem(last=False)
                self._bytes -= evicted

    def __len__(self) -> int:
        return len(self._data)

    @property
    def nbytes(self) -> int:
        return self._bytes
