"""Tokens of a request body besides its messages: system prompt, instructions, tool schemas
(the body fields the dialect names: ``Dialect.fixed_keys``).

:class:`FixedTokens` counts them for ``Engine.fixed_tokens`` and remembers the counts: by
content (the texts joined), and by identity for the last body's values — a proxy's next
request of a session shares them when unchanged (its body parser hands back the earlier
objects), so Claude Code's ~80 kB of tool schemas are not serialized again on every
request. Like messages, the values are taken as immutable once counted.

An integration whose framework holds these parts as objects (a LangChain system message,
tool objects) passes them as they are with a ``convert`` to their body value: a value
that is a tuple is remembered by the identity of its items, so the conversion (of every
tool's schema) runs only when an item changed.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ._tokens import TokenCounter
from .dialects._base import json_text

__all__ = ["FixedTokens"]

_KEYS = ("system", "instructions", "tools")
_MAX_TEXTS = 256  # distinct fixed parts remembered (then forgotten all at once)


class FixedTokens:
    """Counts of the fixed part of request bodies in one counter (not thread-safe on its own:
    a set of counts may be computed twice, never a wrong one).

    :param keys: the body fields counted (default: system, instructions, tools).
    :param convert: ``convert(key, value)`` is the body value of ``body[key]`` (default:
        the value itself); what it returns is counted as its text, or as its JSON.
    """

    def __init__(self, counter: TokenCounter, keys: tuple[str, ...] | None = None,
                 convert: Callable[[str, Any], Any] | None = None) -> None:
        self._counter = counter
        self._keys = keys or _KEYS
        self._convert = convert
        self._by_text: dict[str, int] = {}
        self._last: tuple[tuple[Any, ...], int] | None = None

    def count(self, body: dict[str, Any]) -> int:
        values = tuple(body.get(key) for key in self._keys)
        last = self._last
        if last is not None and (all(map(operator.is_, values, last[0]))
                                 or all(map(_same, values, last[0]))):
            return last[1]
        convert = self._convert
        parts = values if convert is None else tuple(map(convert, self._keys, values))
        texts = [value if isinstance(value, str) else json_text(value)
                 for value in parts if value]
        total = 0
        if texts:
            key = "\x00".join(texts)
            found = self._by_text.get(key)
            if found is None:
                found = sum(self._counter.count_texts(texts))
                if len(self._by_text) > _MAX_TEXTS:
                    self._by_text.clear()
                self._by_text[key] = found
            total = found
        self._last = (values, total)
        return total


def _same(a: Any, b: Any) -> bool:
    """``a is b``, or both tuples of the same items (by identity)."""
    return a is b or (type(a) is tuple and type(b) is tuple and len(a) == len(b)
                      and all(map(operator.is_, a, b)))
