"""Fresh copies of messages seen before, mapped back to the earlier objects.

The engine reuses its figures (digests, counts, chain digests, prefix sums) for the leading
messages of a history that are the same objects as at its previous call. A caller that
parses each request afresh (a server handing bodies to ``Engine.compact_request``) passes
new objects every time; :class:`Interner` maps each message whose JSON is byte-identical
(key order as received) to the previous call's message at the same position onto that
earlier object, so the engine's identity path applies. Anything else — an edited message, a
moved ``cache_control``, ``1`` turned into ``true`` — stays the caller's object and is
measured. (The proxy does not need this: its body parser hands back the earlier objects
itself, ``integrations/proxy/_bodies.py``.)
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import orjson
import xxhash

__all__ = ["Interner", "same_objects"]

_UNIQUE: Any = object()  # a "digest" of a message not taken: equal to no real digest


class Interner:
    """Byte-identical messages at the same position as last call → the earlier objects.

    One per engine (per history); not thread-safe on its own (``Engine.compact_request``
    calls it under the engine's lock)."""

    def __init__(self) -> None:
        self._last: list[Any] = []
        # digests of the JSON of ``_last`` (``_UNIQUE`` where not taken); ``None``: not
        # taken yet (the last call shared everything by identity)
        self._raw: list[Any] | None = None

    def intern(self, messages: Sequence[Any]) -> list[Any]:
        """``messages`` as a new list, each message byte-identical to the previous call's
        message at its position replaced by that earlier object."""
        msgs = list(messages)
        old = self._last
        overlap = min(len(msgs), len(old))
        k = same_objects(msgs, old)
        if k < overlap:
            raw = _raw_digests(msgs, k)
            old_raw = self._raw
            if old_raw is None:
                old_raw = [_UNIQUE] * k + _raw_digests(old, k, overlap)
            same = list(map(operator.eq, raw[: overlap - k], old_raw[k:overlap]))
            if all(same):
                msgs[k:overlap] = old[k:overlap]
            else:
                for i, equal in enumerate(same, k):
                    if equal:
                        msgs[i] = old[i]
            self._raw = old_raw[:k] + raw
        else:
            self._raw = None
        self._last = msgs
        return msgs

    def forget(self) -> None:
        self._last, self._raw = [], None


def same_objects(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items of ``a`` and ``b`` are the same objects (identity)."""
    if all(map(operator.is_, a, b)):  # C-speed scan; stops at the first difference
        return min(len(a), len(b))
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x is not y)


def _raw_digests(messages: list[Any], start: int, end: int | None = None) -> list[Any]:
    """Digests of the JSON of ``messages[start:end]`` as it is (key order kept);
    ``_UNIQUE`` for a message that is not JSON-able."""
    items = messages[start:end]
    try:
        return list(map(xxhash.xxh3_128_intdigest, map(orjson.dumps, items)))
    except TypeError:
        out: list[Any] = []
        for message in items:
            try:
                out.append(xxhash.xxh3_128_intdigest(orjson.dumps(message)))
            except TypeError:
                out.append(object())  # equal to nothing, not even another such message
        return out
