"""Parsing request bodies incrementally: unchanged history is neither parsed nor re-encoded.

An agent's next request is its previous one plus a turn: the same bytes up to the end of
the last message, then a few new messages, then the rest of the body. ``BodyCache``
remembers, for recent requests, the raw bytes, the parsed body and the byte span of every
message of the message array. A new body that starts with the bytes of an earlier one up
to the end of that one's last message holds those messages unchanged (same bytes from
offset 0, so the same JSON values at the same place), and gets the very same message
objects back: the engine's per-message caches are keyed by identity, so they are neither
digested nor tokenized again. Only the new messages and the keys around the array are
parsed.

Correctness first: a reused message is one whose bytes are identical to the bytes it was
parsed from; anything unexpected (no array, a duplicated key, a scanner disagreeing with
the parser) falls back to a full ``orjson`` parse, and the spans are only used when the
structure is known exactly.

``encode`` builds the body to send from the spans: messages that go out unchanged are
copied as the client's own bytes (signed thinking and encrypted reasoning included), only
new objects (a compaction message, a truncated copy) are serialized.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["BodyCache", "Common", "Parsed", "encode", "scan_body"]

_STRUCT = re.compile(rb'["\[\]{}]')
_SCALAR = re.compile(rb"[^,\]}\s]+")
_WS = re.compile(rb"[ \t\n\r]*")
_QUOTE, _OBJ, _ARR, _OBJ_END, _ARR_END, _COMMA, _COLON, _BACKSLASH = b'"{[}],:\\'
#: stands in for the message array when the rest of a body is parsed on its own
_SENTINEL = "\x00agentcompact:messages"
_SENTINEL_JSON = orjson.dumps(_SENTINEL)


class _Malformed(ValueError):
    """The scanner met something it does not handle: use a full parse instead."""


def _ws(buf: bytes, pos: int) -> int:
    if pos < len(buf) and buf[pos] in b" \t\n\r":
        m = _WS.match(buf, pos)
        assert m is not None
        return m.end()
    return pos


def _string_end(buf: bytes, pos: int) -> int:
    """End offset of the JSON string whose opening quote is at ``pos`` (``memchr`` speed)."""
    find = buf.find
    i = pos + 1
    while True:
        j = find(b'"', i)
        if j < 0:
            raise _Malformed("unterminated string")
        k = j - 1
        while buf[k] == _BACKSLASH:
            k -= 1
        if (j - 1 - k) % 2 == 0:  # an even run of backslashes: the quote is not escaped
            return j + 1
        i = j + 1


def _skip_value(buf: bytes, pos: int) -> int:
    """End offset of the JSON value starting at ``pos`` (which must not be whitespace).

    Assumes well-formed JSON (every span found is parsed by ``orjson`` afterwards); brackets
    inside strings are skipped with the strings.
    """
    if pos >= len(buf):
        raise _Malformed("value expected")
    c = buf[pos]
    if c == _QUOTE:
        return _string_end(buf, pos)
    if c == _OBJ or c == _ARR:
        depth = 0
        search = _STRUCT.search
        while True:
            m = search(buf, pos)
            if m is None:
                raise _Malformed("unbalanced brackets")
            pos = m.start()
            t = buf[pos]
            if t == _QUOTE:
                pos = _string_end(buf, pos)
                continue
            pos += 1
            if t == _OBJ or t == _ARR:
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    return pos
    m = _SCALAR.match(buf, pos)
    if m is None:
        raise _Malformed("value expected")
    return m.end()


def _scan_elements(buf: bytes, pos: int, starts: list[int], ends: list[int],
                   first: bool, values: Sequence[Any] = ()) -> int:
    """Scan array elements from ``pos`` (just after ``[`` when ``first``, else just after
    the last known element); append their spans; return the offset of the closing ``]``.

    ``values``, when given, are the parsed elements: one whose compact serialization is
    what the buffer holds at its place (the common case: clients send compact JSON) is
    skipped with a ``memcmp`` instead of a scan. Only containers and strings qualify, whose
    end is fixed by their closing character.
    """
    dumps = orjson.dumps
    pos = _ws(buf, pos)
    if pos >= len(buf):
        raise _Malformed("array not closed")
    if buf[pos] == _ARR_END:
        return pos
    if not first:
        if buf[pos] != _COMMA:
            raise _Malformed("',' expected")
        pos = _ws(buf, pos + 1)
    while True:
        k = len(starts)
        end = -1
        if k < len(values) and isinstance(values[k], (dict, list, str)):
            try:
                encoded = dumps(values[k])
            except TypeError:
                encoded = b""
            if encoded and buf.startswith(encoded, pos):
                end = pos + len(encoded)
        if end < 0:
            end = _skip_value(buf, pos)
        starts.append(pos)
        ends.append(end)
        pos = _ws(buf, end)
        if pos >= len(buf):
            raise _Malformed("array not closed")
        c = buf[pos]
        if c == _ARR_END:
            return pos
        if c != _COMMA:
            raise _Malformed("',' or ']' expected")
        pos = _ws(buf, pos + 1)


def scan_body(buf: bytes, key: str, values: Sequence[Any] = ()
              ) -> tuple[int, int, list[int], list[int]] | None:
    """Where the array under top-level ``key`` lies in the JSON object ``buf``.

    ``values``: the parsed array, if known (speeds up the scan; see ``_scan_elements``).

    Returns (offset of ``[``, offset of ``]``, element starts, element ends), or ``None``
    when the body is not an object, has no array under ``key`` or names ``key`` twice.
    """
    found: tuple[int, int, list[int], list[int]] | None = None
    try:
        pos = _ws(buf, 0)
        if pos >= len(buf) or buf[pos] != _OBJ:
            return None
        pos = _ws(buf, pos + 1)
        if pos < len(buf) and buf[pos] == _OBJ_END:
            return None
        while True:
            if pos >= len(buf) or buf[pos] != _QUOTE:
                return None
            end = _string_end(buf, pos)
            name = orjson.loads(buf[pos:end])
            pos = _ws(buf, end)
            if pos >= len(buf) or buf[pos] != _COLON:
                return None
            pos = _ws(buf, pos + 1)
            if name == key:
                if found is not None or pos >= len(buf) or buf[pos] != _ARR:
                    return None
                starts: list[int] = []
                ends: list[int] = []
                close = _scan_elements(buf, pos + 1, starts, ends, first=True, values=values)
                found = (pos, close, starts, ends)
                pos = close + 1
            else:
                pos = _skip_value(buf, pos)
            pos = _ws(buf, pos)
            if pos >= len(buf):
                return None
            if buf[pos] == _OBJ_END:
                break
            if buf[pos] != _COMMA:
                return None
            pos = _ws(buf, pos + 1)
    except (_Malformed, orjson.JSONDecodeError):
        return None
    return found


def array_start(buf: bytes, key: str) -> int:
    """Offset of the ``[`` opening the array under the first top-level ``key`` of the JSON
    object ``buf`` (only the keys before it are scanned), or -1. A later duplicate of
    ``key`` is not looked for here: the caller's parse of the rest catches it."""
    try:
        pos = _ws(buf, 0)
        if pos >= len(buf) or buf[pos] != _OBJ:
            return -1
        pos = _ws(buf, pos + 1)
        while pos < len(buf) and buf[pos] == _QUOTE:
            end = _string_end(buf, pos)
            name = orjson.loads(buf[pos:end])
            pos = _ws(buf, end)
            if pos >= len(buf) or buf[pos] != _COLON:
                return -1
            pos = _ws(buf, pos + 1)
            if name == key:
                return pos if pos < len(buf) and buf[pos] == _ARR else -1
            pos = _ws(buf, _skip_value(buf, pos))
            if pos >= len(buf) or buf[pos] != _COMMA:
                return -1
            pos = _ws(buf, pos + 1)
    except (_Malformed, orjson.JSONDecodeError):
        return -1
    return -1


@dataclass(eq=False)  # identity: a key of the proxy's weak map of bodies sent unchanged
class Parsed:
    """A parsed request body and, when known, where its messages lie in ``raw``.

    ``messages`` is the list under ``key`` (the same list object as ``body[key]``);
    ``reused`` counts the leading messages taken over from an earlier request (same
    objects); ``spans`` is ``None`` when the byte layout is unknown.
    """

    raw: bytes
    key: str
    body: Any
    messages: list[Any] | None
    reused: int = 0
    array: int = -1
    close: int = -1
    starts: list[int] | None = None
    ends: list[int] | None = None

    @property
    def spans(self) -> bool:
        return self.starts is not None

    def prefix_end(self, shared: int | None = None) -> int:
        """Bytes a later body must share for the first ``shared`` messages here (default:
        all of them) to be reused."""
        assert self.ends is not None
        n = len(self.ends) if shared is None else shared
        return self.ends[n - 1] if n else self.array + 1


#: an earlier body, where the array it extends starts in the new one, and how many of
#: its leading messages the new body holds byte for byte
_Match = tuple[Parsed, int, int]


class BodyCache:
    """Recent request bodies with their parsed messages, for incremental parsing.

    Bounded by entry count and by the bytes of the remembered bodies (LRU). Thread-safe;
    the entries themselves are never mutated after being stored.
    """

    def __init__(self, max_entries: int = 256, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, Parsed] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        #: hits sharing only some of the earlier body's messages (Claude Code moves its
        #: ``cache_control`` marker to the newest block: the previous newest changes)
        self.partial_hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, raw: bytes, key: str, known: Common | None = None
               ) -> tuple[_Match | None, int]:
        """The earlier body whose messages ``raw`` starts its array with (or ``None``), and
        how many bytes of ``raw`` a parse would still read (the cost of ``parse``).
        ``known``: what a :class:`Common` fed ``raw`` as it arrived found it shares with
        an earlier body (the comparisons with that body are then arithmetic)."""
        match = self._candidate(raw, key, known)
        if match is None:
            return None, len(raw)
        prev, array, shared = match
        return match, len(raw) - (array + prev.prefix_end(shared) - prev.array)

    def parse(self, raw: bytes, key: str, match: _Match | None | bool = True) -> Parsed:
        """``raw`` parsed (as ``orjson.loads`` would), reusing an earlier request's message
        objects for the messages it shares byte for byte. Raises what ``orjson`` raises for
        a body that does not parse. ``match``: the result of ``lookup``, if already known."""
        found = self._candidate(raw, key) if match is True or match is False else match
        prev = found[0] if found is not None else None
        parsed = _extend(*found, raw) if found is not None else None
        if parsed is None:
            parsed = _full(raw, key)
            self.misses += 1
        else:
            self.hits += 1
            self.partial_hits += found is not None and found[2] < len(found[0].ends or ())
        if parsed.spans and parsed.messages is not None:
            # the session moved on: its earlier body is superseded (one entry per session);
            # a body sharing only a few leading messages (another session opening the same
            # way) supersedes nothing
            supersedes = prev is not None and parsed.reused * 2 > len(prev.ends or ())
            self._remember(parsed, replaces=prev if supersedes else None)
        return parsed

    # --- incremental path -----------------------------------------------------------
    def common(self, key: str) -> Common:
        """A :class:`Common` to feed a body of messages under ``key`` to as it arrives."""
        with self._lock:
            recent = list(reversed(self._entries.values()))[:_COMMON_CANDIDATES]
        return Common([e for e in recent if e.key == key and e.ends is not None])

    def _candidate(self, raw: bytes, key: str, known: Common | None = None) -> _Match | None:
        """The most recent entry whose message bytes open ``raw``'s message array; else
        the entry sharing the most leading messages byte for byte (at least one). The keys
        before the array may differ (``stream``, ``max_tokens``, metadata…): the array's
        content does not depend on them."""
        with self._lock:
            entries = list(reversed(self._entries.values()))
        if not entries:
            return None
        array = array_start(raw, key)
        if array < 0:
            return None
        best: _Match | None = None
        for entry in entries:
            if entry.key != key or entry.ends is None:
                continue
            same = known.bytes_shared(entry, raw) if known is not None else None
            if (_newest_unmoved(entry, raw, array, same)
                    and _shares(entry, raw, array, len(entry.ends), same)):
                return entry, array, len(entry.ends)
            if best is None or best[2] < len(entry.ends):
                shared = _shared_messages(entry, raw, array, 0 if best is None else best[2],
                                          same)
                if shared and (best is None or shared > best[2]):
                    best = (entry, array, shared)
        return best

    def _remember(self, parsed: Parsed, replaces: Parsed | None) -> None:
        with self._lock:
            if replaces is not None and self._entries.pop(id(replaces.raw), None) is not None:
                self._bytes -= len(replaces.raw)
            old = self._entries.pop(id(parsed.raw), None)
            if old is not None:
                self._bytes -= len(old.raw)
            self._entries[id(parsed.raw)] = parsed
            self._bytes += len(parsed.raw)
            while self._entries and (len(self._entries) > self.max_entries
                                     or self._bytes > self.max_bytes):
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= len(dropped.raw)


