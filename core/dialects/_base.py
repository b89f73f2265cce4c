"""The dialect interface: pure functions over native messages of one wire format.

A dialect never converts messages. The engine reads them through it (role, tool-call ids,
text parts, digest) and builds only its own compaction message and truncated copies;
every kept message passes through by reference.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, ClassVar

import orjson
import xxhash

from .._archive import handle_of
from .._markers import elision, is_marked, lines_elision
from ..errors import DialectError, ValidationError

__all__ = ["ERROR_LINE", "Dialect", "LineIndex", "Part", "Piece", "digest_of", "head_tail",
           "head_tail_spans", "json_text", "line_index", "safe_json", "truncated",
           "truncation_pieces"]

_VOLATILE_KEYS = frozenset({"cache_control"})
_INSTRUCTION_ROLES = frozenset({"system", "developer"})


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


_END = object()


def safe_json(value: Any, *, sort_keys: bool = False, volatile: bool = True) -> str:
    """JSON text of ``value`` for any JSON-shaped value orjson refuses: lone surrogates
    (escaped as ``\\udXXX``) and nesting deeper than orjson's 255 levels (built without
    recursion). ``volatile=False`` leaves out ``cache_control`` keys. Raises ``TypeError``
    naming the type of a value that is not JSON (never the value)."""
    out: list[str] = []
    stack: list[Any] = [value]
    dumps = json.dumps
    while stack:
        item = stack.pop()
        if item is _END:
            out.append(stack.pop())
            continue
        if isinstance(item, _Raw):
            out.append(item.text)
            continue
        if isinstance(item, dict):
            keys = list(item)
            if not volatile:
                keys = [k for k in keys if k not in _VOLATILE_KEYS]
            if sort_keys:
                keys.sort(key=str)
            stack.append("}")
            stack.append(_END)
            for n, key in enumerate(reversed(keys)):
                stack.append(item[key])
                sep = "" if n == len(keys) - 1 else ","
                stack.append(_Raw(sep + dumps(str(key)) + ":"))
            out.append("{")
        elif isinstance(item, (list, tuple)):
            stack.append("]")
            stack.append(_END)
            for n, element in enumerate(reversed(item)):
                if n != len(item) - 1:
                    stack.append(element)
                    stack.append(_Raw(","))
                else:
                    stack.append(element)
            out.append("[")
        elif item is None or isinstance(item, (str, int, float, bool)):
            out.append(dumps(item))
        else:
            raise TypeError(f"a {type(item).__name__} is not JSON")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class _Raw:
    text: str


def json_text(value: Any) -> str:
    """JSON text of ``value`` (orjson; :func:`safe_json` for what orjson refuses)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return safe_json(value)


def digest_of(message: Any) -> str:
    """Canonical content digest of a JSON-able message; ``cache_control`` excluded.

    A message orjson refuses (a lone surrogate, nesting deeper than 255 levels) is
    digested from :func:`safe_json` instead: one odd message never disables a session.
    Raises ``DialectError`` naming the type of a value that is not JSON at all.
    """
    try:
        data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
        if b'"cache_control"' in data:
            data = orjson.dumps(_strip_volatile(message), option=orjson.OPT_SORT_KEYS)
    except TypeError:
        try:
            data = b"\x00safe" + safe_json(message, sort_keys=True, volatile=False).encode(
                "utf-8", "surrogatepass")
        except TypeError as exc:
            raise DialectError(f"message is not JSON-serializable: {exc}") from None
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
#: every match of ERROR_LINE contains one of these literals or starts its line with "E"
#: (``^E``): a line without any is not searched (the regex tries all its alternatives at
#: every character; ``str.find`` over the whole text is a fraction of that)
_ERROR_LITERALS = ("rror", "ERROR", "xcept", "FAIL", "ssert", "panic", "fatal", "xit",
                   "returncode", "returned non-zero", "failed", "Killed", "Segmentation fault",
                   "No such file", "command not found", "ermission denied", "Traceback")

Piece = tuple[bool, str]
"""(verbatim?, text): a quoted slice of the original, or a marker agentcompact wrote."""


LineIndex = tuple[list[str], list[int]]
"""A text's lines (``splitlines(keepends=True)``) and its error lines (:func:`line_index`)."""


