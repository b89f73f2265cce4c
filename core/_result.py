"""What a compaction call returns, and its assembly from what the pipeline found.

:func:`assemble` is the pipeline's last step: the messages to send (the stored prefix in
force substituted), the token figures, the events reported to the observers, and the
strict check of the limit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from ._budget import Budget
from ._events import CompactionEvent
from ._history import History
from ._observers import Observers
from ._plan import State
from .errors import OverBudgetError

__all__ = ["CompactionResult", "Outcome", "assemble"]


@dataclass
class CompactionResult:
    """What ``Engine.compact`` returns.

    ``messages`` is the list to send. ``compacted`` is true when this call performed a
    compaction; ``modified`` when ``messages`` differs from the input at all (a stored
    compacted prefix was substituted). ``tokens_original`` is the input history,
    ``tokens_before`` what would have been sent without a new compaction,
    ``tokens_after`` what is sent. A call whose byte bound is under the trigger compacts
    nothing without tokenizing its new messages: its figures are counted when first read
    (the same numbers; the result is then a private subclass, equal to the plain result).
    """

    messages: list[Any]
    compacted: bool
    modified: bool
    tokens_original: int
    tokens_before: int
    tokens_after: int
    over_budget: bool = False
    event: CompactionEvent | None = None
    events: list[CompactionEvent] = field(default_factory=list)
    head_len: int = 0
    cut: int = 0

    @property
    def saved_tokens(self) -> int:
        return self.tokens_original - self.tokens_after


def _counted_when_read(name: str) -> property:
    """A token figure of :class:`_DeferredResult`: counted (exactly) when first read."""

    def get(self: _DeferredResult) -> int:
        if "_count" in self.__dict__:
            self.__dict__["_values"].update(self.__dict__.pop("_count")())
        value: int = self.__dict__["_values"][name]
        return value

    def put(self: _DeferredResult, value: int) -> None:
        if "_count" in self.__dict__:
            get(self)
        self.__dict__.setdefault("_values", {})[name] = value

    return property(get, put)


class _DeferredResult(CompactionResult):
    """The result of a call that compacted nothing because the bound of what it sends
    (:meth:`MessageMeter.bound`: a byte per token at most for the messages never counted)
    is under the trigger: the new messages are counted when a token figure is first read
    (the same numbers as counted at once), or by the call that needs their counts. A
    copy or a pickle is a plain :class:`CompactionResult` with the figures counted."""

    tokens_original = _counted_when_read("tokens_original")
    tokens_before = _counted_when_read("tokens_before")
    tokens_after = _counted_when_read("tokens_after")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return CompactionResult, self._values_of()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompactionResult):
            return NotImplemented
        return self._values_of() == tuple(getattr(other, f.name)
                                          for f in fields(CompactionResult))

    __hash__ = None  # type: ignore[assignment]  # as CompactionResult's (eq, not frozen)

    def _values_of(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(CompactionResult))


@dataclass(frozen=True)
class Outcome:
    """What the pipeline hands to "assemble": the history, the tokens that would have been
    sent, the state (stored entry in force) and the compaction events."""

    history: History
    before: int
    state: State
    events: tuple[CompactionEvent, ...]


def assemble(outcome: Outcome, *, budget: Budget, strict: bool, observers: Observers,
             resolve: Callable[..., History]) -> CompactionResult:
    """The result of a call: what it sends, its figures, its events reported to
    ``observers``; ``OverBudgetError`` when ``strict`` and over the limit. A call that
    compacted nothing under the trigger by the bound is counted by ``resolve`` (the
    scope's :meth:`~agentcompact._scope.StoreScope.history`) when a figure is read."""
    history, state, events = outcome.history, outcome.state, list(outcome.events)
    n = len(history.messages)
    if history.pending:  # nothing compacted, within the trigger (so the limit) by the bound
        entry = state.entry
        result = _DeferredResult(
            messages=state.messages_at(history, n), compacted=False,
            modified=entry is not None, tokens_original=0, tokens_before=0,
            tokens_after=0, head_len=entry.head_len if entry else 0,
            cut=entry.cut if entry else 0)
        result.__dict__["_count"] = functools.partial(_figures, resolve, history, state)
        return result
    original = history.prefix[n] + history.fixed
    entry = state.entry
    out = state.messages_at(history, n)
    after = state.tokens_at(history, n)
    compacted = False
    if events:
        compacted = any(e.fallback != "none" for e in events)
        observers.report(events)
    over = after > budget.limit
    if over and strict:
        raise OverBudgetError(
            f"context is {after} tokens after compaction, over the limit "
            f"{budget.limit}", after, budget.limit)
    return CompactionResult(
        messages=out, compacted=compacted, modified=entry is not None,
        tokens_original=original, tokens_before=outcome.before, tokens_after=after,
        over_budget=over, event=events[-1] if events else None, events=events,
        head_len=entry.head_len if entry else 0, cut=entry.cut if entry else 0,
    )


def _figures(resolve: Callable[..., History], history: History, state: State
             ) -> dict[str, int]:
    """The token figures of a call that compacted nothing (:class:`_DeferredResult`),
    its history counted by ``resolve`` (the scope's ``history``)."""
    history = resolve(history, resolve=True)
    n = len(history.messages)
    after = state.tokens_at(history, n)
    return {"tokens_original": history.prefix[n] + history.fixed, "tokens_before": after,
            "tokens_after": after}
