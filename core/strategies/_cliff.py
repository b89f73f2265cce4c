"""The cliff strategy: verbatim-only compaction, with skim lines and an archive.

Head verbatim + one compaction message rendering the span by content class + recent turns
verbatim (the engine keeps head and turns). The compaction message only quotes and cuts:
human text verbatim; tool calls as one-line signatures ``[tool call NAME] ARGS``; assistant
text kept (capped late); tool results kept when short, otherwise truncated to their head,
tail and error lines (``truncation_pieces``), or replaced by a **skim line**. Everything
that is not a marker (text in ``[…]`` that agentcompact writes) is a substring of an
original message.

A skim line stands for a part left out: ``[turn 12 · result of Bash {"command": "pyt…"} ·
57 lines, 4575 chars · expand ac-3f9ac01b22de]``. The handle is derived from the part's
content (``agentcompact._archive.handle_of``), so the same part has the same skim line at
every cliff and after a restart, and the part's original text goes into the strategy's
archive (``archive`` setting), where ``agentcompact._expand`` finds it verbatim.

Levels keep commands and decisions longest: level by level bulk tool output goes first
(superseded output, a file read again later or a command re-run), then long results become
skim lines (their handle on the call's line), and only at the last level are call arguments
and assistant text capped hard. Packed newest first (``newest_share``, the default): when
the span does not fit whole, the newest items keep level 1's rendering while what that
costs beyond the last level's stays within ``newest_share`` of the message's budget; pins
come first, then human text (newest first, within ``human_share`` of the budget), then
every other item newest first at its level-1 or last-level rendering, its skim line, or
left out: the oldest go first, so what the agent touched last (its latest calls, paths,
numbers, error lines, decisions) outlives bulk output at every session length. With
``newest_share=None`` the older rule: over budget from level 1 on the oldest items take the
last level's rendering first, and the whole rendering escalates when that does not
suffice. Pinned text is never dropped; pins past the engine's pin budget keep their skim
line while the budget allows. The engine gives the message at least
``human_floor_tokens`` of room (``min_budget_tokens``), truncating the largest kept tool
output rather than dropping carried human text.

Human messages of *all* earlier cycles are carried forward (``carry_forward_human``), and
the tool calls, assistant text and handles of earlier cycles too (``carry_forward_calls``),
rendered at the last-but-one level or leaner: they are original content, so this is not a
compaction of a compaction.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from typing import Any

import xxhash

from .._archive import (
    Archive,
    ArchivedItem,
    MemoryArchive,
    current_handle_key,
    handle_of,
    handles_keyed,
    open_archive,
)
from .._events import DroppedItem
from .._markers import COMPACTION_HEADER
from .._pins import split_injected
from .._tokens import MESSAGE_OVERHEAD, MessageMeter, TiktokenCounter
from ..dialects._base import (
    LineIndex,
    Part,
    line_index,
    truncation_pieces,
)
from ..errors import PluginError
from ._base import TRUNCATABLE_TOKENS, CompactionRequest, Rendered
from ._cliff_carry import Carry, Columns, Groups

__all__ = ["DEFAULT_LEVELS", "CliffLevel", "CliffStrategy", "Seg", "render_segments"]

Seg = tuple[bool, str]
"""A piece of rendered text: (verbatim?, text). Verbatim pieces are quoted originals."""

_HUMAN_ROLES = frozenset({"user", "system", "developer"})
_LABELS = {"user": "[user]", "assistant": "[assistant]", "tool": "[tool result]",
           "system": "[system]", "developer": "[developer]"}
_EXCERPT = 80  # characters of a call's arguments in a skim line
_KEY_ARGS = ("file_path", "path", "notebook_path", "command", "cmd", "url", "pattern")
_TAIL_MIN_CHARS = 200  # ... down to about this many characters a part


@dataclass(frozen=True)
class CliffLevel:
    """Caps (characters; 0 drops the class) at one escalation level.

    ``result_max`` 0 turns a result longer than ``result_keep`` into a skim line;
    ``keep_superseded`` False does so for a result a later identical call superseded.
    """

    human_max: int = 20_000
    assistant_max: int = 4_000
    thinking_max: int = 600
    call_args_max: int = 400
    result_keep: int = 600
    result_max: int = 1_200
    keep_superseded: bool = True


#: Level 0 leaves out superseded output, keeps results to 300 characters whole and cuts
#: longer ones to 150 (head, tail, error lines), call arguments to 120, assistant text to
#: 1,500 and thinking to 600 (level 1 is the same: the newest items' rendering when the
#: span does not fit whole); level 2 skims long results; the last two levels are what
#: older items and items carried from earlier cycles get: results to 250 or 120 whole else
#: their handle on the call's line, assistant text to 800 or 300, thinking to 200. What a
#: compaction keeps beyond that is bulk one expand away, and the compaction message is
#: read at every later call (docs/fidelity.md).
DEFAULT_LEVELS = (
    CliffLevel(assistant_max=1_500, thinking_max=600, call_args_max=120, result_keep=300,
               result_max=150, keep_superseded=False),
    CliffLevel(assistant_max=1_500, thinking_max=600, call_args_max=120, result_keep=300,
               result_max=150, keep_superseded=False),
    CliffLevel(assistant_max=1_500, thinking_max=200, call_args_max=120, result_keep=300,
               result_max=0, keep_superseded=False),
    CliffLevel(human_max=8_000, assistant_max=800, thinking_max=200, call_args_max=120,
               result_keep=250, result_max=0, keep_superseded=False),
    CliffLevel(human_max=4_000, assistant_max=300, thinking_max=200, call_args_max=120,
               result_keep=120, result_max=0, keep_superseded=False),
)


@dataclass
class CliffStrategy:
    """Verbatim-only compaction (see module docstring).

    :param archive: where originals of what is left out go: a path (SQLite file), an
        ``Archive`` object, ``None`` (default: a new in-memory archive) or ``False``
        (no archive: skim lines still name handles, but nothing can expand them).
    :param human_floor_tokens: the room the compaction message keeps for carried human
        text, calls and decisions even when the kept turns would leave it less
        (``min_budget_tokens``; the engine caps it at 15% of what the fixed part leaves of
        the trigger): the engine keeps fewer recent turns and truncates the largest tool
        outputs of older ones, and a large newest turn stays whole with the context over
        the target (never over the trigger). Pinned text is never dropped.
    :param newest_share: packing newest first (module docstring): the share of the
        message's budget the newest items may spend on level 1's rendering beyond the last
        level's (0.35; ``None``: escalate the whole rendering level by level instead).
    :param human_share: the share of the budget human text takes first, newest first
        (0.3); older human text competes with the rest.
    """

    levels: tuple[CliffLevel, ...] = DEFAULT_LEVELS
    carry_forward_human: bool = True
    carry_forward_calls: bool = True
    human_floor_tokens: int = 6_000
    grade_by_age: bool = True
    grade_from: int = 1
    newest_share: float | None = 0.35
    human_share: float = 0.3
    archive: Any = None
    name: str = field(default="cliff", init=False)
    #: handles and truncations of part texts, kept across calls (pure functions of the
    #: text: carried items are not cut again at every compaction)
    _texts: _TextCache = field(default_factory=lambda: _TextCache(), init=False,
                               compare=False, repr=False)
    #: renderings of items by what they depend on, kept across calls (items carried from
    #: earlier cycles are rendered again at every compaction, at several levels)
    _blocks: _BlockCache = field(default_factory=lambda: _BlockCache(), init=False,
                                 compare=False, repr=False)
    #: the handles put into an in-memory archive (:meth:`_archive`)
    _stored: _Stored = field(default_factory=lambda: _Stored(None), init=False,
                             compare=False, repr=False)
    #: the handle key the caches above were filled under (:meth:`_handles_of_now`)
    _keyed: bytes | None = field(default=None, init=False, compare=False, repr=False)
    #: the last compaction's items of earlier cycles and their values (:class:`Carry`):
    #: the next compaction of the history starts from them
    _carry: Carry | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.archive = open_archive(self.archive)

    @property
    def min_budget_tokens(self) -> int:
        """The engine gives the compaction message at least this room (the floor)."""
        return self.human_floor_tokens

    def fingerprint(self) -> str:
        """The settings that change the output, for the engine's prefix-store key: the
        archive only by its tenant's handle key (a digest of it), which changes the
        handles in skim lines."""
        key = getattr(self.archive, "handle_key", None)
        keyed = "" if key is None else ":handles=" + xxhash.xxh3_64_hexdigest(key)
        return "cliff:" + repr(sorted(settings_dict(self).items())) + keyed

    def compact(self, request: CompactionRequest) -> Rendered:
        key = getattr(self.archive, "handle_key", None)
        if key is None:  # handles as the caller keys them (the engine: its tenant's)
            return self._compact(request)
        with handles_keyed(key):  # a tenant's archive: its handles
            return self._compact(request)

    def _handles_of_now(self) -> None:
        """Forget what was rendered with the handles of another key (a strategy object
        shared by engines of several tenants)."""
        key = current_handle_key()
        if key != self._keyed:
            self._texts, self._blocks = _TextCache(), _BlockCache(self.levels)
            self._keyed, self._carry = key, None

    def _compact(self, request: CompactionRequest) -> Rendered:
        self._handles_of_now()
        self._texts.hold(len(request.messages))
        if self._blocks.levels != self.levels:  # entries are by level index
            self._blocks, self._carry = _BlockCache(self.levels), None
        facts = self._facts(request)
        carry = self._carry
        if carry is None or facts is None or not carry.fits(
                request.messages, request.dialect, request.head_len, request.span_start,
                facts):
            carry = Carry(request.head_len, request.dialect)
        m = len(carry.items)
        items = list(carry.items)
        _collect(request, self.carry_forward_human, self.carry_forward_calls,
                 range(carry.upto, request.span_start), items)
        carried = len(items)  # the items of earlier cycles
        _collect(request, self.carry_forward_human, self.carry_forward_calls,
                 request.span(), items)
        history = request.history  # the engine's counts, when given
        new = items[m:]
        measured = carry.measured + (
            [history.tokens[it.index] for it in new] if history is not None else
            request.meter.measure([request.messages[it.index] for it in new]).tokens)
        self._texts.hold(len(request.messages), sum(measured))
        self._blocks.hold(len(items), sum(measured))
        call_items = _add_calls(dict(carry.call_items), items, m, carried)
        carried_calls = dict(call_items)
        context = _Context.of(request, items, self._texts, self._blocks,
                              _add_calls(call_items, items, carried, len(items)))
        touched = carry.touched(*_parts_by_index(request), context.superseded) if m else []
        cols = Columns(carry.columns, m, len(items), touched)
        context.slots[:] = cols.get("slots", lambda p: context._entry(items[p]))
        rates = carry.rates + _token_rates(new, measured[m:])
        groups = carry.groups.extended(items, measured, m, _HUMAN_ROLES)
        counter = request.meter.counter
        header_tokens = counter.count_texts([COMPACTION_HEADER])[0] + MESSAGE_OVERHEAD
        budget = request.budget_tokens - header_tokens
        top = len(self.levels) - 1
        level = min(request.level, top)
        packed = self._packing(request, context, items, rates, level, budget, cols,
                               groups) \
            if self.newest_share is not None and self.grade_by_age else None
        if packed is None:
            level, blocks, sizes, tiers = self._escalate(request, context, items, rates,
                                                          level, budget)
            skims = [_size(context, b, rate, "skim") for b, rate in zip(blocks, rates)]

            def choose(room: int) -> _Choice:
                return blocks, _fit(items, sizes, skims, room), tiers, None
        else:
            level, sizes, choose = packed
        floor = sum(sizes[p] + 8 for p in groups.pinned)  # never dropped
        budget = max(budget, floor)
        # Sizes are estimated from each original's tokens per character; the exact count
        # of the assembled message corrects the estimate (a few refits at most).
        limit = max(request.budget_tokens, floor + header_tokens)  # the engine allows pins
        blocks, forms, tiers, placed, text, tokens = self._refit(
            request, context, choose, budget, limit, packed is not None)
        originals = None
        offered = None  # what the archive was offered of the carried items
        if placed is not None and self.archive is not None:  # packed: few items shown
            lean = cols.get(("block", top), lambda p: self._block(request, context, items[p],
                                                                  top))
            skimmed = cols.get("skimmed", lambda p: lean[p].skimmed)
            since: int = 0
            again: tuple[int, ...] = ()  # what earlier crossings offered: not again
            if carry.offered is not None and carry.offered[0] is self.archive:
                since, again = m, (*carry.offered[1], *touched)
            originals = _originals(blocks, forms, placed[0], skimmed, since, again)
            offered = placed[0]
        self._archive(request, blocks, forms, originals)
        message = request.dialect.text_message(text)
        reported: list[int] | None = None
        if placed is None:
            report = _report(items, measured, blocks, forms)
        else:
            report, reported = _report_placed(items, measured, blocks, forms, placed[0],
                                              groups, carry)
        if facts is not None:
            then = carry.then(request.messages, request.span_start,
                              facts(request.span_start), items, carried, measured, rates,
                              cols, groups, carried_calls, context.superseded, report,
                              reported)
            if offered is not None:  # every carried item's originals but those shown
                then.offered = (self.archive, [p for p in offered if p < carried])
            self._carry = then
        return Rendered(message, tokens, level, report)

    def _facts(self, request: CompactionRequest) -> Callable[[int], Any] | None:
        """What the items of ``messages[head_len:upto]`` depend on besides the messages,
        as a function of ``upto``; ``None`` when they cannot be carried (no engine
        history, a render hook, pins only the hook can tell)."""
        if request.history is None or (request.pins is None and request.pins_possible) \
                or request.pm.hook.agentcompact_render_message.get_hookimpls():
            return None
        lo = request.head_len
        settings = (self.carry_forward_human, self.carry_forward_calls,
                    request.pins_possible)

        def facts(upto: int) -> Any:
            return (settings, *(frozenset(i for i in found if lo <= i < upto) for found in
                                (request.kept, request.pins or (), request.unpinned)))
        return facts

    @staticmethod
    def _refit(request: CompactionRequest, context: _Context, choose: Any, budget: int,
               limit: int, fill: bool
               ) -> tuple[list[_Block], list[int], list[int], _Placed | None, str, int]:
        """The rendering ``choose(room)`` gives whose exact count is within ``limit``:
        sizes are estimated from each original's tokens per character, the exact count of
        the assembled message corrects the estimate (a few refits). With ``fill`` (packing,
        whose estimates of results named on their call's line are upper bounds), a
        rendering well under the limit is refitted with more room too, and the fullest
        within the limit is kept."""
        room, low, high = budget, 0, None
        best: tuple[list[_Block], list[int], list[int], _Placed | None, str, int] | None \
            = None
        for _ in range(8):
            blocks, forms, tiers, placed = choose(room)
            text, tokens = _counted(request, context, blocks, forms, tiers, placed)
            if tokens <= limit:
                if best is None or tokens > best[5]:
                    best = (blocks, forms, tiers, placed, text, tokens)
                if not fill or tokens >= limit * 0.97:
                    break
                low = room
                grown = room + (limit - tokens) if high is None else (room + high) // 2
                if grown <= room + 8 or (high is not None and high - low <= 16):
                    break
                room = grown
            else:
                if not any(forms) or room <= 0:
                    break
                high = room
                shrunk = min(int(room * limit / tokens), room - tokens + limit) - 8
                room = shrunk if not fill or shrunk > low else (low + room) // 2
                if fill and room <= low:
                    break
        return best if best is not None else (blocks, forms, tiers, placed, text, tokens)

    def _escalate(self, request: CompactionRequest, context: _Context, items: Sequence[_Item],
                  rates: Sequence[float], level: int, budget: int
                  ) -> tuple[int, list[_Block], list[int], list[int]]:
        """The level whose rendering fits ``budget`` (graded by age from ``grade_from``:
        :meth:`_grade`), or the last: (level, blocks, sizes, tiers)."""
        top = len(self.levels) - 1
        tiers = [0] * len(items)
        while True:
            grading = self.grade_by_age and level >= self.grade_from
            if level < top and self._cannot_fit(context, items, rates, level, budget, grading):
                level += 1  # shown over budget without rendering this level
                continue
            if level < top and not grading and not self._may_fit(
                    request, context, items, rates, level, budget):
                level += 1  # over budget: the rest of this level's rendering is not needed
                continue
            blocks = [self._block(request, context, item, level) for item in items]
            sizes = [_size(context, b, rate) for b, rate in zip(blocks, rates)]
            total = sum(sizes) + len(blocks)
            if total <= budget or level == top:
                return level, blocks, sizes, tiers
            if grading:
                graded = self._grade(request, context, items, blocks, sizes, rates,
                                     budget - total)
                if graded is not None:
                    return level, *graded
            level += 1

    def _packing(self, request: CompactionRequest, context: _Context, items: Sequence[_Item],
                 rates: Sequence[float], level: int, budget: int, cols: Columns,
                 groups: Groups) -> tuple[int, list[int], Any] | None:
        """Newest first (``newest_share``): ``None`` when the rendering at ``level`` fits;
        else the level of the rich renderings, their sizes and ``choose(room)`` giving
        (blocks, forms, tiers, placed) packed by :func:`_pack` (``cols``: the items'
        renderings and sizes, carried from the last compaction for the items it had)."""
        if self._may_fit(request, context, items, rates, level, budget):
            blocks = [self._block(request, context, item, level) for item in items]
            sizes = [_size(context, b, rate) for b, rate in zip(blocks, rates)]
            if sum(sizes) + len(blocks) <= budget:
                return None
        top = len(self.levels) - 1
        level = max(level, min(self.grade_from, top))
        rich = cols.get(("block", level),
                        lambda p: self._block(request, context, items[p], level))
        lean = cols.get(("block", top), lambda p: self._block(request, context, items[p], top))
        rich_sizes = cols.get(("shown", level),
                              lambda p: _shown_size(context, rich[p], rates[p]))
        lean_sizes = cols.get(("shown", top), lambda p: _shown_size(context, lean[p], rates[p]))
        skims = cols.get(("skim", level), lambda p: _size(context, rich[p], rates[p], "skim"))
        # the least room each item takes shown at all (packing stops where none fits)
        least = list(itertools.accumulate(cols.get(("least", level), lambda p: min(
            rich_sizes[p], lean_sizes[p], skims[p]) if rich_sizes[p] or lean_sizes[p]
            else _NEVER), min))
        shown = cols.get("lean shown", lambda p: 1 if lean[p].full else 0)
        total = sum(shown)
        shares = (self.newest_share or 0.0, self.human_share)

        def choose(room: int) -> _Choice:
            forms, tiers, placed = _pack(items, rich_sizes, lean_sizes, skims, room, shares,
                                         groups, least)
            blocks = list(lean)
            for p in placed:
                if tiers[p] == 0:
                    blocks[p] = rich[p]
            # the items not placed are shown lean: omitted where that shows something
            return blocks, forms, tiers, (placed, total - sum(shown[p] for p in placed))
        return level, rich_sizes, choose

    def _cannot_fit(self, context: _Context, items: Sequence[_Item], rates: Sequence[float],
                    level: int, budget: int, grading: bool) -> bool:
        """True when lower bounds of the sizes (:func:`_min_chars`) show that the
        rendering at ``level`` is over ``budget`` even after grading (every item not
        pinned at the smaller of its sizes at ``level`` and at the last level): the
        loop would escalate past ``level`` anyway, so its rendering is not needed."""
        top = len(self.levels) - 1
        lean = max(level, top - 1)
        total = len(items)
        for item, rate, entry in zip(items, rates, context.slots):
            mins = entry.mins
            k = lean if item.lean else level
            chars = mins.get(k)
            if chars is None:
                chars = mins[k] = _min_chars(context, item, self.levels[k])
            if grading and chars and not item.pinned:
                low = mins.get(top)
                if low is None:
                    low = mins[top] = _min_chars(context, item, self.levels[top])
                chars = min(chars, low)
            if chars:
                total += int(chars * max(rate, 0.25)) + 2
                if total > budget:
                    return True
        return False

    def _may_fit(self, request: CompactionRequest, context: _Context, items: Sequence[_Item],
                 rates: Sequence[float], level: int, budget: int) -> bool:
        """Whether the rendering at ``level`` may fit ``budget``: False as soon as the
        items rendered so far are over it (the same sizes the full check sums)."""
        total = 0
        for item, rate in zip(items, rates):
            total += _size(context, self._block(request, context, item, level), rate) + 1
            if total > budget:
                return False
        return True

    def _grade(self, request: CompactionRequest, context: _Context, items: Sequence[_Item],
               blocks: list[_Block], sizes: list[int], rates: Sequence[float], excess: int
               ) -> tuple[list[_Block], list[int], list[int]] | None:
        """Oldest first (non-human items, then human ones; pinned ones never), items take
        the last level's rendering until ``excess`` tokens are saved; ``None`` when all of
        them do not save that much (the whole rendering escalates instead)."""
        top = len(self.levels) - 1
        blocks, sizes, tiers = list(blocks), list(sizes), [0] * len(items)
        excess = -excess
        for humans in (False, True):
            for i, item in enumerate(items):
                if excess <= 0:
                    return blocks, sizes, tiers
                if item.pinned or (item.role in _HUMAN_ROLES) != humans:
                    continue
                lean = self._block(request, context, item, top)
                size = _size(context, lean, rates[i])
                if size < sizes[i]:
                    excess -= sizes[i] - size
                    blocks[i], sizes[i], tiers[i] = lean, size, 1
        return (blocks, sizes, tiers) if excess <= 0 else None

    def _block(self, request: CompactionRequest, context: _Context, item: _Item, level: int
               ) -> _Block:
        """``item`` rendered at ``level``'s caps, once for every set of caps that renders it
        the same (:func:`_shape`: most caps repeat between levels, and items carried from
        earlier cycles keep theirs at every level), kept across calls while what the
        rendering depends on stays the same (:meth:`_Context.entry`)."""
        k = self._level_of(item, level)
        blocks = context.entry(item).blocks
        block: _Block | None = blocks.get(k)
        if block is None:
            caps = self.levels[k]
            key = _shape(context, item, caps)
            block = blocks.get(key)
            if block is None:
                block = blocks[key] = _render(request, context, item, caps)
            blocks[k] = block
        return block

    def _level_of(self, item: _Item, level: int) -> int:
        """The level whose caps render ``item`` at ``level``: items carried from earlier
        cycles, human ones aside, at the last-but-one level or leaner."""
        return max(0, level, len(self.levels) - 2) if item.lean else max(0, level)

    def _caps(self, item: _Item, level: int) -> CliffLevel:
        return self.levels[self._level_of(item, level)]

    def _archive(self, request: CompactionRequest, blocks: Sequence[_Block],
                 forms: Sequence[int], originals: list[ArchivedItem] | None = None) -> None:
        """Put the originals of what the message leaves out (``originals``, when the
        caller has them: :func:`_originals`) and of the kept messages the engine may
        truncate into the archive."""
        archive: Archive | None = self.archive
        if archive is None:
            return
        out: list[ArchivedItem] = []
        if originals is not None:
            out = originals
        else:
            for block, form in zip(blocks, forms):
                out += _put_of(block, form)
        out += _tail_items(request)
        stored = self._stored
        if type(archive) is not MemoryArchive:
            archive.put_many(out)
            return
        # an in-memory archive never forgets and leaves an item stored under its handle
        # as it is: the items carried from earlier compactions need not be put again
        if stored.archive is not archive or len(stored.handles) > _STORED_MAX:
            stored = self._stored = _Stored(archive)
        handles = stored.handles
        new = [item for item in out if item.handle not in handles]
        if new:
            archive.put_many(new)
            handles.update(item.handle for item in new)


_STORED_MAX = 65_536  # handles remembered as put (more: forgotten, put again)


class _Stored:
    """The handles a strategy put into ``archive`` (an in-memory one)."""

    __slots__ = ("archive", "handles")

    def __init__(self, archive: Any) -> None:
        self.archive = archive
        self.handles: set[str] = set()


@dataclass(slots=True)
class _Item:  # not frozen: a frozen dataclass's __init__ costs several times more
    index: int
    role: str
    parts: tuple[Part, ...]
    pinned: bool
    carried: bool
    override: tuple[str, ...] | None  # parts from the render_message hook
    pos: int = 0  # position in the call's list of items
    lean: bool = False  # carried and not human: rendered lean at every level
    unpinned: bool = False  # a pin past the pin budget: never omitted, its skim line stays


def _parts_by_index(request: CompactionRequest
                    ) -> tuple[range, Callable[[int], Sequence[Part]]]:
    """What :meth:`Carry.touched` reads, by index: the messages' indices and the parts of
    the message at an index (``request.known_history``'s facts)."""
    end = len(request.messages)
    facts = request.known_history.facts(end)
    return range(end), lambda i: facts[i][2]


def _collect(request: CompactionRequest, carry: bool, carry_calls: bool,
             indices: Iterable[int] | None = None, items: list[_Item] | None = None
             ) -> list[_Item]:
    """The messages to render: the span, and from earlier cycles the pinned messages and
    (with ``carry``) the human ones (with ``carry_calls`` all the others too). A user
    message carrying tool results beside text is two items, its results (a tool item)
    and its text (a human one); a pin's item holds its pinned text alone (what the user
    typed: ``agentcompact._pins``), the rest of its message is an item of its own."""
    messages, kept, span_start = request.messages, request.kept, request.span_start
    pins = request.pins_possible
    found = request.pins  # the engine's (``pinned`` answers from them)
    pinned_at = request.pinned if found is None else found.__contains__
    unpinned = request.unpinned
    hooks = bool(request.pm.hook.agentcompact_render_message.get_hookimpls())
    items = [] if items is None else items  # (``indices``: of these messages, added to it)
    facts = request.known_history.facts(request.cut)  # role, synthetic, parts, tools
    if indices is None:
        indices = itertools.chain(request.earlier(), request.span())
    for i in indices:
        message = messages[i]
        role, synthetic, parts, _ = facts[i]
        if synthetic or i in kept:  # ``request.keeps(i)``
            continue  # never compact a compaction; the engine sends kept ones itself
        carried = i < span_start
        pinned = pins and pinned_at(i)
        if carried and not pinned and not (
            carry and (role in _HUMAN_ROLES or carry_calls)
        ):
            continue  # earlier cycles: what is carried
        override = _hook_render(request, message, parts) if hooks else None
        for item_role, item_parts, item_pinned in _split(role, parts, pinned, override):
            if carried and not item_pinned and not any(p.text for p in item_parts):
                continue  # ... with some text
            if carried and not item_pinned and not carry_calls and item_role not in \
                    _HUMAN_ROLES:
                continue
            items.append(_Item(i, item_role, item_parts, item_pinned, carried, override,
                               len(items), carried and item_role not in _HUMAN_ROLES,
                               i in unpinned))
    return items


def _split(role: str, parts: tuple[Part, ...], pinned: bool, override: Any
           ) -> list[tuple[str, tuple[Part, ...], bool]]:
    """The items of one message: (role, parts, pinned). See :func:`_collect`."""
    if override is not None or role != "user":
        return [(role, parts, pinned)]
    results = tuple(p for p in parts if p.kind == "tool_result")
    rest = tuple(p for p in parts if p.kind != "tool_result")
    if pinned:
        typed: list[Part] = []
        injected: list[Part] = []
        for p in rest:
            if p.kind != "text" or not p.text:
                injected.append(p)
                continue
            pieces, harness = split_injected(p.text)
            typed += [Part("text", piece) for piece in pieces]
            injected += [Part("text", text) for text in harness]
        if not typed:  # nothing typed: the pin keeps the message's text (pinned_texts)
            return [(role, parts, True)]
        out: list[tuple[str, tuple[Part, ...], bool]] = []
        if results:
            out.append(("tool", results, False))
        if injected:
            out.append((role, tuple(injected), False))
        return [*out, (role, tuple(typed), True)]
    if results and rest:
        return [("tool", results, False), (role, rest, False)]
    return [(role, parts, pinned)]


def _hook_render(request: CompactionRequest, message: Any, parts: Sequence[Part]
                 ) -> tuple[str, ...] | None:
    result = request.pm.hook.agentcompact_render_message(
        message=message, dialect=request.dialect, settings={"strategy": "cliff"}
    )
    if result is None:
        return None
    texts = [p.text for p in parts if p.text]
    for piece in result:
        if not isinstance(piece, str) or not any(piece in t for t in texts):
            raise PluginError(
                "agentcompact_render_message returned text that is not quoted from the "
                f"message: {str(piece)[:80]!r}"
            )
    return tuple(result)


def _add_calls(calls: dict[str, int], items: Sequence[_Item], start: int, end: int
               ) -> dict[str, int]:
    """``calls`` with the call refs of ``items[start:end]`` rendered in the compaction
    message (not by a hook, not pinned) mapped to their item's position."""
    for k in range(start, end):
        item = items[k]
        if item.override is None and not item.pinned:
            for p in item.parts:
                if p.kind == "tool_call":
                    calls[p.ref] = k
    return calls


# --- what a skim line says ---------------------------------------------------------------
@dataclass(frozen=True)
class _Context:
    """What rendering needs besides the item: turn numbers, the call each result
    answers, and which results a later identical call superseded."""

    turn_starts: tuple[int, ...]
    calls: dict[str, tuple[str, str]]  # call ref -> (tool name, arguments)
    results: dict[str, Part]  # call ref -> the result answering it
    superseded: frozenset[str]  # refs of calls repeated later
    call_items: dict[str, int]  # call ref -> position of the item holding the call
    texts: _TextCache  # handles and truncations by text (across calls)
    blocks: _BlockCache  # renderings by what they depend on (across calls)
    # skim lines and the skim renderings of items, kept here for the call
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    # the entry of ``blocks`` of each item (by position), for the call
    slots: list[_Entry] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def of(cls, request: CompactionRequest, items: Sequence[_Item],
           texts: _TextCache | None = None, blocks: _BlockCache | None = None,
           call_items: dict[str, int] | None = None) -> _Context:
        """The context of ``request`` (its calls, results and turn starts: from
        ``request.known_history``); given ``call_items`` (:func:`_add_calls` of
        ``items``), its ``slots`` are left to fill."""
        texts = texts or _TextCache()
        history = request.known_history
        end = len(request.messages)
        index = history.tool_index(end, _call_key)
        order = index.order
        # the (key, ref) pairs of calls a later call with the same key superseded (set
        # operations: a long history has thousands of calls)
        superseded = frozenset(map(itemgetter(1), set(order).difference(dict(order).items())))
        calls, results, starts = index.calls, index.results, history.turn_starts(end)
        rendered = _add_calls({}, items, 0, len(items)) if call_items is None else call_items
        context = cls(starts, calls, results, superseded, rendered, texts,
                      _BlockCache() if blocks is None else blocks)
        if call_items is None:
            context.slots[:] = map(context._entry, items)
        return context

    def entry(self, item: _Item) -> _Entry:
        """The entry of ``blocks`` of ``item`` (one of the call's items)."""
        return self.slots[item.pos]

    def _entry(self, item: _Item) -> _Entry:
        """The renderings of ``item`` by caps and by shape, kept across calls under what
        :func:`_render` reads besides the caps: the item's role, pin, hook override and
        parts, its turn number (in skim lines), and for each call ref it names whether
        the call was superseded or is rendered in this message, the call it answers and
        the result answering it (``call_items`` positions are not part of a rendering:
        ``_Block.call_refs`` holds refs)."""
        refs = tuple(
            (p.ref in self.superseded, p.ref in self.call_items, self.calls.get(p.ref),
             None if (r := self.results.get(p.ref)) is None else r.text)
            for p in item.parts if p.kind in ("tool_call", "tool_result"))
        key = (item.role, item.pinned, item.override, item.parts, self.turn(item.index),
               refs)
        return self.blocks.entry(key, item.parts)

    def skims_result(self, ref: str, caps: CliffLevel) -> bool:
        """True when the result of call ``ref`` is left out at ``caps``."""
        part = self.results.get(ref)
        if part is None or len(part.text) <= caps.result_keep:
            return False
        return not caps.result_max or (ref in self.superseded and not caps.keep_superseded)

    def turn(self, index: int) -> int:
        return bisect.bisect_right(self.turn_starts, index)


#: the caches' bounds for a history (``hold``): a message's parts each have a handle and
#: a few truncations (one per cap), and each text is counted once per entry it keys, at
#: about four characters a token, several times over
_ENTRIES_PER_MESSAGE = 16
_CHARS_PER_TOKEN = 32


class _TextCache:
    """Handles, line indices and truncation pieces of texts, bounded: emptied when it
    holds more than ``max_entries`` entries or ``max_chars`` characters of text (plain
    dict operations, so threads sharing a strategy at worst compute a value twice)."""

    def __init__(self, max_entries: int = 8_192, max_chars: int = 8_000_000) -> None:
        self.max_entries, self.max_chars = max_entries, max_chars
        self._handles: dict[str, str] = {}
        self._pieces: dict[tuple[str, int, bool], tuple[Seg, ...]] = {}
        self._lines: dict[str, LineIndex] = {}
        self._chars = 0

    def hold(self, messages: int, tokens: int = 0) -> None:
        """Room for a history of ``messages`` messages and ``tokens`` tokens: the bounds
        grow with the largest history compacted (a history replayed at once, thousands
        of turns, would otherwise empty the cache at every compaction of the replay and
        compute everything again each time: quadratic, and worse), never shrink."""
        self.max_entries = max(self.max_entries, _ENTRIES_PER_MESSAGE * messages)
        self.max_chars = max(self.max_chars, _CHARS_PER_TOKEN * tokens)

    def _room(self, text: str) -> None:
        self._chars += len(text)
        if (self._chars > self.max_chars
                or len(self._handles) + len(self._pieces) >= self.max_entries):
            self._handles, self._pieces, self._lines = {}, {}, {}
            self._chars = len(text)

    def handle(self, text: str) -> str:
        found = self._handles.get(text)
        if found is None:
            found = handle_of(text)
            self._room(text)
            self._handles[text] = found
        return found

    def pieces(self, text: str, limit: int, inline: bool) -> tuple[Seg, ...]:
        key = (text, limit, inline)
        found = self._pieces.get(key)
        if found is None:
            index = None
            if not inline and text.count("\n") >= 3:  # cut by lines: index them once
                index = self._lines.get(text)
                if index is None:
                    index = self._lines[text] = line_index(text)
            found = tuple(truncation_pieces(text, limit, inline=inline,
                                            handle=self.handle(text), index=index))
            self._room(text)
            self._pieces[key] = found
        return found


class _Entry:
    """One item's renderings, by level index and by :func:`_shape`, and lower bounds of
    their characters by level index (:func:`_min_chars`)."""

    __slots__ = ("blocks", "mins", "skimmed")

    def __init__(self) -> None:
        self.blocks: dict[Any, _Block] = {}
        self.mins: dict[int, int] = {}
        #: the item's parts archived with their skim lines, its skim rendering, and the
        #: archived part by the part's position (``_render``)
        self.skimmed: tuple[list[ArchivedItem], list[Seg], dict[int, ArchivedItem]] | None \
            = None


class _BlockCache:
    """Renderings of items across calls (:meth:`_Context.entry` gives the key) for one
    tuple of ``levels`` (entries are by level index), bounded: emptied when it holds more
    than ``max_entries`` items or items of more than ``max_chars`` characters of text (a
    rendering is at most about its item's size; plain dict operations, as
    :class:`_TextCache`)."""

    def __init__(self, levels: tuple[CliffLevel, ...] = (), max_entries: int = 8_192,
                 max_chars: int = 8_000_000) -> None:
        self.levels, self.max_entries, self.max_chars = levels, max_entries, max_chars
        self._entries: dict[Any, _Entry] = {}
        self._chars = 0

    def hold(self, items: int, tokens: int) -> None:
        """Room for the renderings of ``items`` items of ``tokens`` tokens (as
        :meth:`_TextCache.hold`)."""
        self.max_entries = max(self.max_entries, 2 * items)
        self.max_chars = max(self.max_chars, _CHARS_PER_TOKEN * tokens)

    def entry(self, key: Any, parts: Sequence[Part] = ()) -> _Entry:
        """The entry under ``key``, a new one if absent (``parts``: the item's, counted
        against ``max_chars``)."""
        found = self._entries.get(key)
        if found is None:
            chars = sum(len(p.text) for p in parts)
            self._chars += chars
            if len(self._entries) >= self.max_entries or self._chars > self.max_chars:
                self._entries, self._chars = {}, chars
            found = self._entries[key] = _Entry()
        return found


@functools.lru_cache(maxsize=4_096)
def _call_key(name: str, args: str) -> str:
    """Calls with the same key supersede each other: same tool, same file or command."""
    try:
        value = json.loads(args) if args.startswith("{") else None
    except ValueError:
        value = None
    if isinstance(value, dict):
        for key in _KEY_ARGS:
            if isinstance(value.get(key), str):
                return f"{name}\x00{key}\x00{value[key]}"
    return f"{name}\x00{args}"


def _result_note(context: _Context, item: _Item, result: Part) -> str:
    """``[→ SIZE · expand HANDLE]``: a call's result left out, named on the call's line
    (which gives the tool and its arguments)."""
    superseded = " · superseded" if result.ref in context.superseded else ""
    lines = result.text.count("\n") + 1
    size = f"{lines} lines" if lines > 1 else f"{len(result.text)} chars"
    return f"[→ {size}{superseded} · expand {context.texts.handle(result.text)}]"


def _size_note(text: str) -> str:
    lines = text.count("\n") + 1
    return f"{lines} lines, {len(text)} chars" if lines > 1 else f"{len(text)} chars"


def _skim_line(context: _Context, item: _Item, part: Part, note: str = "") -> str:
    """``[turn T · WHAT · SIZE · expand HANDLE]`` for a part left out."""
    key = ("skim", item.index, id(part), note)
    line: str | None = context.memo.get(key)
    if line is None:
        line = context.memo[key] = _new_skim_line(context, item, part, note)
    return line


def _new_skim_line(context: _Context, item: _Item, part: Part, note: str) -> str:
    turn = context.turn(item.index)
    kind = part.kind
    if kind == "tool_call":
        what = f"tool call {part.name} {part.text[:_EXCERPT]}"
        size = f"{len(part.text)} chars" if len(part.text) > _EXCERPT else ""
    elif kind == "tool_result":
        name, args = context.calls.get(part.ref, ("", ""))
        what = f"result of {name} {args[:_EXCERPT]}".rstrip() if name else "tool result"
        size = _size_note(part.text)
    else:
        role = "thinking" if kind == "thinking" else f"{item.role} text"
        what, size = role, _size_note(part.text)
    fields = [f"turn {turn}", what, *([size] if size else []), *([note] if note else []),
              f"expand {context.texts.handle(part.text)}"]
    return "[" + " · ".join(fields) + "]"


# --- rendering one item -------------------------------------------------------------------
#: characters a cap lets a text go over before it cuts: a cut marker names a handle
#: (``[… N chars omitted · expand HANDLE …]``, about 19 tokens), so cutting fewer
#: characters than this costs more than it saves (never mark what is cheaper to keep)
_SLACK = 64


def _cuts(limit: int, length: int) -> bool:
    """Whether a cap of ``limit`` characters (0 or less: none) cuts a text of ``length``."""
    return 0 < limit < length - _SLACK


def _effective(limit: int, length: int) -> int:
    """What a cap of ``limit`` characters does to a text of ``length``: -1 keeps it whole,
    0 drops it (class-specific), else the limit it is cut to."""
    return 0 if limit <= 0 else limit if _cuts(limit, length) else -1


def _shape(context: _Context, item: _Item, caps: CliffLevel) -> tuple[Any, ...]:
    """What of ``caps`` the rendering of ``item`` depends on (``_render_part`` reads
    nothing else): two caps with the same shape render the item byte for byte the same."""
    if item.override is not None:
        return ()
    human = item.role in _HUMAN_ROLES
    out: list[Any] = []
    for part in item.parts:
        kind, n = part.kind, len(part.text)
        if item.pinned and n:
            out.append(None)
        elif kind == "text" and n:
            out.append(_effective(caps.human_max if human else caps.assistant_max, n))
        elif kind == "thinking" and n:
            out.append(_effective(caps.thinking_max, n))
        elif kind == "tool_call":
            out.append((_effective(caps.call_args_max, n) if n else None,
                        context.skims_result(part.ref, caps)))
        elif kind == "tool_result":
            out.append(True if context.skims_result(part.ref, caps) else
                       -2 if n <= caps.result_keep else _effective(caps.result_max, n))
        else:
            out.append(None)
    return tuple(out)


_MIN_MARK = 36  # characters of a skim line, result note or cut marker at least (each
#                names a 15-character handle, ``[… N chars omitted · expand HANDLE …]``)


def _min_chars(context: _Context, item: _Item, caps: CliffLevel) -> int:
    """A lower bound of the characters of ``item`` rendered at ``caps``, from lengths
    alone (what :func:`_render_part` keeps at least: a text cut by characters keeps its
    cap, by lines at least a quarter of it, and a cut, skim line or result note names a
    handle; the label and the line breaks between parts known to render)."""
    if item.override is not None:
        return sum(map(len, item.override))
    limits = {"text": caps.human_max if item.role in _HUMAN_ROLES else caps.assistant_max,
              "thinking": caps.thinking_max}
    total = shown = 0
    for part in item.parts:
        kind, n = part.kind, len(part.text)
        low = 0
        if item.pinned and n:
            low = n
        elif kind in limits and n:
            limit = limits[kind]
            low = (limit // 4 + _MIN_MARK if _cuts(limit, n) else n) if limit else \
                _MIN_MARK if kind == "text" else 0
            if low and kind == "thinking":
                low += len("[thinking] ")
        elif kind == "tool_call":
            limit = caps.call_args_max
            low = len("[tool call ] ") + len(part.name) + (
                max(limit, 2) + _MIN_MARK if _cuts(limit, n) else n)
            if context.skims_result(part.ref, caps):
                low += _MIN_MARK
        elif kind == "tool_result":
            if not context.skims_result(part.ref, caps):
                limit = n if n <= caps.result_keep else caps.result_max
                low = limit // 4 + _MIN_MARK if _cuts(limit, n) else n
            elif part.ref not in context.call_items:
                low = _MIN_MARK  # a skim line (else named on the call's line)
        elif kind == "image":
            low = len("[image omitted]")
        if low:
            total += low
            shown += 1
    if shown:  # the label line and the line breaks between parts
        total += len(_LABELS.get(item.role, f"[{item.role}]")) + shown
    return total


def _size(context: _Context, block: _Block, rate: float, variant: str = "full") -> int:
    """``_estimate`` of ``block.full`` (or ``skim``), once per block and rate (the item's
    rate is its original's tokens per character)."""
    size = block.sizes.get((variant, rate))
    if size is None:
        size = block.sizes[(variant, rate)] = _estimate(len(block.text(variant)), rate)
    return size


def _shown_size(context: _Context, block: _Block, rate: float) -> int:
    """``_size`` of the rendering shown at most: a result named on its call's line shows
    its own line when the call is not shown beside it (``_shown``: ``alone``)."""
    size = _size(context, block, rate)
    return max(size, _size(context, block, rate, "alone")) if block.alone is not None else size


_SEG_TEXT = itemgetter(1)  # a segment's text (joined at C speed)
_NEVER = 1 << 62  # the room an item with nothing to show takes (never packed)
#: what packing places: the positions of the items shown, and how many others have a
#: rendering (those are omitted)
_Placed = tuple[list[int], int]
_Choice = tuple[list["_Block"], list[int], list[int], _Placed | None]


@dataclass
class _Block:
    full: list[Seg]  # the rendering at the level's caps
    skim: list[Seg]  # skim lines only
    archived: list[ArchivedItem]  # originals of what ``full`` leaves out or cuts
    skimmed: list[ArchivedItem]  # originals of every part (for ``skim`` or omission)
    cut: bool = False  # ``full`` truncates or skims something
    alone: list[Seg] | None = None  # ``full`` when the items holding the calls are not
    call_refs: frozenset[str] = frozenset()  # ... (the calls' refs) rendered in full
    sizes: dict[tuple[str, float], int] = field(default_factory=dict)  # ``_size``
    counts: dict[tuple[str, str, bool], int] = field(default_factory=dict)  # ``_counted``
    texts: dict[str, str] = field(default_factory=dict)  # ``text`` by variant

    def text(self, variant: str) -> str:
        """The text of the rendering ``variant`` (``full``, ``alone`` or ``skim``)."""
        found = self.texts.get(variant)
        if found is None:
            found = self.texts[variant] = "".join(map(_SEG_TEXT, getattr(self, variant)))
        return found


def _archived(context: _Context, item: _Item, part: Part, note: str = "") -> ArchivedItem:
    return ArchivedItem(context.texts.handle(part.text), part.text,
                        _skim_line(context, item, part, note))


def _cap(context: _Context, part: Part, limit: int, inline: bool = False) -> list[Seg]:
    if not _cuts(limit, len(part.text)):
        return [(True, part.text)]
    return list(context.texts.pieces(part.text, limit, inline))


def _render_part(context: _Context, item: _Item, part: Part, caps: CliffLevel,
                 on_call: bool = True) -> tuple[list[Seg], bool]:
    """The part's segments at ``caps``, and whether they leave something out (with
    ``on_call``, a result left out is named on its call's line, not here)."""
    if item.pinned and part.text:
        return [(True, part.text)], False
    kind, text = part.kind, part.text
    if kind == "text" and text:
        limit = caps.human_max if item.role in _HUMAN_ROLES else caps.assistant_max
        if limit:
            return _cap(context, part, limit), _cuts(limit, len(text))
        return [(False, _skim_line(context, item, part))], True
    if kind == "thinking" and text:
        if not caps.thinking_max:
            return [], True
        return [(False, "[thinking] "), *_cap(context, part, caps.thinking_max)], True
    if kind == "tool_call":
        args = _cap(context, part, caps.call_args_max, inline=True) if text else []
        out = [(False, "[tool call "), (True, part.name), (False, "] "), *args]
        if context.skims_result(part.ref, caps):  # the result's handle, on the call's line
            out.append((False, " " + _result_note(context, item, context.results[part.ref])))
        return out, _cuts(caps.call_args_max, len(text))
    if kind == "tool_result":
        if not context.skims_result(part.ref, caps):
            if len(text) <= caps.result_keep:
                return ([(True, text)] if text else []), False
            return _cap(context, part, caps.result_max), _cuts(caps.result_max, len(text))
        if on_call and part.ref in context.call_items:
            return [], True  # named on its call's line
        note = "superseded" if part.ref in context.superseded else ""
        return [(False, _skim_line(context, item, part, note))], True
    if kind == "image":
        return [(False, "[image omitted]")], False
    return [], False


def _join(label: str, pieces: Sequence[list[Seg]]) -> list[Seg]:
    out: list[Seg] = [(False, label + "\n")]
    for segs in pieces:
        if segs:
            if len(out) > 1:
                out.append((False, "\n"))
            out.extend(segs)
    return out if len(out) > 1 else []


def _render(request: CompactionRequest, context: _Context, item: _Item, caps: CliffLevel
            ) -> _Block:
    label = _LABELS.get(item.role, f"[{item.role}]")
    entry = context.entry(item)
    found = entry.skimmed
    if found is None:  # the same at every level, and across calls (the entry's key holds
        #                what skim lines read: turn, parts, the calls results answer)
        with_text = [k for k, p in enumerate(item.parts) if p.text]
        skimmed = [_archived(context, item, item.parts[k]) for k in with_text]
        found = entry.skimmed = (skimmed, _join(label, [[(False, a.skim)] for a in skimmed]),
                                 dict(zip(with_text, skimmed)))
    skimmed, skim, archived_of = found
    if item.override is not None:
        full = _join(label, [[(True, piece)] for piece in item.override])
        return _Block(full, skim, skimmed, skimmed, True)
    pieces, alone, archived, cut = [], [], [], False
    calls: set[str] = set()
    for k, part in enumerate(item.parts):
        segs, left_out = _render_part(context, item, part, caps)
        pieces.append(segs)
        if left_out and part.text:
            archived.append(archived_of[k])
            cut = True
        if part.kind == "tool_call" and context.skims_result(part.ref, caps):
            # the call's line names its result's handle: the result is archived with it,
            # whatever the result's own item renders (packing gives items other levels)
            archived.append(_archived(context, item, context.results[part.ref]))
        if part.kind == "tool_result" and not segs and part.ref in context.call_items:
            calls.add(part.ref)
            segs = _render_part(context, item, part, caps, on_call=False)[0]
        alone.append(segs)
    block = _Block(_join(label, pieces), skim, archived, skimmed, cut)
    if calls:
        block.alone, block.call_refs = _join(label, alone), frozenset(calls)
    return block


def _tail_items(request: CompactionRequest) -> list[ArchivedItem]:
    """Originals of the kept messages the engine may truncate (over ``TRUNCATABLE_TOKENS``
    tokens): ``Dialect.truncate`` names their handle, so an expand must find them
    (``Dialect.truncation_texts``: the texts it may cut, one by one)."""
    tail = request.messages[request.cut:]
    dialect = request.dialect
    texts_of = getattr(dialect, "truncation_texts", None) or (
        lambda m: [p.text for p in dialect.parts(m) if p.kind in ("text", "tool_result")])
    history = request.history
    counts = (history.tokens[request.cut:len(request.messages)] if history is not None
              else request.meter.measure(tail).tokens)  # the engine's counts, when given
    out = []
    for message, tokens in zip(tail, counts):
        if tokens <= TRUNCATABLE_TOKENS:
            continue
        for text in texts_of(message):
            if len(text) > _TAIL_MIN_CHARS:
                out.append(ArchivedItem(handle_of(text), text))
    return out


# --- fitting ------------------------------------------------------------------------------
_OMIT, _SKIM, _FULL = 0, 1, 2


def _token_rates(items: Sequence[_Item], measured: Sequence[int]) -> list[float]:
    """Tokens per character of each item's original message (``measured``: its tokens)."""
    chars: dict[int, int] = {}  # a message's characters (over the items it was split into)
    for item in items:
        chars[item.index] = chars.get(item.index, 0) + sum(len(p.text) + len(p.name)
                                                           for p in item.parts)
    return [tokens / chars[item.index] if chars[item.index] else 0.3
            for item, tokens in zip(items, measured)]


def _estimate(chars: int, rate: float) -> int:
    return int(chars * max(rate, 0.25)) + 2 if chars else 0


def _pack(items: Sequence[_Item], rich: Sequence[int], lean: Sequence[int],
          skims: Sequence[int], budget: int, shares: tuple[float, float], groups: Groups,
          least: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
    """Forms and tiers (0: the rich rendering, 1: the lean one), newest first: pinned
    items whole; then pins past the pin budget and human items, newest first, within
    ``shares[1]`` of ``budget``; then
    every other item, newest first: rich while the extra the rich renderings cost stays
    within ``shares[0]`` of the budget, else lean, else its skim line (bulky items and pins
    past the pin budget), else left out. The oldest are left out first because the newest
    take the room first.

    ``groups`` gives the positions of the pinned items, of the pins past the pin budget
    and of the human items; ``least[i]``, the least room any of ``items[:i + 1]`` takes
    shown: the last pass ends where not even that fits. Also returns the positions of the
    items shown (pinned or placed), in order."""
    n = len(items)
    forms, tiers = [_OMIT] * n, [1] * n
    used = extra = 0
    rich_room, human_room = int(shares[0] * budget), int(shares[1] * budget)
    for i in groups.pinned:
        forms[i], tiers[i] = _FULL, 0
        used += rich[i] + 1
    placed = list(groups.pinned)
    for kind, among in (("unpinned", groups.unpinned), ("human", groups.humans),
                        ("any", None)):
        room = min(budget, used + human_room) if kind != "any" else budget
        for i in reversed(among) if among is not None else range(n - 1, -1, -1):
            if among is None and used + least[i] >= room:
                break  # nothing older fits (``used`` only grows)
            item = items[i]
            if item.pinned or forms[i] != _OMIT:
                continue
            if not rich[i] and not lean[i]:
                continue  # nothing to show
            more = rich[i] - lean[i]
            if extra + more <= rich_room and used + rich[i] < room:
                forms[i], tiers[i] = _FULL, 0
                used, extra = used + rich[i] + 1, extra + max(more, 0)
            elif used + lean[i] < room:
                forms[i] = _FULL
                used += lean[i] + 1
            elif (skims[i] <= lean[i] // 2 or item.unpinned) and used + skims[i] < room:
                forms[i] = _SKIM
                used += skims[i] + 1
            else:
                continue
            placed.append(i)
    placed.sort()
    return forms, tiers, placed


def _fit(items: Sequence[_Item], sizes: Sequence[int], skims: Sequence[int], budget: int
         ) -> list[int]:
    """Oldest first, bulky items become skim lines, then items go: non-human ones first,
    human ones next, pinned ones never (pins past the pin budget keep their skim line
    while the budget allows)."""
    forms = [_FULL if s else _OMIT for s in sizes]
    total = sum(s + 1 for s in sizes if s)
    for humans in (False, True):
        for form in (_SKIM, _OMIT):
            for i, item in enumerate(items):
                if total <= budget:
                    return forms
                if forms[i] > form and not item.pinned and \
                        (item.role in _HUMAN_ROLES) == humans:
                    now = sizes[i] if forms[i] == _FULL else skims[i]
                    to = _SKIM if item.unpinned else form  # an unpinned pin keeps a line
                    if to == _SKIM and (forms[i] == _SKIM or form == _SKIM
                                        and skims[i] > now // 2):
                        continue  # skim lines only where they save half: bulky items
                    total -= now - (skims[i] if to == _SKIM else 0) + (to == _OMIT)
                    forms[i] = to
    for i, item in enumerate(items):  # still over: unpinned pins' lines go, oldest first
        if total <= budget:
            break
        if forms[i] == _SKIM and item.unpinned:
            total -= skims[i] + 1
            forms[i] = _OMIT
    return forms


def _shown(context: _Context, blocks: Sequence[_Block], forms: Sequence[int],
           tiers: Sequence[int] | None = None, placed: _Placed | None = None
           ) -> tuple[int, list[tuple[_Block, str]]]:
    """How many items with a rendering are omitted, and the rendering shown of each
    other one, in order: (block, ``full``, ``alone`` or ``skim``). ``placed``: the
    positions of the items not omitted and how many of the others have a rendering
    (packing knows both)."""
    if placed is None:
        omitted = sum(1 for b, f in zip(blocks, forms) if b.full and f == _OMIT)
        shown: Iterable[int] = range(len(blocks))
    else:
        shown, omitted = placed
    tiers = tiers or [0] * len(blocks)
    out: list[tuple[_Block, str]] = []
    for i in shown:
        block, form = blocks[i], forms[i]
        variant = "full" if form == _FULL else "skim" if form == _SKIM else ""
        if variant == "full" and block.alone is not None and any(
                forms[k] != _FULL or tiers[k] != tiers[i]
                for k in map(context.call_items.__getitem__, block.call_refs)):
            variant = "alone"  # the results' calls are not there to name them
        if variant and getattr(block, variant):
            out.append((block, variant))
    return omitted, out


def _heading(omitted: int) -> str:
    if omitted:  # searchable
        return f"{COMPACTION_HEADER}\n\n[… {omitted} earlier items omitted …]"
    return COMPACTION_HEADER


def _assemble(context: _Context, blocks: Sequence[_Block], forms: Sequence[int],
              tiers: Sequence[int] | None = None) -> list[Seg]:
    omitted, shown = _shown(context, blocks, forms, tiers)
    out: list[Seg] = [(False, _heading(omitted))]
    for block, variant in shown:
        out.append((False, "\n\n"))
        out.extend(getattr(block, variant))
    return out


#: counters whose count of a text is the sum of the counts of its pieces cut where a
#: line break is followed by ``[`` (tiktoken's o200k and cl100k pre-tokenizers never put
#: ``\n[`` in one piece, and no piece's match depends on what follows a line break)
_SPLIT_COUNTERS = frozenset({"tiktoken:o200k_base", "tiktoken:cl100k_base"})


def _counted(request: CompactionRequest, context: _Context, blocks: Sequence[_Block],
             forms: Sequence[int], tiers: Sequence[int], placed: _Placed | None = None
             ) -> tuple[str, int]:
    """The compaction message's text and its tokens (``count_text_message``). Every
    rendering starts with its ``[role]`` label after a blank line, so with a counter of
    :data:`_SPLIT_COUNTERS` the count is summed from counts of the renderings, kept on
    their blocks across refits and calls: the same number, without encoding the whole
    message at every refit."""
    omitted, shown = _shown(context, blocks, forms, tiers, placed)
    texts = [_heading(omitted)]
    for block, variant in shown:
        texts.append(block.text(variant))
    text = "\n\n".join(texts)
    meter = request.meter
    counter = meter.counter
    name = getattr(counter, "name", None)
    if (name not in _SPLIT_COUNTERS or type(counter) is not TiktokenCounter
            or type(meter).count_text_message is not MessageMeter.count_text_message
            or not all(t.startswith("[") for t in texts[1:])):
        return text, meter.count_text_message(text)
    last = len(shown) - 1
    tokens = counter.count_texts([texts[0] + "\n\n" if shown else texts[0]])[0]
    for k, (block, variant) in enumerate(shown):
        key = (name, variant, k == last)
        found = block.counts.get(key)
        if found is None:
            found = block.counts[key] = counter.count_texts(
                [texts[k + 1] if k == last else texts[k + 1] + "\n\n"])[0]
        tokens += found
    return text, tokens + MESSAGE_OVERHEAD


def _report(items: Sequence[_Item], tokens: Sequence[int], blocks: Sequence[_Block],
            forms: Sequence[int]) -> list[DroppedItem]:
    """One entry per message: ``dropped`` when something of it is left out without a
    trace (an item of a split message omitted), else ``truncated`` when something is cut
    or skimmed, else ``rendered``."""
    report: dict[int, DroppedItem] = {}
    rank = {"rendered": 0, "truncated": 1, "dropped": 2}
    for item, block, form, n in zip(items, blocks, forms, tokens):
        if form == _OMIT or not block.full:
            action = "dropped"
        elif form == _SKIM or block.cut:
            action = "truncated"
        else:
            action = "rendered"
        found = report.get(item.index)
        if found is None:
            kind = item.parts[0].kind if item.parts else "other"
            report[item.index] = DroppedItem(item.index, item.role, action, n, kind)
        elif rank[action] > rank[found.action]:
            found.action = action
    return list(report.values())


def _originals(blocks: Sequence[_Block], forms: Sequence[int], placed: Sequence[int],
               skimmed: Sequence[list[ArchivedItem]], since: int = 0,
               again: Iterable[int] = ()) -> list[ArchivedItem]:
    """The originals :meth:`CliffStrategy._archive` puts, where only the items at
    ``placed`` are shown: those of every part of the others (``skimmed``, by item),
    joined at C speed; of the items before ``since`` (offered to the archive by an
    earlier compaction, which leaves what it stores as it is) only those at ``placed``
    and ``again``. In item order, so the archive stores new originals in the order a
    compaction from scratch puts them."""
    shown = set(placed)
    out: list[ArchivedItem] = []
    for p in sorted(shown.union(again).difference(range(since, len(skimmed)))):
        out += _put_of(blocks[p], forms[p]) if p in shown else skimmed[p]
    every = list(itertools.chain.from_iterable(skimmed[since:]))
    starts = list(itertools.accumulate(map(len, skimmed[since:]), initial=0))
    done = since  # the items before ``done`` are in ``out``
    for p in sorted(q for q in shown if q >= since):
        out += every[starts[done - since]:starts[p - since]]
        out += _put_of(blocks[p], forms[p])
        done = p + 1
    out += every[starts[done - since]:]
    return out


def _put_of(block: _Block, form: int) -> list[ArchivedItem]:
    """The originals of an item shown as ``form`` the archive is given (those of what the
    full rendering leaves out or cuts; of every part, skimmed)."""
    return block.archived if form == _FULL else block.skimmed


def _report_placed(items: Sequence[_Item], tokens: Sequence[int], blocks: Sequence[_Block],
                   forms: Sequence[int], placed: Sequence[int], groups: Groups,
                   carry: Carry) -> tuple[list[DroppedItem], list[int]]:
    """:func:`_report` where only the items at ``placed`` are shown: the messages of the
    others are dropped. The entries of messages the last compaction (``carry``) reported
    dropped too are its own (a report is a record: never changed once made, so a long
    history's reports need not be made anew, entry by entry, at every crossing). Also
    returns where the report has entries other than ``dropped``."""
    k = len(carry.report)
    report = carry.report + list(map(
        DroppedItem, groups.indices[k:], groups.roles[k:], itertools.repeat("dropped"),
        groups.tokens[k:], groups.kinds[k:]))
    for k in carry.reported:  # shown then
        report[k] = DroppedItem(groups.indices[k], groups.roles[k], "dropped",
                                groups.tokens[k], groups.kinds[k])
    firsts, n = groups.firsts, len(items)
    shown = sorted({bisect.bisect_right(firsts, p) - 1 for p in placed})
    for k in shown:
        end = firsts[k + 1] if k + 1 < len(firsts) else n
        report[k] = _report(items[firsts[k]:end], tokens[firsts[k]:end],
                            blocks[firsts[k]:end], forms[firsts[k]:end])[0]
    return report, [k for k in shown if report[k].action != "dropped"]


def render_segments(request: CompactionRequest, level: int = 0,
                    strategy: CliffStrategy | None = None) -> list[Seg]:
    """The rendering at ``level`` as segments, nothing dropped (for provenance checks)."""
    strategy = strategy or CliffStrategy(archive=False)
    items = _collect(request, strategy.carry_forward_human, strategy.carry_forward_calls)
    context = _Context.of(request, items)
    blocks = [_render(request, context, it, strategy._caps(it, level)) for it in items]
    return _assemble(context, blocks, [_FULL] * len(blocks))


def settings_dict(strategy: CliffStrategy) -> dict[str, Any]:
    return {"levels": [asdict(level) for level in strategy.levels],
            "carry_forward_human": strategy.carry_forward_human,
            "carry_forward_calls": strategy.carry_forward_calls,
            "human_floor_tokens": strategy.human_floor_tokens,
            "grade_by_age": strategy.grade_by_age, "grade_from": strategy.grade_from,
            "newest_share": strategy.newest_share, "human_share": strategy.human_share}
