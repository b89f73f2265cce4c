"""Plan the cut: where a compaction at one call cuts, and what room its message gets.

:func:`plan` is a pure function of the history, the stored entry in force, the budget and
the pins: the engine calls it for each compaction, and tests call it directly. It reads
the facts of :class:`~agentcompact._history.History` (counts, prefix sums, turn starts)
and derives none of its own. :class:`State` is what is sent for a history with a stored
entry in force.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._history import History
from ._pins import PIN_SHARE, PinLookup, bound_pins
from ._store import PrefixEntry
from ._turns import starts_with_thinking
from .errors import PluginError
from .strategies._base import TRUNCATABLE_TOKENS

if TYPE_CHECKING:
    from ._budget import Budget
    from .dialects._base import Dialect

__all__ = ["FOLD_TOKENS", "Plan", "State", "decide", "kept_type", "min_budget", "plan", "shrink",
           "shrink_tail"]

_TAIL_SHARE = 0.75  # kept turns may use this share of the target; the rest is for rendering
_FLOOR_SHARE = 0.15  # the strategy's floor takes at most this of the trigger (fixed part aside)
_FLOOR_MIN = 1_000  # ... or this, when it is more (never over the target, though)
#: a large tool output of the newest kept turn, whole at a compaction because the agent has
#: not read it, is folded to about this many tokens at the first call after it has (head,
#: tail and error lines, with the handle of the original: ``agentcompact._fold``)
FOLD_TOKENS = 300
_SUMMARY_OVERHEAD = 32  # tokens of a summary message besides its output (header, framing)

Overrides = dict[int, tuple[str, Any, int]]


@dataclass
class State:
    """What is sent for a history: its messages, with the stored ``entry`` (if any)
    substituted for the prefix it replaced."""

    entry: PrefixEntry | None

    def tokens_at(self, history: History, end: int) -> int:
        e = self.entry
        if e is None:
            return history.prefix[end] + history.fixed
        total = history.fixed + history.prefix[e.head_len] + e.message_tokens
        total += history.prefix[end] - history.prefix[e.cut]
        for idx in e.kept:
            total += history.tokens[idx]
        for idx, (digest, _, tokens) in e.overrides.items():
            if idx < end and history.digests[idx] == digest:
                total += tokens - history.tokens[idx]
        return total

    def messages_at(self, history: History, end: int) -> list[Any]:
        e = self.entry
        msgs = history.messages
        if e is None:
            return msgs[:end]
        out = msgs[: e.head_len]
        if e.kept:
            out += [msgs[i] for i in e.kept]
        if e.message is not None:
            out.append(e.message)
        tail = msgs[e.cut : end]
        for idx, (digest, copy, _) in e.overrides.items():
            if e.cut <= idx < end and history.digests[idx] == digest:
                tail[idx - e.cut] = copy
        return out + tail


@dataclass(frozen=True)
class Plan:
    """Outcome of "plan the cut": compact ``messages[:c]`` by sending ``[:head_len]``,
    the span's ``kept`` messages verbatim, the strategy's message (``budget_tokens``) and
    ``[cut:c]`` (``overrides``: kept messages truncated to make room)."""

    c: int
    head_len: int
    span_start: int
    cut: int
    kept: tuple[int, ...]
    pinned: tuple[int, ...]  # pins of the span within the pin budget: their pinned text
    #                          must be in the message
    pins: tuple[int, ...]  # every pin of [head_len, c) but ``unpinned``: their pinned text
    #                        is never cut
    unpinned: tuple[int, ...]  # pins of the span past the pin budget (the oldest)
    recent_turns: int
    target: int
    budget_tokens: int
    overrides: tuple[tuple[int, tuple[str, Any, int]], ...]
    reason: str
    level: int
    before: int
    folds: tuple[tuple[int, str], ...] = ()  # the newest turn's tool outputs to fold
    fixed_part: int = 0  # tokens sent whatever the cut: fixed, head and kept instructions


def min_budget(strategy: Any) -> int:
    """The smallest ``budget_tokens`` the strategy works with: its ``min_budget_tokens``,
    else its minimum output (``min_output_tokens``, ``min_block_output_tokens``) plus the
    header and framing, else 0."""
    for attr in ("min_budget_tokens", "min_output_tokens", "min_block_output_tokens"):
        value = getattr(strategy, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return max(0, value + (0 if attr == "min_budget_tokens" else _SUMMARY_OVERHEAD))
    return 0


def decide(history: History, state: State, n: int, budget: Budget, hook: Any,
           tokens: int | None = None) -> bool:
    """Whether to compact ``messages[:n]`` (sent as ``state`` says, ``tokens`` of it):
    the ``agentcompact_should_compact`` hook's answer (``hook``), else over the trigger."""
    if tokens is None:
        tokens = state.tokens_at(history, n)
    if hook.get_hookimpls():
        decided = hook(messages=state.messages_at(history, n), tokens=tokens, budget=budget,
                       dialect=history.dialect)
        if decided is not None:
            if not isinstance(decided, bool):
                raise PluginError(f"agentcompact_should_compact returned a "
                                  f"{type(decided).__name__}; expected True, False or None")
            return decided
    return tokens > budget.trigger