def line_index(text: str) -> LineIndex:
    """What cutting ``text`` by lines needs at any size: its lines and the indices of its
    error-looking lines (a caller cutting one text to several sizes computes it once)."""
    lines = text.splitlines(keepends=True)
    return lines, _error_lines(text, lines)


def truncation_pieces(text: str, max_chars: int, *, inline: bool = False,
                      handle: str = "", index: LineIndex | None = None) -> list[Piece]:
    """``text`` cut to about ``max_chars`` characters of verbatim slices and markers.

    Multi-line text keeps whole lines: the head, the tail, and in between every
    error-looking line that fits (:data:`ERROR_LINE`: tracebacks, ``Error``, ``FAILED``,
    ``assert``, exit codes); each run of elided lines becomes one marker with the count of
    lines and characters elided (and ``handle``, where the original can be expanded).
    Short or single-line text (and ``inline`` text such as tool-call arguments) is cut by
    characters: half head, half tail. ``index``: ``line_index(text)``, when the caller has
    it already.
    """
    if max_chars <= 0 or len(text) <= max_chars:
        return [(True, text)]
    if not inline and text.count("\n") >= 3:
        pieces = _line_pieces(text, max_chars, handle, index or line_index(text))
        if pieces is not None:
            return pieces
    head, omitted, tail = head_tail_spans(text, max_chars)
    return [(True, head), (False, elision(omitted, inline, handle)), (True, tail)]


def _error_lines(text: str, lines: Sequence[str]) -> list[int]:
    """Indices of the lines of ``text`` (``lines``: its ``splitlines(keepends=True)``)
    that match :data:`ERROR_LINE` and are short enough to keep whole, in order."""
    starts = list(accumulate(map(len, lines), initial=0))
    candidates = {i for i, line in enumerate(lines) if line[:1] == "E"}
    find = text.find
    for literal in _ERROR_LITERALS:  # no literal holds a line break: one line per hit
        at = find(literal)
        while at >= 0:
            i = bisect_right(starts, at) - 1
            candidates.add(i)
            at = find(literal, starts[i + 1])
    search = ERROR_LINE.search
    return [i for i in sorted(candidates)
            if len(lines[i]) <= _ERROR_LINE_MAX and search(lines[i])]


