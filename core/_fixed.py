"""Tokens of a request body besides its messages: system prompt, instructions, tool schemas
(the body fields the dialect names: ``Dialect.fixed_keys``).

:class:`FixedTokens` counts them for ``Engine.fixed_tokens`` and remembers the counts: by
content (the texts joined), and by identity for the last body's values — a proxy's next
request of a session shares them when unchanged (its body parser hands back the earlier
objects), so Claude Code's ~80 kB of tool schemas are not serialized again on every
request. Like messages, the values are taken as immutable once counted.
"""

from __future__ import annotations

import operator
from typing import Any

from ._tokens import TokenCounter
from .dialects._base import json_text

__all__ = ["FixedTokens"]

_KEYS = ("system", "instructions", "tools")
_MAX_TEXTS = 256  # distinct fixed parts remembered (then forgotten all at once)


class FixedTokens:
    """Counts of the fixed part of request bodies in one counter (not thread-safe on its own:
    a set of counts may be computed twice, never a wrong one)."""

    def __init__(self, counter: TokenCounter, keys: tuple[str, ...] | None = None) -> None:
        self._counter = counter
        self._keys = keys or _KEYS
        self._by_text: dict[str, int] = {}
        self._last: tuple[tuple[Any, ...], int] | None = None

    def count(self, body: dict[str, Any]) -> int:
        values = tuple(body.get(key) for key in self._keys)
        last = self._last
        if last is not None and all(map(operator.is_, values, last[0])):
            return last[1]
        texts = [value if isinstance(value, str) else json_text(value)
                 for value in values if value]
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
