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
]

COMPACTION_HEADER = "[agentcompact: earlier turns compacted]"
SUMMARY_HEADER = "[agentcompact: summary of earlier turns]"
_HEADERS = (COMPACTION_HEADER, SUMMARY_HEADER)


def elision(omitted_chars: int, inline: bool = False) -> str:
    """The marker placed where a truncation removed ``omitted_chars`` characters."""
    if inline:
        return f" [… {omitted_chars} chars omitted …] "
    return f"\n[… {omitted_chars} chars omitted …]\n"


def is_marked(text: str) -> bool:
    """True when ``text`` is the text of a compaction or summary message we wrote."""
    return text.startswith(_HEADERS)