def _line_pieces(text: str, budget: int, handle: str, index: LineIndex
                 ) -> list[Piece] | None:
    lines, errors = index
    n = len(lines)
    keep = bytearray(n)
    kept: list[int] = []  # what ``keep`` marks: the work is by kept lines, not all lines
    used = 0

    def take(i: int, limit: int) -> bool:
        nonlocal used
        if keep[i] or used + len(lines[i]) > limit:
            return False
        keep[i] = 1
        kept.append(i)
        used += len(lines[i])
        return True

    head_end = 0
    while head_end < n and take(head_end, budget * 3 // 10):
        head_end += 1
    tail_start = n
    tail_limit = used + budget * 3 // 10
    while tail_start > head_end and take(tail_start - 1, tail_limit):
        tail_start -= 1
    for i in reversed(errors[bisect_left(errors, head_end):bisect_left(errors, tail_start)]):
        take(i, budget)  # errors, the latest first
    while tail_start > head_end and take(tail_start - 1, budget):  # the rest: more tail
        tail_start -= 1
    if used < budget // 4:
        return None  # long lines: a character cut keeps more
    # a lone short line between kept ones costs less than the marker for it (a line kept
    # here never makes its neighbour lone: that one is kept already)
    lone = [k + 1 for k in kept if k + 2 < n and not keep[k + 1] and keep[k + 2]
            and len(lines[k + 1]) <= 60]
    kept += lone
    kept.sort()
    out: list[Piece] = []
    run = prev = -1  # the first line of the run of kept lines, the last kept line
    for i in kept:
        if i > prev + 1:  # lines prev+1 .. i-1 elided
            if run >= 0:
                out.append((True, "".join(lines[run:prev + 1])))
            out.append((False, lines_elision(i - prev - 1, sum(map(len, lines[prev + 1:i])),
                                             handle)))
            handle = ""  # named once, in the first marker
            run = i
        elif run < 0:
            run = i
        prev = i
    if run >= 0:
        out.append((True, "".join(lines[run:prev + 1])))
    if prev < n - 1:
        out.append((False, lines_elision(n - 1 - prev, sum(map(len, lines[prev + 1:])),
                                         handle)))
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



def first_text_marked(parts: Iterable[Part]) -> bool:
    """Whether the first text part of ``parts`` carries agentcompact's marker: a user
    message's parts are then :meth:`Dialect.is_synthetic` (for a caller that has them)."""
    for part in parts:
        if part.kind == "text":
            return is_marked(part.text)
    return False

class Dialect:
    """Base class of message dialects. Subclasses set ``name`` and implement the hooks.

    Native messages are treated as immutable values: no method mutates its argument.
    """

    name: ClassVar[str] = ""
    messages_key: ClassVar[str] = "messages"
    #: roles a compaction message may not directly follow (checked by the engine)
    model_roles: ClassVar[frozenset[str]] = frozenset({"assistant"})
    #: the request-body fields besides the messages that the model reads and that count
    #: against the budget (``Engine.fixed_tokens``): system prompt, instructions, tools
    fixed_keys: ClassVar[tuple[str, ...]] = ("system", "instructions", "tools")

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

    # --- what the engine must keep as it is ------------------------------------------
    def is_instruction(self, message: Any) -> bool:
        """True for an instruction to the model (``system`` / ``developer`` role), wherever
        it stands in the history.

        Contract (kept by the engine for every strategy): an instruction is kept like a
        pinned message. It is never dropped, never truncated and never flattened into
        compaction text; it is emitted verbatim, as its own message, in its original
        order relative to the other kept messages (an instruction from the compacted span
        stands between the head and the compaction message), and it counts with its real
        tokens. Instructions are system/developer directions, never history to drop.
        Dialects override this for roles or items they know to be instructions.
        """
        try:
            return self.role(message) in _INSTRUCTION_ROLES
        except Exception:  # a malformed message is not an instruction; validation says why
            return False

    def is_opaque(self, message: Any) -> bool:
        """True for an item, role or block type this dialect does not model (default:
        none).

        Contract: the engine treats an opaque message like an instruction (see
        :meth:`is_instruction`): kept verbatim in its original relative order, counted by
        its real tokens, never dropped, truncated or rendered into compaction text. A
        dialect returns ``True`` for what it cannot read (an unknown Responses item such as
        ``additional_tools``, an unknown content block type), so compaction never loses
        what it does not understand.
        """
        return False

    def is_kept(self, message: Any) -> bool:
        """``is_instruction(message) or is_opaque(message)``: a message the engine keeps
        verbatim whatever the strategy does."""
        return self.is_instruction(message) or self.is_opaque(message)

    def thinking_loops(self) -> bool:
        """True when the provider refuses a tool loop whose thinking block was cut away
        (Anthropic extended thinking): the engine then never cuts inside the current tool
        loop at a message that does not start with thinking. Default ``False``."""
        return False

    def is_synthetic(self, message: Any) -> bool:
        """True when the message is a compaction or summary message agentcompact wrote."""
        return self.role(message) == "user" and first_text_marked(self.parts(message))

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

    def truncation_texts(self, message: Any) -> list[str]:
        """The texts :meth:`truncate` may cut in ``message``, each as its marker names it
        (:func:`truncated`: the handle of that text): what an archive must hold so that an
        expand of the marker finds the original. By default the text and tool-result
        parts' texts; a dialect whose truncate cuts the items of a part one by one (a tool
        result of several text blocks) names those items."""
        return [p.text for p in self.parts(message) if p.kind in ("text", "tool_result")]

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

    def order_problems(self, messages: Sequence[Any]) -> list[ValidationError]:
        """Every role-order problem of ``messages`` (default: the one :meth:`check_order`
        raises). A dialect whose order rules can fail at several places returns them all,
        so the engine can tell the problems of its input from new ones."""
        try:
            self.check_order(messages)
        except ValidationError as exc:
            return [exc]
        return []

    def check_shape(self, message: Any, index: int) -> None:
        """Raise ``ValidationError`` when ``message`` is not a message of this dialect."""
        if not isinstance(message, dict):
            raise ValidationError(
                f"{self.name}: message {index} is {type(message).__name__}, not a dict",
                index,
            )
