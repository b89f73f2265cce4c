"""What the engine hands a strategy, and what it expects back.

The engine decides *where* to cut (head, span, kept turns) and keeps every invariant
(turn boundaries, prefix store, validation, fail-open); a strategy only builds the one
message that stands for the compacted span, from **original** messages, within a token
budget. A strategy is any object with ``name`` and ``compact(request) -> Rendered``; an
``async def acompact(request)`` is used by ``Engine.acompact`` when present.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._events import DroppedItem
from .._history import History, history_of
from .._pins import pinned_texts

if TYPE_CHECKING:
    import pluggy

    from .._tokens import MessageMeter
    from ..dialects._base import Dialect

__all__ = ["TRUNCATABLE_TOKENS", "CompactionRequest", "Rendered", "Strategy"]

#: tokens: a kept message over this many the engine may head+tail truncate (to make room,
#: or to fold a read tool output), and the strategy archives its originals so the handle a
#: truncation names can be expanded. One value for both sides: an engine truncating below
#: what the strategy archives would name handles nothing can find.
TRUNCATABLE_TOKENS = 1_000


@dataclass(frozen=True)
class CompactionRequest:
    """One compaction to render.

    ``messages`` is the original history up to the call being compacted. The span this
    cycle compacts is ``messages[span_start:cut]``; ``messages[head_len:span_start]`` was
    compacted by earlier cycles (a strategy may carry its human messages forward: they are
    original content). ``budget_tokens`` is the size the rendered message should fit in
    (the engine moves the cut until it is at least the strategy's ``min_budget_tokens``
    when it can). ``level`` is the escalation level to start from (a reactive retry after
    a provider overflow starts higher).

    What the engine checks on every rendered message, for any strategy: the output passes
    the dialect's rules and the thinking-loop rule, the pinned text of every pin of the span
    (:meth:`pinned_text`) is in it verbatim, the message is within its budget (pinned text
    aside), and the kept messages are there. A rendering that fails falls back (cliff, then
    a plain cut).
    """

    messages: Sequence[Any]
    dialect: Dialect
    head_len: int
    span_start: int
    cut: int
    budget_tokens: int
    meter: MessageMeter
    pm: pluggy.PluginManager
    level: int = 0
    episode_id: str | None = None
    reason: str = "trigger"
    kept: frozenset[int] = frozenset()
    """Indices of ``[head_len, cut)`` the engine sends verbatim as their own messages
    (instructions, items the dialect does not model, compaction messages fed back in):
    a strategy leaves them out of its message (:meth:`keeps`)."""
    pins: frozenset[int] | None = None
    """Indices the engine found pinned (``agentcompact_pin``) when it planned the cut, of
    the messages from ``head_len`` on that are not synthetic; ``None`` (a request built
    elsewhere): :meth:`pinned` asks the hook. Pins past the pin budget are not in it
    (:attr:`unpinned`)."""
    unpinned: frozenset[int] = frozenset()
    """Pins of the span past the pin budget, the oldest (``agentcompact._pins``): a strategy
    renders them like any other message; the cliff strategy keeps at least their skim
    line."""
    history: History | None = field(default=None, repr=False, compare=False)
    """The engine's facts of the whole history the messages are a prefix of
    (``agentcompact._history.History``: digests, token counts, prefix sums, turn starts),
    so a strategy reads them instead of deriving them again; ``None`` for a request built
    elsewhere (:attr:`known_history` then makes one of :attr:`messages`)."""

    def keeps(self, index: int) -> bool:
        """True when the engine itself sends ``messages[index]`` verbatim: render nothing
        of it (never flatten an instruction into compaction text)."""
        return index in self.kept

    def pinned(self, index: int) -> bool:
        """True when a plugin pins ``messages[index]`` (``agentcompact_pin``) and it is not
        past the pin budget (:attr:`unpinned`), from :attr:`pins` when the engine filled
        it."""
        if self.pins is not None:
            return index in self.pins
        if not self.pins_possible or index in self.unpinned:
            return False
        results = self.pm.hook.agentcompact_pin(
            message=self.messages[index], index=index, dialect=self.dialect
        )
        return any(r is True for r in results)

    def pinned_text(self, index: int) -> tuple[str, ...]:
        """The text a pin of ``messages[index]`` keeps verbatim: what the user typed, not
        the tool results or harness text beside it (``agentcompact._pins.pinned_texts``).
        A strategy quotes each piece verbatim; the engine checks it."""
        return pinned_texts(self.dialect, self.messages[index])

    @cached_property
    def known_history(self) -> History:
        """:attr:`history`, or for a request built elsewhere the history of :attr:`messages`
        on its own (``agentcompact._history.history_of``, made once): where a strategy
        reads the per-message facts (role, parts, tool calls and results, turn starts)."""
        if self.history is not None:
            return self.history
        return history_of(self.messages, self.meter, self.dialect)

    @cached_property
    def pins_possible(self) -> bool:
        """False when no plugin implements ``agentcompact_pin`` (nothing can be pinned)."""
        return bool(self.pm.hook.agentcompact_pin.get_hookimpls())

    def span(self) -> range:
        return range(self.span_start, self.cut)

    def earlier(self) -> range:
        return range(self.head_len, self.span_start)


@dataclass
class Rendered:
    """A strategy's output: the compaction message (``None``: no message at all).

    ``errors`` lists partial failures the strategy recovered from (e.g. a parallel block
    whose summary failed and was rendered verbatim); the engine copies them to
    ``CompactionEvent.errors``. They never go into the message.
    """

    message: Any
    tokens: int
    level: int = 0
    items: list[DroppedItem] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@runtime_checkable
class Strategy(Protocol):
    """``name`` and ``compact``. Optional: ``acompact`` (async), ``min_budget_tokens``
    (the smallest ``budget_tokens`` it can work with: the engine keeps fewer recent turns
    or truncates the largest kept tool output to give it that room) and ``fingerprint``
    (a string naming its settings, part of the prefix-store key; default: its repr)."""

    name: str

    def compact(self, request: CompactionRequest) -> Rendered: ...