#: the most recent bodies a :class:`Common` may compare an arriving body with, and the
#: bytes it must open with to be compared with (the first chunk's, at most)
_COMMON_CANDIDATES = 8
_COMMON_OPENING = 1024


class Common:
    """How many leading bytes a body shares with one earlier body, found as the body
    arrives (:meth:`feed` each chunk): the ``memcmp`` of a session's 12 MB history is done
    while the client still sends it, not after its last byte. The earlier body is the most
    recent candidate that opens with the first chunk's first KiB; the count is exact (the
    offset of the first differing byte, or the length of the shorter body), so what
    ``BodyCache.lookup`` concludes from it is what comparing the bytes would conclude."""

    __slots__ = ("_candidates", "_fed", "_prev", "_same", "_diverged")

    def __init__(self, candidates: list[Parsed]) -> None:
        self._candidates: list[Parsed] | None = candidates
        self._prev: Parsed | None = None
        self._fed = self._same = 0
        self._diverged = False

    def feed(self, chunk: bytes) -> None:
        """The body's next bytes."""
        if self._candidates is not None:  # the first chunk picks the body to compare with
            opening = chunk[:_COMMON_OPENING]
            self._prev = next((c for c in self._candidates
                               if c.raw.startswith(opening[:len(c.raw)])), None)
            self._candidates = None
        at, self._fed = self._fed, self._fed + len(chunk)
        prev = self._prev
        if prev is None or self._diverged:
            return
        old = prev.raw
        if old.startswith(chunk, at):
            self._same = self._fed
            return
        self._diverged = True
        # the first ``lo`` bytes of the chunk are shared, the first ``hi`` are not (or the
        # earlier body ends within them)
        view, lo, hi = memoryview(chunk), 0, min(len(chunk), len(old) - at)
        if hi > 0 and old.startswith(view[:hi], at):  # the earlier body ends in this chunk
            lo = hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if old.startswith(view[:mid], at):
                lo = mid
            else:
                hi = mid
        self._same = at + lo

    def bytes_shared(self, prev: Parsed, raw: bytes) -> int | None:
        """How many leading bytes ``raw`` (the body fed, whole) shares with ``prev``;
        ``None`` when this did not compare them (compare the bytes instead)."""
        if prev is not self._prev or self._fed != len(raw):
            return None
        return self._same


