"""``PrefixEntry`` ↔ bytes for the persistent stores: ``PrefixEntry.to_dict`` as orjson,
with a format number so a future layout is told apart (and read as a miss, not a crash)."""

from __future__ import annotations

from typing import Any

import orjson

from .._store import PrefixEntry
from ..errors import StoreError

__all__ = ["FORMAT", "decode_entry", "encode_entry"]

FORMAT = 1
"""Layout number stored in every entry (``"f"``); entries of another number are misses."""


def _refuse(obj: Any) -> Any:
    raise TypeError(type(obj).__qualname__)


def encode_entry(entry: PrefixEntry) -> bytes:
    """The entry as compact JSON bytes.

    :raises StoreError: a message (or override) is not JSON-able — a framework message
        object, a string with lone surrogates, an integer past 64 bits. The error names
        the type, never the content.
    """
    data = entry.to_dict()
    data["f"] = FORMAT
    try:
        return orjson.dumps(data, default=_refuse)
    except orjson.JSONEncodeError as exc:
        cause = exc.__cause__
        kind = str(cause) if isinstance(cause, TypeError) else _first_bad(data)
        raise StoreError(
            f"prefix entry (strategy {entry.strategy!r}, cut {entry.cut}) cannot be stored: "
            f"a value of type {kind} is not JSON-serializable; persistent stores hold JSON "
            "dialect messages only (use the in-memory store for framework objects)") from None


def _first_bad(value: Any) -> str:
    """The type name of the first value orjson refuses (strings with lone surrogates,
    integers past 64 bits: orjson does not call ``default`` for those)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            try:
                orjson.dumps(item)
            except orjson.JSONEncodeError:
                return type(item).__qualname__
    return type(value).__qualname__


def decode_entry(raw: bytes) -> PrefixEntry | None:
    """The entry ``encode_entry`` wrote, or ``None`` for bytes of another layout or
    damaged bytes (a store is a cache: the engine then compacts afresh)."""
    try:
        data = orjson.loads(raw)
        if not isinstance(data, dict) or data.get("f") != FORMAT:
            return None
        return PrefixEntry.from_dict(data)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
        return None