def kept_type(dialect: Dialect, message: Any) -> bool:
    """Whether the engine sends ``message`` verbatim whatever the cut: an instruction, an
    opaque item, or a compaction message fed back in."""
    return dialect.is_kept(message) or dialect.is_synthetic(message)


def plan(history: History, entry: PrefixEntry | None, budget: Budget, pins: PinLookup, *,
         c: int | None = None, reason: str = "trigger", level: int = 0,
         floor_tokens: int = 0) -> Plan | None:
    """Where to cut for a compaction of ``history.messages[:c]`` (default: all of it)
    with ``entry`` in force: the head, the span, the messages of the span kept verbatim,
    how many recent turns stay, and the strategy's budget (made at least
    ``floor_tokens``, the strategy's minimum, when dropping turns or truncating the
    largest kept tool output can make it so). ``None``: nothing to compact."""
    c = len(history.messages) if c is None else c
    msgs = history.messages
    dialect = history.dialect
    turn_starts = history.turn_starts(c)
    if not turn_starts:
        return None
    head_len = turn_starts[0]
    while head_len > 0 and history.synthetic(head_len - 1):
        head_len -= 1
    prev_cut = entry.cut if entry else turn_starts[0]
    cuts = [*turn_starts[bisect.bisect_right(turn_starts, prev_cut):], c]  # cuts[-1-r]
    #                                                                    keeps r turns
    if dialect.thinking_loops():
        cuts = _thinking_safe(cuts, history, c)
    kept_turns = {s: len(turn_starts) - bisect.bisect_left(turn_starts, s) for s in cuts}
    options = [s for s in cuts if kept_turns[s] >= budget.min_recent_turns]
    if not options:
        return None  # nothing new to compact without breaking min_recent_turns
    is_kept = dialect.is_kept
    head = history.prefix[head_len] + history.fixed
    head_fixed = history.fixed + sum(history.tokens[i] for i in range(head_len)
                                     if is_kept(msgs[i]))
    # the span's kept messages stay for every cut: only their set is cut-dependent
    first = next((k for k, s in enumerate(options) if kept_turns[s] <= budget.recent_turns),
                 len(options) - 1)
    pinned_all = pins.within(msgs, head_len, c)
    # kept messages before the previous cut are the previous entry's; scan the rest once
    known = tuple(i for i in entry.kept if i >= head_len) if entry else ()
    scan_from = prev_cut if entry else head_len
    candidates = known + tuple(i for i in range(scan_from, options[-1])
                               if kept_type(dialect, msgs[i]))
    candidates = _with_partners(dialect, msgs, candidates, head_len, c)
    foldable = _foldable(history, turn_starts[-1], c, pinned_all)
    k = first
    while True:
        cut = options[k]
        kept = tuple(i for i in candidates if i < cut)
        kept_tokens = sum(history.tokens[i] for i in kept)
        target = budget.target_for(head_fixed + kept_tokens)
        tail = history.prefix[c] - history.prefix[cut]
        # what the fold will take off the newest turn: the target is where the context
        # lands once the agent has read it (never over the trigger before)
        folds = tuple((i, history.digests[i]) for i in foldable if i >= cut)
        extra = min(sum(history.tokens[i] - FOLD_TOKENS for i, _ in folds),
                    max(0, budget.trigger - target))
        room = target - head - kept_tokens - tail + extra
        # the strategy's floor, scaled to what the fixed part leaves of the trigger
        share = int(_FLOOR_SHARE * max(0, budget.trigger - head_fixed - kept_tokens))
        floor = min(floor_tokens, max(_FLOOR_MIN, share))
        if k == len(options) - 1 or (
            head + kept_tokens + tail <= target * _TAIL_SHARE and room >= floor
        ):
            break
        k += 1
    overrides: Overrides = {}
    if room < floor:  # make room: the largest tool outputs of older kept turns first
        overrides = shrink_tail(history, cut, c, floor - room, tool_only=True,
                                pins=pinned_all, lookup=pins, newest=False)
        room += _saved(history, overrides)
    goal = target + extra
    if room < floor:
        # The target is a goal, not a limit: the newest turn stays whole and the
        # strategy keeps its floor (over the target, at most _FLOOR_SHARE of what the
        # fixed part leaves of the trigger) as long as the trigger is met.
        used = goal - room
        grant = max(room, min(floor, share))
        if used + grant <= budget.trigger:
            room, goal = grant, used + grant
        else:  # last resort: the newest turn's tool output too, down to the target
            overrides = shrink_tail(history, cut, c, floor - room + extra, tool_only=True,
                                    pins=pinned_all, lookup=pins, overrides=overrides)
            room = target - head - kept_tokens - tail + _saved(history, overrides)
            goal, folds = target, tuple(f for f in folds if f[0] not in overrides)
    # pins are bounded: the newest pinned text of the span up to the pin budget
    span_pins = [i for i in pinned_all if i < cut and i not in kept]
    pinned, unpinned = bound_pins(
        span_pins, {i: pins.text(msgs[i])[1] for i in span_pins},
        int(PIN_SHARE * budget.target_for(head_fixed + kept_tokens)))
    return Plan(
        c=c, head_len=head_len, span_start=prev_cut, cut=cut, kept=kept,
        pinned=pinned, pins=tuple(i for i in pinned_all if i not in unpinned),
        unpinned=unpinned, recent_turns=kept_turns[cut], target=goal,
        budget_tokens=max(0, room),
        overrides=tuple(sorted(overrides.items())), reason=reason, level=level,
        before=State(entry).tokens_at(history, c), folds=folds,
        fixed_part=head_fixed + kept_tokens,
    )


