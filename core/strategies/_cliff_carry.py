"""What one cliff compaction hands the next: the items of earlier cycles and their facts.

A history arriving at once (a resumed session: thousands of turns) is compacted by
replaying every threshold crossing, and at each the cliff strategy renders the items
carried from *all* earlier cycles again: collecting, measuring, keying, rendering and
sizing each of them at every crossing made the replay quadratic in the history's length.

A :class:`Carry` keeps, for the items of ``messages[head_len:upto]`` (``upto``: the last
compaction's span start), the per-item values that compaction computed, by position: the
next compaction of the same history (the same message objects up to ``upto``, the same
kept messages and pins there) starts from them and computes what is new, and again only
for the carried items whose rendering context changed (:meth:`Carry.touched`: a call of
theirs superseded since, a result or a call of theirs among the new messages). The
values are those a compaction from scratch computes (``tests/strategies/test_cliff_carry``
compares both on randomized histories).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from .._interner import same_objects

__all__ = ["Carry", "Columns", "Groups"]

_TOOL_KINDS = ("tool_call", "tool_result")


class Groups:
    """Positions of one compaction's items by what packing and reporting ask of them:
    the pinned ones, the pins past the pin budget, the human ones, and the first item of
    each message with that message's report fields (index, role, tokens, kind)."""

    __slots__ = ("firsts", "humans", "indices", "kinds", "pinned", "roles", "tokens",
                 "unpinned")

    def __init__(self) -> None:
        self.pinned: list[int] = []
        self.unpinned: list[int] = []
        self.humans: list[int] = []
        self.firsts: list[int] = []
        self.indices: list[int] = []
        self.roles: list[str] = []
        self.tokens: list[int] = []
        self.kinds: list[str] = []

    def extended(self, items: Sequence[Any], measured: Sequence[int], start: int,
                 human_roles: frozenset[str]) -> Groups:
        """These groups (of ``items[:start]``) with ``items[start:]`` added."""
        out = Groups()
        out.pinned, out.unpinned, out.humans = list(self.pinned), list(self.unpinned), \
            list(self.humans)
        out.firsts, out.indices, out.roles = list(self.firsts), list(self.indices), \
            list(self.roles)
        out.tokens, out.kinds = list(self.tokens), list(self.kinds)
        previous = items[start - 1].index if start else None
        for p in range(start, len(items)):
            item = items[p]
            if item.pinned:
                out.pinned.append(p)
            if item.unpinned:
                out.unpinned.append(p)
            if item.role in human_roles:
                out.humans.append(p)
            if item.index != previous:
                out.firsts.append(p)
                out.indices.append(item.index)
                out.roles.append(item.role)
                out.tokens.append(measured[p])
                out.kinds.append(item.parts[0].kind if item.parts else "other")
                previous = item.index
        return out

    def prefix(self, m: int) -> Groups:
        """The groups of the first ``m`` items."""
        out = Groups()
        for name in ("pinned", "unpinned", "humans"):
            values = getattr(self, name)
            setattr(out, name, values[:bisect.bisect_left(values, m)])
        k = bisect.bisect_left(self.firsts, m)
        out.firsts, out.indices, out.roles = self.firsts[:k], self.indices[:k], \
            self.roles[:k]
        out.tokens, out.kinds = self.tokens[:k], self.kinds[:k]
        return out


class Columns:
    """Per-item values of one compaction's ``n`` items by name: the values of the first
    ``m`` (carried) taken from ``carried`` but at the ``touched`` positions, the rest
    computed (``one(position)``)."""

    __slots__ = ("carried", "m", "made", "n", "touched")

    def __init__(self, carried: dict[Any, list[Any]], m: int, n: int,
                 touched: Sequence[int]) -> None:
        self.carried, self.m, self.n, self.touched = carried, m, n, touched
        self.made: dict[Any, list[Any]] = {}

    def get(self, name: Any, one: Callable[[int], Any]) -> list[Any]:
        found = self.made.get(name)
        if found is None:
            previous = self.carried.get(name)
            if previous is None:
                found = list(map(one, range(self.n)))
            else:
                found = previous[:self.m]
                for p in self.touched:
                    found[p] = one(p)
                found += map(one, range(self.m, self.n))
            self.made[name] = found
        return found