def _shares(prev: Parsed, raw: bytes, array: int, n: int, same: int | None = None) -> bool:
    """True when the array at ``array`` in ``raw`` opens with the bytes of ``prev``'s first
    ``n`` messages (separators included). ``same``: ``raw`` and ``prev.raw`` are known to
    share exactly that many leading bytes."""
    end = prev.prefix_end(n)
    if array + end - prev.array > len(raw):
        return False
    if same is not None and array == prev.array:
        return end <= same
    return raw.startswith(memoryview(prev.raw)[prev.array:end], array)


def _newest_unmoved(prev: Parsed, raw: bytes, array: int, same: int | None = None) -> bool:
    """True when ``prev``'s newest message stands unchanged where it stood (a cheap test
    before comparing the whole prefix: Claude Code changes exactly that message)."""
    if not prev.ends or prev.starts is None:
        return True
    start, end = prev.starts[-1], prev.ends[-1]
    at = array + start - prev.array
    if same is not None and array == prev.array and end <= same:
        return True
    return raw.startswith(memoryview(prev.raw)[start:end], at)


def _shared_messages(prev: Parsed, raw: bytes, array: int, floor: int = 0,
                     same: int | None = None) -> int:
    """How many leading messages of ``prev`` open ``raw``'s array byte for byte, knowing
    that not all do; 0 when that is ``floor`` or fewer. Galloping back from the newest,
    then a binary search: a few ``memcmp`` calls, each stopping at the first differing
    byte (the usual case, one changed message at the end, costs one)."""
    assert prev.ends is not None
    lo, hi = floor, len(prev.ends)  # hi: known not shared; lo: the answer is above it
    step, k = 1, hi - 1
    while k > lo:
        if _shares(prev, raw, array, k, same):
            lo = k
            break
        hi, k, step = k, k - step, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _shares(prev, raw, array, mid, same):
            lo = mid
        else:
            hi = mid
    return lo if lo > floor else 0