def _thinking_safe(cuts: list[int], history: History, c: int) -> list[int]:
    """The cuts that keep the thinking-loop rule: when the tool loop running at ``c``
    starts with thinking, a cut inside it must land on a message starting with thinking."""
    msgs, dialect = history.messages, history.dialect
    start = history.loop_start(c)
    if start is None or not starts_with_thinking(msgs[start], dialect):
        return cuts
    # not even at ``c`` itself: the loop's next steps would follow the compaction message
    return [s for s in cuts if s <= start or (s < c and starts_with_thinking(msgs[s], dialect))]


def _saved(history: History, overrides: Overrides) -> int:
    """Tokens the truncated copies in ``overrides`` save over the messages they replace."""
    return sum(history.tokens[i] - t for i, (_, _, t) in overrides.items())


def _with_partners(dialect: Dialect, msgs: Sequence[Any], kept: tuple[int, ...], lo: int,
                   hi: int) -> tuple[int, ...]:
    """``kept`` and, among ``msgs[lo:hi]``, every message that answers a tool call of a
    kept one or issues a call a kept one answers (and theirs, in turn): a message kept
    verbatim (an opaque one, with a block type no dialect models, may issue calls) keeps
    its calls paired, where rendering its partner into compaction text would leave a
    call without its result, or a result without its call."""
    calls, results = dialect.tool_call_ids, dialect.tool_result_ids
    todo = [i for i in kept if calls(msgs[i]) or results(msgs[i])]
    if not todo:
        return kept
    issued: dict[str, list[int]] = {}  # ref -> the messages of [lo, hi) issuing it
    answered: dict[str, list[int]] = {}  # ref -> those answering it
    for j in range(lo, hi):
        for ref in calls(msgs[j]):
            issued.setdefault(ref, []).append(j)
        for ref in results(msgs[j]):
            answered.setdefault(ref, []).append(j)
    out = set(kept)
    while todo:
        i = todo.pop()
        partners = [j for ref in calls(msgs[i]) for j in answered.get(ref, ()) if j > i]
        partners += [j for ref in results(msgs[i]) for j in issued.get(ref, ()) if j < i]
        for j in partners:
            if j not in out:
                out.add(j)
                todo.append(j)
    return tuple(sorted(out))