class Carry:
    """The items of ``messages[head_len:upto]`` of one compaction and their values
    (module docstring). Never changed once made: a strategy shared by threads replaces
    its carry whole."""

    __slots__ = ("call_items", "columns", "dialect", "facts", "groups", "head_len",
                 "items", "measured", "messages", "offered", "rates", "refs", "report",
                 "reported", "superseded", "upto")

    def __init__(self, head_len: int, dialect: Any = None) -> None:
        self.head_len, self.upto, self.dialect = head_len, head_len, dialect
        self.messages: tuple[Any, ...] = ()  # messages[:upto]
        self.facts: Any = None  # what the items depend on besides the messages
        self.items: list[Any] = []
        self.measured: list[int] = []
        self.rates: list[float] = []
        self.columns: dict[Any, list[Any]] = {}
        self.groups = Groups()
        self.call_items: dict[str, int] = {}  # call ref -> position of its item
        self.refs: dict[str, tuple[int, ...]] = {}  # call ref -> positions naming it
        self.superseded: frozenset[str] = frozenset()  # as the columns were computed
        #: the report entries of the items' messages (when all of them were packed), and
        #: where it has entries other than ``dropped``
        self.report: list[Any] = []
        self.reported: list[int] = []
        #: ``(archive, positions)``: that archive was offered the originals of every
        #: item but those at ``positions`` (shown then), or ``None``
        self.offered: tuple[Any, list[int]] | None = None

    def fits(self, messages: Sequence[Any], dialect: Any, head_len: int, span_start: int,
             facts: Callable[[int], Any]) -> bool:
        """Whether this carry's items are those of a compaction of ``messages`` (its first
        ``upto`` the same objects, ``facts(upto)`` the same)."""
        upto = self.upto
        return (self.dialect is dialect and self.head_len == head_len
                and upto <= span_start and len(messages) >= upto
                and same_objects(self.messages, messages) == upto
                and facts(upto) == self.facts)

    def touched(self, messages: Sequence[Any], parts_of: Callable[[Any], Sequence[Any]],
                superseded: frozenset[str]) -> list[int]:
        """Positions of the carried items whose rendering context may differ in a
        compaction of ``messages``: those naming a call ref that a message from ``upto``
        on names too (a result, a call or a repeated id: ``messages[:upto]`` are this
        carry's, the calls and results of the rest may have changed) or whose call was
        superseded or restored since."""
        refs: set[str] = set()
        for i in range(self.upto, len(messages)):
            refs.update(p.ref for p in parts_of(messages[i]) if p.kind in _TOOL_KINDS)
        refs.update(superseded.symmetric_difference(self.superseded))
        found = self.refs
        return sorted({p for ref in refs for p in found.get(ref, ())})

    def then(self, messages: Sequence[Any], upto: int, facts: Any, items: list[Any],
             m: int, measured: list[int], rates: list[float], columns: Columns,
             groups: Groups, call_items: dict[str, int], superseded: frozenset[str],
             report: list[Any], reported: list[int] | None) -> Carry:
        """The carry of a compaction of ``messages`` with span start ``upto`` whose first
        ``m`` items are those of ``messages[head_len:upto]``, extended from this one."""
        out = Carry(self.head_len, self.dialect)
        out.upto, out.messages, out.facts = upto, tuple(messages[:upto]), facts
        out.items, out.measured, out.rates = items[:m], measured[:m], rates[:m]
        out.columns = {name: values[:m] for name, values in columns.made.items()}
        out.groups = groups.prefix(m)
        if reported is not None:  # a report of packed items (else none is carried)
            k = len(out.groups.firsts)
            out.report, out.reported = report[:k], [r for r in reported if r < k]
        out.call_items, out.superseded = call_items, superseded
        refs = dict(self.refs)
        for p in range(len(self.items), m):
            for part in items[p].parts:
                if part.kind in _TOOL_KINDS:
                    refs[part.ref] = (*refs.get(part.ref, ()), p)
        out.refs = refs
        return out
