"""Needed-context recall: did the context sent still hold what the model went on to use?

A *salient item* is a short string an agent re-uses verbatim: a file path, an identifier, a
shell command, a number, an error line. For each model call, the items of the model's
**next** output (its text, thinking and tool-call arguments) that already appeared earlier
in the history are *needed*; recall is the share of needed items still present somewhere
in what a strategy sent (verbatim messages, compaction or summary messages, truncated
copies). The full history has recall 1 by construction.

How items are found (:data:`SALIENT_PATTERNS`):

* the text is cut into *words*: maximal runs of letters, digits and ``_ . / ~ @ + -``
  (so ``src/app/db.py:12`` gives the word ``src/app/db.py``); trailing dots are dropped;
* a word is an item when it is one of these shapes (first that fits):

  =============  ==================================================================
  kind           word shape
  =============  ==================================================================
  ``path``       has a ``/`` between name characters (``src/app/db.py``, ``/etc/hosts``,
                 ``~/.claude/x``), or is a file name with a known extension
                 (``setup.cfg``, ``test_orders.py``)
  ``number``     an integer of ≥ 3 digits, or a decimal (``3.14``, ``0.25``)
  ``identifier`` ``snake_case`` (has ``_``), ``CamelCase``, ``camelCase``, or a dotted
                 name (``os.path.join``); at least 4 characters
  =============  ==================================================================

* line items, matched as whole strings:

  =============  ==================================================================
  ``command``    the value of a ``"command"``/``"cmd"`` key in tool-call JSON (first
                 line, whitespace collapsed, ≤ 200 chars), or a line starting ``$ ``
  ``error``      a line naming an error (``…Error``, ``…Exception``, ``Traceback``,
                 ``FAILED``, ``error:``, ``fatal:``, ``panic:``), whitespace
                 collapsed, 12–200 chars
  =============  ==================================================================

Items are computed on message *text*, so an item survives a compaction exactly when its
string is still in the text sent (a truncation that cut through it loses it). Word shapes
are classified once per distinct word, so the cost is one pass per message. A message's
items are in the order they first appear (line items first, then words), so reports list
them the same way on every run.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "SALIENT_PATTERNS",
    "ItemIndex",
    "RecallCount",
    "extract_items",
]

_EXT = (
    "py|pyi|ipynb|js|mjs|cjs|ts|tsx|jsx|rs|go|java|kt|c|h|cc|cpp|hpp|cs|rb|php|swift|scala|"
    "sh|bash|zsh|md|rst|txt|json|jsonl|toml|yaml|yml|ini|cfg|conf|lock|html|css|scss|sql|"
    "xml|csv|log|proto|gradle|env|mk|ex|exs|lua|vue|svelte"
)

_WORD = re.compile(r"[A-Za-z0-9_./~@+-]+")  # explicit ASCII class: re scans it fastest
#: kind -> pattern. Word kinds are anchored (one word per line); line kinds search text.
SALIENT_PATTERNS: dict[str, re.Pattern[str]] = {
    "word": re.compile(
        r"^(?:(?P<path>(?:[.~]{0,2}/)?(?:[\w@.+-]+/)+[\w@+-](?:[\w@.+-]*[\w@+-])?"
        rf"|[\w-][\w.-]*\.(?:{_EXT}))"
        r"|(?P<number>\d{3,}(?:\.\d+)?|\d+\.\d+)"
        r"|(?P<identifier>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+|[A-Za-z]\w*_\w+|_\w{3,}"
        r"|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+))\.*$",
        re.MULTILINE,
    ),
    "command": re.compile(r"\"(?:command|cmd)\"\s*:\s*\"([^\"\\]*(?:\\.[^\"\\]*)*)\""),
    "shell": re.compile(r"^\$ ([^\n]{2,200})$", re.MULTILINE),
    # no leading \b: a pattern starting with plain literals lets re skip ahead fast
    "error": re.compile(r"Error\b|Exception\b|Traceback\b|FAILED\b|error:|fatal:|panic:"),
}
_ERROR_HINTS = ("Error", "Exception", "Traceback", "FAILED", "error:", "fatal:", "panic:")
_BOUNDED = frozenset({"Error", "Exception", "Traceback", "FAILED"})  # followed by \b
_WS = re.compile(r"\s+")
_ESCAPES = {"\\n": "\n", "\\t": " ", '\\"': '"', "\\\\": "\\"}
_ESC = re.compile(r"\\[nt\"\\]")

# Words are cut from the UTF-8 bytes: every byte outside _WORD's (ASCII) class becomes a
# space and bytes.split() returns the runs, the same words as _WORD.findall, several times
# faster. Words are ASCII, so the word pattern compiled for bytes classifies them alike.
_WORD_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./~@+-"
_SPLIT = bytes(c if c in _WORD_BYTES else 0x20 for c in range(256))
_WORD_SHAPES = re.compile(SALIENT_PATTERNS["word"].pattern.encode(), re.MULTILINE)

Classified = tuple[str, str] | None
_words: dict[bytes, Classified] = {}  # word -> (item, kind) or None; shared, bounded
_WORDS_MAX = 1_000_000


def _words_of(text: str) -> dict[bytes, None]:
    """The distinct words of ``text`` (runs of ``_WORD``'s class), in order of appearance."""
    return dict.fromkeys(text.encode("utf-8", "surrogatepass").translate(_SPLIT).split())


def _classify(words: Collection[bytes]) -> None:
    """Classify the words not seen before (one regex pass over them joined by newlines)."""
    unknown = [w for w in words if w not in _words]
    if not unknown:
        return
    if len(_words) + len(unknown) > _WORDS_MAX:
        _words.clear()
        unknown = list(words)
    _words.update(dict.fromkeys(unknown))
    for m in _WORD_SHAPES.finditer(b"\n".join(unknown)):
        kind = m.lastgroup or ""
        item = m.group(kind)
        if kind != "identifier" or len(item) >= 4:
            _words[m.group(0)] = (item.decode("ascii"), kind)


def _add_word_items(items: dict[str, str], words: Iterable[bytes],
                    salient: Mapping[bytes, tuple[str, str]]) -> None:
    for item, kind in map(salient.__getitem__, filter(salient.__contains__, words)):
        items.setdefault(item, kind)


def _command(raw: str) -> str:
    text = _ESC.sub(lambda m: _ESCAPES[m.group(0)], raw)
    first = text.strip().split("\n", 1)[0]
    return _WS.sub(" ", first).strip()[:200]


def _error_starts(text: str) -> list[int]:
    """Where ``SALIENT_PATTERNS["error"]`` could match, ascending (each hint found with
    ``str.find``; ``\b`` checked by hand, as ``re`` defines it for ``str`` patterns)."""
    starts: list[int] = []
    for hint in _ERROR_HINTS:
        find = text.find
        at = find(hint)
        while at >= 0:
            end = at + len(hint)
            if hint not in _BOUNDED or end == len(text) or not (
                    text[end].isalnum() or text[end] == "_"):
                starts.append(at)
            at = find(hint, end)
    starts.sort()
    return starts


def _line_items(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if '"command"' in text or '"cmd"' in text:
        for m in SALIENT_PATTERNS["command"].finditer(text):
            value = _command(m.group(1))
            if value:
                out.setdefault(value, "command")
    if text.startswith("$ ") or "\n$ " in text:
        for m in SALIENT_PATTERNS["shell"].finditer(text):
            out.setdefault(_WS.sub(" ", m.group(1)).strip(), "command")
    line_end = -1
    for at in _error_starts(text):
        if at < line_end:
            continue  # this line is already taken
        start = text.rfind("\n", 0, at) + 1
        line_end = text.find("\n", at)
        if line_end < 0:
            line_end = len(text)
        value = _WS.sub(" ", text[start:line_end].lstrip(" \t>|")).strip()
        if 12 <= len(value) <= 200:
            out.setdefault(value, "error")
    return out


def extract_items(text: str) -> dict[str, str]:
    """The salient items of ``text``: item string -> kind."""
    if not text:
        return {}
    items = _line_items(text)
    words = _words_of(text)
    _classify(words)
    for w in words:
        hit = _words[w]
        if hit is not None:
            items.setdefault(*hit)
    return items


@dataclass
class RecallCount:
    """Needed items and how many were present, in total and per kind."""

    needed: int = 0
    present: int = 0
    by_kind: dict[str, list[int]] | None = None  # kind -> [needed, present]

    def add(self, kind: str, present: bool) -> None:
        self.needed += 1
        self.present += present
        if self.by_kind is None:
            self.by_kind = {}
        slot = self.by_kind.setdefault(kind, [0, 0])
        slot[0] += 1
        slot[1] += present

    def merge(self, other: RecallCount) -> None:
        self.needed += other.needed
        self.present += other.present
        for kind, (n, p) in (other.by_kind or {}).items():
            if self.by_kind is None:
                self.by_kind = {}
            slot = self.by_kind.setdefault(kind, [0, 0])
            slot[0] += n
            slot[1] += p

    @property
    def recall(self) -> float | None:
        return self.present / self.needed if self.needed else None


class ItemIndex:
    """Salient items of one trajectory's messages, indexed for presence checks.

    ``items[i]`` are the items of original message ``i`` (text ``texts[i]``);
    ``postings[item]`` lists the original indices holding it, ascending. Items of messages
    a strategy wrote (compaction messages, truncated copies) are extracted on demand and
    cached by text. ``always`` is text sent with every call (a system prompt).
    """

    def __init__(self, texts: Sequence[str], always: str = "") -> None:
        word_lists = [_words_of(t) for t in texts]
        vocabulary = set().union(*word_lists)
        _classify(vocabulary)
        salient = {w: hit for w in vocabulary if (hit := _words[w]) is not None}
        self.items: list[dict[str, str]] = []
        postings: defaultdict[str, list[int]] = defaultdict(list)
        for i, (text, words) in enumerate(zip(texts, word_lists)):
            items = _line_items(text) if text else {}
            _add_word_items(items, words, salient)
            self.items.append(items)
            for item in items:
                postings[item].append(i)
        self.postings: dict[str, list[int]] = dict(postings)
        self.always: frozenset[str] = frozenset(extract_items(always))
        self._written: dict[str, frozenset[str]] = {}

    def written_items(self, text: str) -> frozenset[str]:
        """Items of a text a strategy wrote (cached)."""
        found = self._written.get(text)
        if found is None:
            found = self._written[text] = frozenset(extract_items(text))
        return found

    def needed(self, output_items: dict[str, str], before: int) -> dict[str, str]:
        """Items of the next output that appeared in the first ``before`` messages."""
        out: dict[str, str] = {}
        for item, kind in output_items.items():
            posting = self.postings.get(item)
            if (posting and posting[0] < before) or item in self.always:
                out[item] = kind
        return out

    def present(self, item: str, kept: Collection[int],
                written: Iterable[frozenset[str]]) -> bool:
        """True when ``item`` is in a kept original message, a written one, or the system."""
        if item in self.always:
            return True
        for index in self.postings.get(item, ()):
            if index in kept:
                return True
        return any(item in w for w in written)
