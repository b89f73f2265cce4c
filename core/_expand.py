"""Expand what compaction left out: ``expand(handle)`` and ``search_dropped(query)``.

The compaction message names every part it dropped or truncated by a handle
(``expand ac-3f9ac01b22de``); these functions return the original text from the archive
**verbatim**, in pages of at most ``max_chars`` characters (``offset`` pages on). The
``*_text`` variants render the answer for a tool call: one header line in ``[…]`` (what
the page is, and how to get the next one), then the original text exactly as it was.

The tools built on these (LangChain, LlamaIndex, the SDK wrappers, the MCP server) are in
``agentcompact.integrations.expand_tools`` and ``agentcompact.integrations._mcp_server``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._archive import Archive, is_handle
from .errors import ArchiveError

__all__ = [
    "DEFAULT_PAGE_CHARS",
    "ExpandPage",
    "SearchHit",
    "expand",
    "expand_text",
    "search_dropped",
    "search_text",
]

DEFAULT_PAGE_CHARS = 8_000
_MAX_PAGE_CHARS = 100_000
_EXCERPT = 120  # characters either side of a search hit


@dataclass(frozen=True, slots=True)
class ExpandPage:
    """One page of an archived original: ``text`` is ``original[offset:offset+len]``."""

    handle: str
    text: str
    offset: int
    total: int

    @property
    def next_offset(self) -> int | None:
        end = self.offset + len(self.text)
        return end if end < self.total else None


@dataclass(frozen=True, slots=True)
class SearchHit:
    """An archived part containing the query: its handle, skim line and an excerpt."""

    handle: str
    skim: str
    excerpt: str
    position: int
    total: int


def _page_size(max_chars: int) -> int:
    if not isinstance(max_chars, int) or max_chars <= 0:
        raise ArchiveError(f"max_chars must be a positive int, got {max_chars!r}")
    return min(max_chars, _MAX_PAGE_CHARS)


def expand(archive: Archive, handle: str, offset: int = 0,
           max_chars: int = DEFAULT_PAGE_CHARS) -> ExpandPage:
    """The page of the original stored under ``handle`` starting at ``offset``."""
    handle = handle.strip().strip("`'\"")
    if not is_handle(handle):
        raise ArchiveError("not a handle: expected 'ac-' and 12 hex digits, as in the "
                           "compaction message")
    item = archive.get(handle)
    if item is None:
        raise ArchiveError(f"unknown handle {handle}: not in this archive")
    if not isinstance(offset, int) or not 0 <= offset <= len(item.text):
        raise ArchiveError(f"offset must be in [0, {len(item.text)}] for {handle}, "
                           f"got {offset!r}")
    size = _page_size(max_chars)
    return ExpandPage(handle, item.text[offset:offset + size], offset, len(item.text))


def search_dropped(archive: Archive, query: str, limit: int = 10) -> list[SearchHit]:
    """Archived parts whose text contains ``query`` (case-insensitive), most recent first,
    each with a verbatim excerpt around the first match."""
    if not isinstance(query, str) or not query.strip():
        raise ArchiveError("search_dropped needs a non-empty query string")
    hits = []
    needle = query.casefold()
    for item in archive.search(query, max(1, min(limit, 50))):
        at = item.text.casefold().find(needle)
        at = max(at, 0)
        lo, hi = max(0, at - _EXCERPT), min(len(item.text), at + len(query) + _EXCERPT)
        hits.append(SearchHit(item.handle, item.skim, item.text[lo:hi], at, len(item.text)))
    return hits


def expand_text(archive: Archive, handle: str, offset: int = 0,
                max_chars: int = DEFAULT_PAGE_CHARS) -> str:
    """``expand`` rendered for a tool result: a header line, then the text verbatim.

    An error (unknown handle, bad offset) is returned as its one-line message, so a tool
    call never fails the agent's step.
    """
    try:
        page = expand(archive, handle, offset, max_chars)
    except ArchiveError as exc:
        return f"[agentcompact expand: {exc}]"
    end = page.offset + len(page.text)
    more = (f"; more: expand({page.handle!r}, offset={page.next_offset})"
            if page.next_offset is not None else "")
    return (f"[agentcompact expand {page.handle}: chars {page.offset}-{end} of "
            f"{page.total}{more}]\n{page.text}")


def search_text(archive: Archive, query: str, limit: int = 10) -> str:
    """``search_dropped`` rendered for a tool result: one block per hit."""
    try:
        hits = search_dropped(archive, query, limit)
    except ArchiveError as exc:
        return f"[agentcompact search_dropped: {exc}]"
    if not hits:
        return f"[agentcompact search_dropped: nothing archived contains {query!r}]"
    blocks = [f"[agentcompact search_dropped: {len(hits)} archived parts contain {query!r}; "
              "expand(handle) returns one whole]"]
    for hit in hits:
        head = hit.skim or f"[expand {hit.handle}]"
        blocks.append(f"{head}\n[at char {hit.position} of {hit.total}]\n{hit.excerpt}")
    return "\n\n".join(blocks)
