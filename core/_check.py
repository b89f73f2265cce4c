"""Check a rendering against its plan: the one step every rung's output passes.

:func:`check` turns a plan and a rendered compaction message into the entry to store and
names the problem that rejects it, for any strategy; :func:`validity` is the dialect and
thinking-loop part alone (the fold uses it too). :func:`safe_render` is the last rung: a
compaction message of the pinned text only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ._events import CompactionEvent, DroppedItem
from ._history import History
from ._markers import COMPACTION_HEADER
from ._pins import PinLookup
from ._plan import Plan, State, shrink_tail
from ._store import PrefixEntry
from ._turns import problems, thinking_loop_error
from .errors import AgentCompactError
from .strategies._base import Rendered

if TYPE_CHECKING:
    from ._budget import Budget

__all__ = ["Checked", "check", "compaction_event", "describe_error", "safe_render", "validity"]


@dataclass(frozen=True)
class Checked:
    """Outcome of "check" for one rung: the entry, and the problem that rejects it."""

    entry: PrefixEntry | None
    rung: str
    rendered: Rendered | None
    problem: str | None


def describe_error(exc: BaseException) -> str:
    """An error for events and logs: its type, and its message only for agentcompact's own
    errors (which name the problem by index, type or field, never by content). A foreign
    exception's message may quote the history: it is left out."""
    if isinstance(exc, AgentCompactError):
        return f"{type(exc).__name__}: {exc}"
    where = ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:  # where it was raised: a function and a line, never a value
        code = tb.tb_frame.f_code
        where = f" in {code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno})"
    return f"{type(exc).__name__}{where} (message withheld: it may quote the history)"


