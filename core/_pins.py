"""What a pin keeps, and how much of it a compaction carries.

A plugin pins a message (``agentcompact_pin``); the engine keeps its **pinned text**
verbatim in every compaction message: the text the user typed, never the parts that share
its message. In Claude Code a rule typed while tools run arrives in a user message that
also carries the ``tool_result`` blocks of the running calls; those are compacted like any
other result. Text a harness injects into user messages is not what the user typed either:
Claude Code's ``<system-reminder>`` blocks, its local-command wrappers, Codex's
``<environment_context>`` and ``AGENTS.md`` instructions (:data:`HARNESS_TAGS`).

Pins are bounded: the pinned text a compaction message quotes takes at most
:data:`PIN_SHARE` of the target. Past it the oldest pins give way: the strategy renders
them like any other message (the cliff strategy keeps at least their skim line, whose
handle expands to the original), and the compaction event lists them (``unpinned``).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ._interner import same_objects
from .dialects._base import Dialect

__all__ = ["HARNESS_TAGS", "PIN_SHARE", "PinLookup", "bound_pins", "pinned_texts", "split_injected",
           "typed_pieces"]

#: The share of the target the pinned text of one compaction message may take (of
#: ``Budget.target_for(fixed)``: 2,100 tokens at a 60k trigger with the default target).
#: Past it the oldest pins are rendered as ordinary messages.
PIN_SHARE = 0.10

#: Elements a harness writes into user messages, never typed by the user: Claude Code's
#: reminders, hook output and local-command wrappers, Codex's environment context, user
#: instructions (``AGENTS.md``), shell-command echoes and notices (as the real CLIs send
#: them: ``tests/clis``).
HARNESS_TAGS = (
    "system-reminder", "local-command-caveat", "local-command-stdout",
    "local-command-stderr", "command-name", "command-message", "command-args",
    "bash-input", "bash-stdout", "bash-stderr", "user-prompt-submit-hook",
    "environment_context", "user_instructions", "INSTRUCTIONS", "user_shell_command",
    "turn_aborted", "subagent_notification", "context_window_reminder", "skill",
    "startup_context", "image_resize_notice",
)
_INJECTED = re.compile(
    r"(?:#\s*AGENTS\.md instructions for [^\n]*\n\s*)?"
    r"<(" + "|".join(map(re.escape, HARNESS_TAGS)) + r")(?:\s[^<>]*)?>.*?</\1>",
    re.DOTALL,
)


def typed_pieces(text: str) -> tuple[str, ...]:
    """The pieces of ``text`` outside the elements a harness injects (:data:`HARNESS_TAGS`),
    trimmed, empty ones left out: each is a substring of ``text``."""
    return split_injected(text)[0]


def split_injected(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``text`` as its typed pieces (:func:`typed_pieces`) and the elements a harness
    injected into it, in order; every piece a substring of ``text``."""
    if "<" not in text:
        piece = text.strip()
        return ((piece,) if piece else ()), ()
    typed, injected = [], []
    start = 0
    for match in _INJECTED.finditer(text):
        typed.append(text[start:match.start()].strip())
        injected.append(match.group(0))
        start = match.end()
    typed.append(text[start:].strip())
    return tuple(p for p in typed if p), tuple(injected)


def pinned_texts(dialect: Dialect, message: Any) -> tuple[str, ...]:
    """The text a pin of ``message`` keeps verbatim: the typed pieces of its text parts
    (:func:`typed_pieces`); for a message without any (a pinned tool output), the text of
    every part."""
    parts = dialect.parts(message)
    typed = tuple(piece for p in parts if p.kind == "text" and p.text
                  for piece in typed_pieces(p.text))
    if typed:
        return typed
    return tuple(p.text for p in parts if p.text)


