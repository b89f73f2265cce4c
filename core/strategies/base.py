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

from ..events import DroppedItem

if TYPE_CHECKING:
    import pluggy

    from ..dialects.base import Dialect
    from ..tokens import MessageMeter

__all__ = ["CompactionRequest", "Rendered", "Strategy"]


@dataclass(frozen=True)
class CompactionRequest:
    """One compaction to render.

    ``messages`` is the original history up to the call being compacted. The span this
    cycle compacts is ``messages[span_start:cut]``; ``messages[head_len:span_start]`` was
    compacted by earlier cycles (a strategy may carry its human messages forward: they are
    original content). ``budget_tokens`` is the size the rendered message should fit in
    (it may be small or zero when the kept turns are large). ``level`` is the escalation
    level to start from (a reactive retry after a provider overflow starts higher).
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

    def pinned(self, index: int) -> bool:
        """True when a plugin pins ``messages[index]`` (``agentcompact_pin``)."""
        if not self.pins_possible:
            return False
        results = self.pm.hook.agentcompact_pin(
            message=self.messages[index], index=index, dialect=self.dialect
        )
        return any(r is True for r in results)

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
    name: str

    def compact(self, request: CompactionRequest) -> Rendered: ...