def check(history: History, plan: Plan, rendered: Rendered, *, budget: Budget,
          pins: PinLookup, rung: str, name: str, trusted: bool) -> Checked:
    """The invariants, for any strategy: the assembled output passes the dialect's
    rules (problems inherited from the input aside) and the thinking-loop rule, the
    pinned text of every pin within the pin budget is in the compaction message
    verbatim, the message is within its budget (that pinned text aside), and no kept
    message's pinned text was cut. ``trusted``: take the rendering's token count (the
    engine's own renderings), else count the message; ``name`` goes into the entry."""
    message = rendered.message
    dialect = history.dialect
    try:  # the engine counts a third-party strategy's message itself
        tokens = 0 if message is None else (
            rendered.tokens if trusted else history.meter.count(message))
        text = dialect.text_of(message) if message is not None and plan.pinned else ""
    except Exception as exc:
        return Checked(None, rung, rendered,
                       f"the compaction message cannot be read: {describe_error(exc)}")
    entry = PrefixEntry(plan.head_len, plan.cut, message, tokens, name, rendered.level,
                        dict(plan.overrides), plan.kept, plan.folds)
    entry = _truncate_tail(history, entry, plan, budget, pins)
    out = State(entry).messages_at(history, plan.c)
    problem = validity(history, out, plan.c)
    if problem is None:
        for i in plan.pinned:
            try:
                texts = pins.text(history.messages[i])[0]
            except Exception:
                texts = ("",)
            if message is None or not all(t in text for t in texts):
                problem = f"pinned message {i} is not in the compaction message verbatim"
                break
    if problem is None and message is not None:
        pinned = sum(pins.text(history.messages[i])[1] for i in plan.pinned)
        allowed = plan.budget_tokens + pinned + max(64, plan.budget_tokens // 4)
        if tokens > allowed:
            problem = (f"the compaction message is {tokens} tokens, over its budget of "
                       f"{plan.budget_tokens}")
    return Checked(entry, rung, rendered, problem)


def validity(history: History, out: list[Any], c: int) -> str | None:
    """The problem of ``out`` (sent for ``history.messages[:c]``) the dialect's rules or
    the thinking-loop rule name, problems ``messages[:c]`` already had aside."""
    dialect = history.dialect
    found = problems(out, dialect, allow_pending=True)
    if found:
        inherited = {key for key, _ in problems(history.messages[:c], dialect,
                                                allow_pending=True)}
        new = [exc for key, exc in found if key not in inherited]
        if new:
            return f"output failed validation: {new[0]}"
    if dialect.thinking_loops():
        return thinking_loop_error(history.messages, c, out, dialect,
                                   start=history.loop_start(c))
    return None


def safe_render(history: History, plan: Plan, pins: PinLookup) -> Rendered:
    """The plain safe cut: a compaction message holding only the pinned text of the
    pins within the pin budget, verbatim (every other original message of the span is
    dropped)."""
    pieces = [COMPACTION_HEADER]
    dropped = sum(1 for i in range(plan.head_len, plan.cut) if i not in plan.kept
                  and i not in plan.pinned)
    if dropped:
        pieces.append(f"\n\n[… {dropped} earlier messages omitted …]")
    for i in plan.pinned:
        try:
            texts = list(pins.text(history.messages[i])[0])
        except Exception:  # unreadable: the pin check names it
            texts = []
        pieces.append("\n\n[pinned message, verbatim]\n" + "\n".join(texts))
    text = "".join(pieces)
    return Rendered(history.dialect.text_message(text), history.meter.count_text_message(text))


def _truncate_tail(history: History, entry: PrefixEntry, plan: Plan, budget: Budget,
                   pins: PinLookup) -> PrefixEntry:
    """Last resort: head+tail truncate the largest kept messages until under the plan's
    goal; the newest turn's only over the trigger or when the plan truncated it
    already (it alone left the strategy no room under the trigger)."""
    total = State(entry).tokens_at(history, plan.c)
    excess = total - plan.target
    if excess <= 0:
        return entry
    start = history.newest_turn(entry.cut, plan.c)
    newest = total > budget.trigger or any(i >= start for i in entry.overrides)
    overrides = shrink_tail(history, entry.cut, plan.c, excess, tool_only=False,
                            pins=plan.pins, lookup=pins, overrides=entry.overrides,
                            newest=newest)
    return replace(entry, overrides=overrides)


def compaction_event(history: History, plan: Plan, checked: Checked | None, errors: list[str],
                     t0: float, *, strategy: str, limit: int, episode_id: str | None
                     ) -> CompactionEvent:
    """The event of one compaction: what the accepted rung (``checked``; ``None``: every
    rung failed) sends against what would have been sent, what it dropped and truncated,
    and the errors of the rungs before it."""
    entry = checked.entry if checked is not None else None
    rung = checked.rung if checked is not None else "none"
    rendered = checked.rendered if checked is not None else None
    dropped = list(rendered.items) if rendered is not None and entry is not None else []
    after = State(entry).tokens_at(history, plan.c) if entry is not None else plan.before
    if entry is not None:
        for idx, (_, _, tokens) in sorted(entry.overrides.items()):
            dropped.append(DroppedItem(idx, history.role(idx),
                                       "truncated", history.tokens[idx] - tokens))
    n = len(history.messages)
    n_after = (plan.head_len + len(entry.kept) + (entry.message is not None) + n - plan.cut
               if entry is not None else n)
    event = CompactionEvent(
        strategy=strategy, dialect=history.dialect.name,
        tokens_before=plan.before, tokens_after=after, messages_before=n,
        messages_after=n_after, head_len=plan.head_len, cut=plan.cut, reason=plan.reason,
        level=entry.level if entry else 0, recent_turns=plan.recent_turns,
        over_budget=after > limit, latency_s=time.perf_counter() - t0,
        error="; ".join(errors) if errors else None,
        fallback=None if rung == "strategy" else rung, dropped=dropped,
        episode_id=episode_id, unpinned=list(plan.unpinned),
    )
    if rendered is not None and entry is not None:
        event.errors = [str(e) for e in (getattr(rendered, "errors", None) or [])]
    return event
