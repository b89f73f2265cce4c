"""Shape checks the built-in dialects share: errors that name the index and the type of
what is not a message (never its content)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import DialectError

__all__ = ["check_objects", "not_an_object"]

_DICT = frozenset({dict})


def not_an_object(dialect: str, message: Any, index: int | None = None) -> DialectError:
    """The error for a message that is not a JSON object (its type named, never its value)."""
    where = "a message" if index is None else f"message {index}"
    return DialectError(f"{dialect}: {where} is {type(message).__name__}, not an object")


def check_objects(dialect: str, messages: Sequence[Any]) -> None:
    """Raise ``DialectError`` naming the first element of ``messages`` that is not a dict."""
    if set(map(type, messages)) <= _DICT:  # C speed: a proxy's requests hold 10k messages
        return
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise not_an_object(dialect, message, i)