def _extend(prev: Parsed, array: int, shared: int, raw: bytes) -> Parsed | None:
    """``raw`` parsed reusing ``prev``'s first ``shared`` messages (the array at ``array``
    in ``raw`` starts with all of their bytes); ``None`` when anything is off (the caller
    parses in full)."""
    key = prev.key
    if prev.messages is None or prev.starts is None or prev.ends is None:
        return None
    shift = array - prev.array
    n = shared
    if shift:
        starts = [i + shift for i in prev.starts[:n]]
        ends = [i + shift for i in prev.ends[:n]]
    else:
        starts, ends = prev.starts[:n], prev.ends[:n]
    try:
        close = _scan_elements(raw, prev.prefix_end(n) + shift, starts, ends, first=n == 0)
        new: list[Any] = []
        if len(starts) > n:
            new = orjson.loads(b"[" + raw[starts[n]:close + 1])
            if not isinstance(new, list) or len(new) != len(starts) - n:
                return None
        rest = raw[close + 1:]
        if (rest == prev.raw[prev.close + 1:]
                and raw.startswith(memoryview(prev.raw)[:prev.array]) and not shift):
            body = dict(prev.body)
        else:
            # the keys around the array, parsed on their own; a duplicate of ``key`` among
            # them would replace the sentinel, and then nothing is reused
            body = orjson.loads(raw[:array] + _SENTINEL_JSON + rest)
            if not isinstance(body, dict) or body.get(key) != _SENTINEL:
                return None
    except (_Malformed, orjson.JSONDecodeError):
        return None
    messages = prev.messages[:n] + new
    body[key] = messages
    return Parsed(raw, key, body, messages, n, array, close, starts, ends)


