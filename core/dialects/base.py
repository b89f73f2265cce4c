"""The dialect interface: pure functions over native messages of one wire format.

A dialect never converts messages. The engine reads them through it (role, tool-call ids,
text parts, digest) and builds only its own compaction message and truncated copies;
every kept message passes through by reference.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
import xxhash

from ..archive import handle_of
from ..errors import DialectError, ValidationError
from ..markers import elision, is_marked, lines_elision

__all__ = ["ERROR_LINE", "Dialect", "Part", "Piece", "digest_of", "head_tail", "head_tail_spans",
           "truncated", "truncation_pieces"]

_VOLATILE_KEYS = frozenset({"cache_control"})


@dataclass(frozen=True, slots=True)
class Part:
    """One piece of a message's content, as the engine sees it.

    ``kind`` is ``text``, ``thinking``, ``tool_call``, ``tool_result``, ``image`` or
    ``other``. ``text`` is the verbatim text (for a tool call: its arguments as JSON;
    for an image or an opaque item: empty). ``name`` is a tool's name, ``ref`` a tool-call
    id. ``opaque`` marks content that must be passed byte-for-byte or not at all
    (signed or encrypted reasoning).
    """

    kind: str
    text: str = ""
    name: str = ""
    ref: str = ""
    opaque: bool = False


def _strip_volatile(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _VOLATILE_KEYS.isdisjoint(obj) and not any(
            isinstance(v, (dict, list)) for v in obj.values()
        ):
            return obj
        return {k: _strip_volatile(v) for k, v in obj.items() if k not in _VOLATILE_KEYS}
    if isinstance(obj, list):
        return [_strip_volatile(v) for v in obj]
    return obj


def digest_of(message: Any) -> str:
    """Canonical content digest of a JSON-able message; ``cache_control`` excluded."""
    try:
        data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
        if b'"cache_control"' in data:
            data = orjson.dumps(_strip_volatile(message), option=orjson.OPT_SORT_KEYS)
    except TypeError as exc:
        raise DialectError(f"message is not JSON-serializable: {exc}") from exc
    return xxhash.xxh3_128_hexdigest(data)


def head_tail_spans(text: str, max_chars: int) -> tuple[str, int, str]:
    """Split ``text`` for a head+tail cut: (head, omitted character count, tail)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text, 0, ""
    keep = max(max_chars, 2)
    head = keep // 2
    tail = keep - head
    return text[:head], len(text) - head - tail, text[len(text) - tail :]


#: a line worth keeping through a truncation: errors, failed tests, assertions, exit codes
ERROR_LINE = re.compile(
    r"Traceback|Error\b|Exception\b|FAIL|\bassert|Assertion|\bpanic|\bfatal\b|[Ee]rror:|"
    r"\bERROR\b|exit (?:code|status)|[Ee]xit[ _]?[Cc]ode|returncode|returned non-zero|"
    r"^E {2,}|^E\s+\w+|\d+ (?:failed|errors?)\b|Killed|Segmentation fault|No such file|"
    r"command not found|[Pp]ermission denied")
_ERROR_LINE_MAX = 400  # a longer matching line is not kept whole (it would crowd the rest)

Piece = tuple[bool, str]
"""(verbatim?, text): a quoted slice of the original, or a marker agentcompact wrote."""


def truncation_pieces(text: str, max_chars: int, *, inline: bool = False,
                      handle: str = "") -> list[Piece]:
    """``text`` cut to about ``max_chars`` characters of verbatim slices and markers.

    Multi-line text keeps whole lines: the head, the tail, and in between every
    error-looking line that fits (:data:`ERROR_LINE`: tracebacks, ``Error``, ``FAILED``,
    ``assert``, exit codes); each run of elided lines becomes one marker with the count of
    lines and characters elided (and ``handle``, where the original can be expanded).
    Short or single-line text (and ``inline`` text such as tool-call arguments) is cut by
    characters: half head, half tail.
    """
    if max_chars <= 0 or len(text) <= max_chars:
        return [(True, text)]
    if not inline and text.count("\n") >= 3:
        pieces = _line_pieces(text, max_chars, handle)
        if pieces is not None:
            return pieces
    head, omitted, tail = head_tail_spans(text, max_chars)
    return [(True, head), (False, elision(omitted, inline, handle)), (True, tail)]