def _foldable(history: History, start: int, c: int, pins: Sequence[int]) -> list[int]:
    """The tool outputs of the newest turn ``[start, c)`` the fold would truncate once
    the agent has read them: over ``TRUNCATABLE_TOKENS`` (the cliff strategy archives
    those originals), not pinned."""
    msgs, dialect = history.messages, history.dialect
    return [i for i in range(start, c) if history.tokens[i] > TRUNCATABLE_TOKENS
            and i not in pins and not kept_type(dialect, msgs[i])
            and history.role(i) == "tool"]


def shrink_tail(history: History, cut: int, c: int, excess: int, *, tool_only: bool,
                lookup: PinLookup, pins: Sequence[int] = (),
                overrides: Overrides | None = None, newest: bool = True) -> Overrides:
    """Head+tail truncate the largest kept messages of ``[cut, c)`` until ``excess``
    tokens are saved: messages of older kept turns first, the newest turn last (with
    ``newest``; never without); instructions, opaque items and compaction messages
    never, ``pins`` only where their pinned text stays whole."""
    out = dict(overrides or {})
    start = history.newest_turn(cut, c)
    msgs, dialect, tokens = history.messages, history.dialect, history.tokens
    groups = (range(cut, start), range(start, c)) if newest else (range(cut, start),)
    for group in groups:
        for _ in range(3):  # a truncation may land a little over: refine
            size = {i: out[i][2] if i in out else tokens[i] for i in group}
            saved = 0
            for i in sorted(group, key=lambda i: -size[i]):
                current = size[i]
                if excess <= 0 or current <= TRUNCATABLE_TOKENS // 2:
                    break
                if tokens[i] <= TRUNCATABLE_TOKENS or kept_type(dialect, msgs[i]):
                    continue
                if tool_only and history.role(i) != "tool":
                    continue
                keep_tokens = max(TRUNCATABLE_TOKENS // 2, current - excess)
                copy, new_tokens = shrink(history, msgs[i], tokens[i], keep_tokens)
                if copy is msgs[i] or new_tokens >= current:
                    continue
                if i in pins and not lookup.keeps_pinned(msgs[i], copy):
                    continue  # the parts beside a pin may be cut, its text never
                out[i] = (history.digests[i], copy, new_tokens)
                excess -= current - new_tokens
                saved += current - new_tokens
            if excess <= 0 or not saved:
                break
    return out


def shrink(history: History, message: Any, tokens: int, keep_tokens: int) -> tuple[Any, int]:
    """Head+tail truncate ``message`` to about ``keep_tokens`` (a few refinements)."""
    dialect = history.dialect
    try:
        chars = max(200, len(dialect.text_of(message)) * keep_tokens // max(tokens, 1))
        copy, size = message, tokens
        for _ in range(4):
            copy = dialect.truncate(message, chars)
            size = history.meter.count(copy) if copy is not message else tokens
            if size <= keep_tokens or chars <= 200:
                break
            chars = max(200, chars * keep_tokens // size - 16)
    except Exception:  # a message the dialect cannot truncate stays as it is
        return message, tokens
    return copy, size
