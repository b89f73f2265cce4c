"""The stable marker strings agentcompact writes, and how to recognize them.

A compaction message always starts with ``COMPACTION_HEADER``; it is how the engine
recognizes its own output when it comes back as input (never compact a compaction).
Changing a byte of it breaks recognition of messages written by earlier versions.
"""

from __future__ import annotations

__all__ = [
    "COMPACTION_HEADER",
    "SUMMARY_HEADER",
    "elision",
    "is_marked",
    "lines_elision",
]

COMPACTION_HEADER = "[agentcompact: earlier turns compacted]"
SUMMARY_HEADER = "[agentcompact: summary of earlier turns]"
_HEADERS = (COMPACTION_HEADER, SUMMARY_HEADER)


def elision(omitted_chars: int, inline: bool = False, handle: str = "") -> str:
    """The marker placed where a truncation removed ``omitted_chars`` characters (with the
    archive handle of the whole original, when it has one)."""
    tail = f" · expand {handle}" if handle else ""
    if inline:
        return f" [… {omitted_chars} chars omitted{tail} …] "
    return f"\n[… {omitted_chars} chars omitted{tail} …]\n"


def lines_elision(lines: int, chars: int, handle: str = "") -> str:
    """The marker placed, on a line of its own, where whole lines were elided."""
    tail = f" · expand {handle}" if handle else ""
    noun = "line" if lines == 1 else "lines"
    return f"[… {lines} {noun} elided, {chars} chars omitted{tail} …]\n"


def is_marked(text: str) -> bool:
    """True when ``text`` is the text of a compaction or summary message we wrote."""
    return text.startswith(_HEADERS)