def _line_pieces(text: str, budget: int, handle: str) -> list[Piece] | None:
    lines = text.splitlines(keepends=True)
    n = len(lines)
    keep = [False] * n
    used = 0

    def take(i: int, limit: int) -> bool:
        nonlocal used
        if keep[i] or used + len(lines[i]) > limit:
            return False
        keep[i] = True
        used += len(lines[i])
        return True

    head_end = 0
    while head_end < n and take(head_end, budget * 3 // 10):
        head_end += 1
    tail_start = n
    tail_limit = used + budget * 3 // 10
    while tail_start > head_end and take(tail_start - 1, tail_limit):
        tail_start -= 1
    for i in range(tail_start - 1, head_end - 1, -1):  # errors, the latest first
        if len(lines[i]) <= _ERROR_LINE_MAX and ERROR_LINE.search(lines[i]):
            take(i, budget)
    while tail_start > head_end and take(tail_start - 1, budget):  # the rest: more tail
        tail_start -= 1
    if used < budget // 4:
        return None  # long lines: a character cut keeps more
    for i in range(1, n - 1):  # a lone short line costs less than the marker for it
        if not keep[i] and keep[i - 1] and keep[i + 1] and len(lines[i]) <= 60:
            keep[i] = True
    out: list[Piece] = []
    run: list[str] = []
    gap_lines = gap_chars = 0
    for line, kept in zip(lines, keep):
        if kept:
            if gap_lines:
                out.append((False, lines_elision(gap_lines, gap_chars, handle)))
                gap_lines = gap_chars = 0
                handle = ""  # named once, in the first marker
            run.append(line)
            continue
        if run:
            out.append((True, "".join(run)))
            run = []
        gap_lines += 1
        gap_chars += len(line)
    if run:
        out.append((True, "".join(run)))
    if gap_lines:
        out.append((False, lines_elision(gap_lines, gap_chars, handle)))
    return out


def head_tail(text: str, max_chars: int, inline: bool = False, handle: str = "") -> str:
    """``text`` cut to about ``max_chars`` (see :func:`truncation_pieces`), as one string."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return "".join(t for _, t in truncation_pieces(text, max_chars, inline=inline,
                                                   handle=handle))


def truncated(text: str, max_chars: int) -> str:
    """``head_tail`` whose marker names the handle of the original (what dialects'
    ``truncate`` write: the cliff strategy archives the originals it may apply to)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return head_tail(text, max_chars, handle=handle_of(text))


class Dialect:
    """Base class of message dialects. Subclasses set ``name`` and implement the hooks.

    Native messages are treated as immutable values: no method mutates its argument.
    """

    name: ClassVar[str] = ""
    messages_key: ClassVar[str] = "messages"
    #: roles a compaction message may not directly follow (checked by the engine)
    model_roles: ClassVar[frozenset[str]] = frozenset({"assistant"})

    # --- reading one message -----------------------------------------------------
    def role(self, message: Any) -> str:
        """``system``, ``developer``, ``user``, ``assistant`` or ``tool``."""
        raise NotImplementedError

    def is_model_output(self, message: Any) -> bool:
        """True for an item the model produced (it belongs to an assistant step)."""
        return self.role(message) == "assistant"

    def tool_call_ids(self, message: Any) -> tuple[str, ...]:
        """Ids of the tool calls this message issues."""
        raise NotImplementedError

    def tool_result_ids(self, message: Any) -> tuple[str, ...]:
        """Ids of the tool calls this message answers."""
        raise NotImplementedError

    def parts(self, message: Any) -> list[Part]:
        """The message's content as parts, in order."""
        raise NotImplementedError

    def digest(self, message: Any) -> str:
        """Canonical content digest (volatile fields such as ``cache_control`` excluded)."""
        return digest_of(message)

    def text_of(self, message: Any) -> str:
        """All verbatim text of the message joined by newlines (for counting, search)."""
        return self.counted_text(message)[0]

    def counted_text(self, message: Any) -> tuple[str, int]:
        """What a message's size is counted from: its text parts joined by newlines (its
        ``text_of``) and the number of image parts. Dialects may answer without building
        parts (the same result, faster)."""
        parts = self.parts(message)
        return ("\n".join(p.text for p in parts if p.text),
                sum(1 for p in parts if p.kind == "image"))

    def is_synthetic(self, message: Any) -> bool:
        """True when the message is a compaction or summary message agentcompact wrote."""
        if self.role(message) != "user":
            return False
        for part in self.parts(message):
            if part.kind == "text":
                return is_marked(part.text)
        return False

    # --- building messages --------------------------------------------------------
    def text_message(self, text: str, role: str = "user") -> Any:
        """A new message of ``role`` holding ``text``."""
        raise NotImplementedError

    def truncate(self, message: Any, max_chars: int) -> Any:
        """A copy of ``message`` whose long text parts keep head and tail only.

        Tool-call ids, names and structure are preserved so pairing stays valid. Returns
        the message itself (same object) when nothing is longer than ``max_chars``.
        """
        raise NotImplementedError

    # --- request bodies -----------------------------------------------------------
    def messages_of(self, body: dict[str, Any]) -> list[Any]:
        """The message list of a request body."""
        value = body.get(self.messages_key)
        if not isinstance(value, list):
            raise DialectError(
                f"{self.name} request body has no list under {self.messages_key!r}"
            )
        return value

    def with_messages(self, body: dict[str, Any], messages: list[Any]) -> dict[str, Any]:
        """A shallow copy of ``body`` with its message list replaced."""
        out = dict(body)
        out[self.messages_key] = messages
        return out

    # --- validation ---------------------------------------------------------------
    def check_order(self, messages: Sequence[Any]) -> None:
        """Raise ``ValidationError`` for a role order the provider refuses."""

    def check_shape(self, message: Any, index: int) -> None:
        """Raise ``ValidationError`` when ``message`` is not a message of this dialect."""
        if not isinstance(message, dict):
            raise ValidationError(
                f"{self.name}: message {index} is {type(message).__name__}, not a dict",
                index,
            )