def _full(raw: bytes, key: str) -> Parsed:
    body = orjson.loads(raw)
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, list):
        return Parsed(raw, key, body, None)
    layout = scan_body(raw, key, value)
    if layout is None or len(layout[2]) != len(value):
        return Parsed(raw, key, body, value)
    array, close, starts, ends = layout
    return Parsed(raw, key, body, value, 0, array, close, starts, ends)


def encode(parsed: Parsed, messages: Sequence[Any]) -> bytes:
    """The body of ``parsed`` with its message array replaced by ``messages``.

    Messages that are objects of ``parsed.messages`` are copied as their original bytes
    (runs of consecutive ones as one slice, separators included); others are serialized.
    Without spans the whole body is serialized (``orjson``).
    """
    if not parsed.spans or parsed.messages is None:
        body = dict(parsed.body)
        body[parsed.key] = list(messages)
        return orjson.dumps(body)
    assert parsed.starts is not None and parsed.ends is not None
    raw, source = parsed.raw, parsed.messages
    starts, ends = parsed.starts, parsed.ends
    index: dict[int, int] | None = None
    pieces: list[bytes] = []
    first = last = -1  # the pending run of consecutive original messages
    for message in messages:
        i = last + 1
        if not (i < len(source) and source[i] is message):
            if index is None:
                index = {id(m): k for k, m in enumerate(source)}
            i = index.get(id(message), -1)
        if first >= 0 and i == last + 1:
            last = i
            continue
        if first >= 0:
            pieces.append(raw[starts[first]:ends[last]])
            first = -1
        if i >= 0:
            first = last = i
        else:
            pieces.append(orjson.dumps(message))
    if first >= 0:
        pieces.append(raw[starts[first]:ends[last]])
    return b"".join((raw[:parsed.array + 1], b",".join(pieces), raw[parsed.close:]))
