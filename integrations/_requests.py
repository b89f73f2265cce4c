"""What the integrations read from an agent's requests, written once for all of them:
JSON-safe copies of SDK values, each message converted once, and where each request
shape keeps its context."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["MessageCopies", "RequestShape", "json_safe"]


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data (SDK objects as their ``model_dump``, others as text)."""
    return orjson.loads(orjson.dumps(value, default=_default))


def _default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    return str(value)


class MessageCopies:
    """Each message of a history converted by ``convert``, once per message object:
    histories are taken as immutable once sent (as the engine takes them), and an agent's
    next call re-sends the same objects. A call's copies are shared, not copied again.

    :param max_entries: conversions kept (then forgotten all at once).
    """

    def __init__(self, convert: Callable[[Any], Any], max_entries: int = 20_000) -> None:
        self._convert = convert
        self._by_id: dict[int, tuple[Any, Any]] = {}
        self._max = max_entries
        self._lock = threading.Lock()

    def __call__(self, messages: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        by_id, convert = self._by_id, self._convert
        with self._lock:
            for message in messages:
                hit = by_id.get(id(message))
                if hit is None or hit[0] is not message:
                    if len(by_id) >= self._max:
                        by_id.clear()
                    hit = by_id[id(message)] = (message, convert(message))
                out.append(hit[1])
        return out


@dataclass(frozen=True, slots=True)
class RequestShape:
    """Where one kind of request keeps its context."""

    dialect: str
    key: str  # the messages field
    fixed: tuple[str, ...]  # fields besides the messages that the model receives