def bound_pins(pins: Sequence[int], tokens: Mapping[int, int], budget: int
               ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``pins`` split into those kept (the newest whose pinned text fits ``budget`` tokens
    together) and those past the budget (the older ones), both ascending."""
    kept: list[int] = []
    used = 0
    for k, i in enumerate(reversed(pins)):
        used += tokens[i]
        if used > budget:
            return tuple(reversed(kept)), tuple(pins[: len(pins) - k])
        kept.append(i)
    return tuple(reversed(kept)), ()


_PIN_MEMO_MAX = 200_000  # pin answers remembered (more: forgotten, asked again)


class PinLookup:
    """The seam where pins are found: the ``agentcompact_pin`` hook's answer for each
    message and index, and each pin's pinned text and its tokens, remembered by the
    message's identity (the engine takes messages as immutable values; an entry holds its
    message, so its id stays its). The hook is asked once per message and index: its
    answer is a function of the message, its index and the dialect, as the store keys
    already assume (a stored compaction is reused without asking again). Answers hold for
    the plugin set they came from: :meth:`forget` when it changes."""

    def __init__(self, pm: Any, dialect: Dialect, counter: Any) -> None:
        self._hook = pm.hook.agentcompact_pin
        self._dialect = dialect
        self._counter = counter
        self._answers: dict[int, tuple[Any, int, bool]] = {}
        self._texts: dict[int, tuple[Any, tuple[str, ...], int]] = {}
        #: the last :meth:`within`: its messages up to ``hi``, its ``lo`` and its pins
        self._run: tuple[list[Any], int, list[int]] = ([], 0, [])

    def forget(self) -> None:
        """Forget the hook's answers (the plugin set changed)."""
        self._answers = {}
        self._run = ([], 0, [])

    def within(self, messages: Sequence[Any], lo: int, hi: int) -> tuple[int, ...]:
        """Indices in ``[lo, hi)`` a plugin pins (synthetic messages never are). The
        answers of the last call's range are reused where the messages are the same
        objects (a history replayed at once asks at every threshold crossing)."""
        if not self._hook.get_hookimpls():
            return ()
        seen, start, found = self._run
        k = min(same_objects(seen, messages), hi)
        if start <= lo <= k:
            known = found[:bisect.bisect_left(found, k)]
            out = known + self._ask(messages, k, hi)
            self._run = (list(messages[:hi]), start, out)
            return tuple(out[bisect.bisect_left(out, lo):])
        out = self._ask(messages, lo, hi)
        self._run = (list(messages[:hi]), lo, out)
        return tuple(out)

    def _ask(self, messages: Sequence[Any], lo: int, hi: int) -> list[int]:
        """Indices in ``[lo, hi)`` the hook pins, its answers remembered by message."""
        hook = self._hook
        memo = self._answers
        if len(memo) > _PIN_MEMO_MAX:
            memo.clear()
        dialect = self._dialect
        out = []
        for i in range(lo, hi):
            message = messages[i]
            found = memo.get(id(message))
            if found is not None and found[0] is message and found[1] == i:
                pinned = found[2]
            else:
                pinned = not dialect.is_synthetic(message) and any(
                    r is True for r in hook(message=message, index=i, dialect=dialect))
                memo[id(message)] = (message, i, pinned)
            if pinned:
                out.append(i)
        return out

    def text(self, message: Any) -> tuple[tuple[str, ...], int]:
        """The pinned text of ``message`` (:func:`pinned_texts`) and its tokens."""
        memo = self._texts
        found = memo.get(id(message))
        if found is not None and found[0] is message:
            return found[1], found[2]
        if len(memo) > _PIN_MEMO_MAX:
            memo.clear()
        texts = pinned_texts(self._dialect, message)
        tokens = sum(self._counter.count_texts(list(texts))) if texts else 0
        memo[id(message)] = (message, texts, tokens)
        return texts, tokens

    def keeps_pinned(self, message: Any, copy: Any) -> bool:
        """Whether the truncated ``copy`` of pinned ``message`` holds its pinned text."""
        try:
            text = self._dialect.text_of(copy)
            return all(t in text for t in self.text(message)[0])
        except Exception:
            return False
