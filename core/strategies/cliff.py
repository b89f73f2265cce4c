"""The cliff strategy: verbatim-only compaction.

Head verbatim + one compaction message rendering the span by content class + recent turns
verbatim (the engine keeps head and turns). The compaction message only quotes and cuts:
human text verbatim; tool calls as one-line signatures ``[tool call NAME] ARGS``; tool
results kept when short, otherwise head+tail truncated (or dropped at the last level);
assistant text kept or capped; thinking kept capped, then dropped. Everything that is not
a marker (text in ``[…]`` that agentcompact writes) is a substring of an original message.

Human messages of *all* earlier cycles are carried forward (``carry_forward_human``): they
are original content, so this is not a compaction of a compaction. When the rendering is
over its budget the strategy escalates through ``levels`` (tighter caps), then drops the
oldest items (human ones last; pinned ones never).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from typing import Any

from ..dialects.base import Part, head_tail_spans
from ..errors import PluginError
from ..events import DroppedItem
from ..markers import COMPACTION_HEADER, elision
from ..tokens import MESSAGE_OVERHEAD
from .base import CompactionRequest, Rendered

__all__ = ["CliffLevel", "CliffStrategy", "Seg", "render_segments"]

Seg = tuple[bool, str]
"""A piece of rendered text: (verbatim?, text). Verbatim pieces are quoted originals."""

_HUMAN_ROLES = frozenset({"user", "system", "developer"})
_LABELS = {"user": "[user]", "assistant": "[assistant]", "tool": "[tool result]",
           "system": "[system]", "developer": "[developer]"}


@dataclass(frozen=True)
class CliffLevel:
    """Caps (characters; 0 drops the class) at one escalation level."""

    human_max: int = 20_000
    assistant_max: int = 2_000
    thinking_max: int = 600
    call_args_max: int = 300
    result_keep: int = 500
    result_max: int = 600


DEFAULT_LEVELS = (
    CliffLevel(),
    CliffLevel(assistant_max=300, thinking_max=0, call_args_max=150, result_keep=200,
               result_max=200),
    CliffLevel(human_max=4_000, assistant_max=120, thinking_max=0, call_args_max=80,
               result_keep=100, result_max=0),
)


@dataclass
class CliffStrategy:
    """Verbatim-only compaction (see module docstring)."""

    levels: tuple[CliffLevel, ...] = DEFAULT_LEVELS
    carry_forward_human: bool = True
    name: str = field(default="cliff", init=False)

    def compact(self, request: CompactionRequest) -> Rendered:
        items = _collect(request, self.carry_forward_human)
        rates = _token_rates(request, items)
        counter = request.meter.counter
        header_tokens = counter.count_texts([COMPACTION_HEADER])[0] + MESSAGE_OVERHEAD
        budget = request.budget_tokens - header_tokens
        level = min(request.level, len(self.levels) - 1)
        while True:
            blocks = [_render_item(request, item, self.levels[level]) for item in items]
            sizes = [_estimate(block, rate) for block, rate in zip(blocks, rates)]
            total = sum(sizes) + len(blocks)
            if total <= budget or level == len(self.levels) - 1:
                break
            level += 1
        # Sizes are estimated from each original's tokens per character; the exact count
        # of the assembled message corrects the estimate (a few refits at most).
        fit_budget = budget
        for _ in range(4):
            keep = _fit(items, sizes, fit_budget) if total > fit_budget else [True] * len(items)
            text = "".join(t for _, t in _assemble(blocks, keep))
            tokens = request.meter.count_text_message(text)
            if tokens <= request.budget_tokens or not any(keep):
                break
            fit_budget = int(fit_budget * request.budget_tokens / tokens) - 8
        message = request.dialect.text_message(text)
        return Rendered(message, tokens, level, _report(request, items, blocks, keep))


def _token_rates(request: CompactionRequest, items: Sequence[_Item]) -> list[float]:
    """Tokens per character of each item's original message (from cached counts)."""
    measured = request.meter.measure([request.messages[it.index] for it in items]).tokens
    rates = []
    for item, tokens in zip(items, measured):
        chars = sum(len(p.text) + len(p.name) for p in item.parts)
        rates.append(tokens / chars if chars else 0.3)
    return rates


def _estimate(block: Sequence[Seg], rate: float) -> int:
    chars = sum(map(len, map(itemgetter(1), block)))
    return int(chars * max(rate, 0.2)) + 2 if chars else 0


@dataclass(frozen=True)
class _Item:
    index: int
    role: str
    parts: tuple[Part, ...]
    pinned: bool
    carried: bool
    override: tuple[str, ...] | None  # parts from the render_message hook


def _collect(request: CompactionRequest, carry: bool) -> list[_Item]:
    """The messages to render: the span, and from earlier cycles the pinned messages and
    (with ``carry``) the human ones."""
    dialect = request.dialect
    pins = request.pins_possible
    hooks = bool(request.pm.hook.agentcompact_render_message.get_hookimpls())
    items: list[_Item] = []
    indices = list(request.earlier())
    for i in [*indices, *request.span()]:
        message = request.messages[i]
        if dialect.is_synthetic(message):
            continue  # never compact a compaction
        role = dialect.role(message)
        carried = i < request.span_start
        pinned = pins and request.pinned(i)
        if carried and not pinned and (not carry or role not in _HUMAN_ROLES):
            continue  # earlier cycles: only human messages and pinned ones are carried
        parts = tuple(dialect.parts(message))
        if carried and not pinned and not any(p.kind == "text" and p.text for p in parts):
            continue  # ... with some text
        override = _hook_render(request, message) if hooks else None
        items.append(_Item(i, role, parts, pinned, carried, override))
    return items


def _hook_render(request: CompactionRequest, message: Any) -> tuple[str, ...] | None:
    result = request.pm.hook.agentcompact_render_message(
        message=message, dialect=request.dialect, settings={"strategy": "cliff"}
    )
    if result is None:
        return None
    texts = [p.text for p in request.dialect.parts(message) if p.text]
    for piece in result:
        if not isinstance(piece, str) or not any(piece in t for t in texts):
            raise PluginError(
                "agentcompact_render_message returned text that is not quoted from the "
                f"message: {str(piece)[:80]!r}"
            )
    return tuple(result)


def _cap(text: str, limit: int, inline: bool = False) -> list[Seg]:
    head, omitted, tail = head_tail_spans(text, limit)
    if not omitted:
        return [(True, text)]
    return [(True, head), (False, elision(omitted, inline)), (True, tail)]


def _render_part(part: Part, role: str, caps: CliffLevel, pinned: bool) -> list[Seg]:
    if pinned and part.text:
        return [(True, part.text)]
    kind = part.kind
    if kind == "text" and part.text:
        limit = caps.human_max if role in _HUMAN_ROLES else caps.assistant_max
        return _cap(part.text, limit) if limit else []
    if kind == "thinking" and part.text and caps.thinking_max:
        return [(False, "[thinking] "), *_cap(part.text, caps.thinking_max)]
    if kind == "tool_call":
        args = _cap(part.text, caps.call_args_max, inline=True) if part.text else []
        return [(False, "[tool call "), (True, part.name), (False, "] "), *args]
    if kind == "tool_result":
        if len(part.text) <= caps.result_keep:
            return [(True, part.text)] if part.text else []
        if not caps.result_max:
            return [(False, f"[tool result omitted: {len(part.text)} chars]")]
        return _cap(part.text, caps.result_max)
    if kind == "image":
        return [(False, "[image omitted]")]
    return []


def _render_item(request: CompactionRequest, item: _Item, caps: CliffLevel) -> list[Seg]:
    label = _LABELS.get(item.role, f"[{item.role}]")
    if item.override is not None:
        body: list[Seg] = []
        for piece in item.override:
            body += [(True, piece), (False, "\n")]
        return [(False, label + "\n"), *body[:-1]] if body else []
    out: list[Seg] = [(False, label + "\n")]
    for part in item.parts:
        segs = _render_part(part, item.role, caps, item.pinned)
        if segs:
            if len(out) > 1:
                out.append((False, "\n"))
            out.extend(segs)
    return out if len(out) > 1 else []


def _fit(items: Sequence[_Item], sizes: Sequence[int], budget: int) -> list[bool]:
    """Drop oldest items until the rest fits: non-human first, human next, pinned never."""
    keep = [bool(s) for s in sizes]
    total = sum(s + 1 for s, k in zip(sizes, keep) if k)
    for humans in (False, True):
        for i, item in enumerate(items):
            if total <= budget:
                return keep
            if keep[i] and not item.pinned and (item.role in _HUMAN_ROLES) == humans:
                keep[i] = False
                total -= sizes[i] + 1
    return keep


def _assemble(blocks: Sequence[list[Seg]], keep: Sequence[bool]) -> list[Seg]:
    out: list[Seg] = [(False, COMPACTION_HEADER)]
    dropped = sum(1 for b, k in zip(blocks, keep) if b and not k)
    if dropped:
        out.append((False, f"\n\n[… {dropped} earlier items omitted …]"))
    for block, k in zip(blocks, keep):
        if block and k:
            out.append((False, "\n\n"))
            out.extend(block)
    return out


def _report(
    request: CompactionRequest, items: Sequence[_Item], blocks: Sequence[list[Seg]],
    keep: Sequence[bool],
) -> list[DroppedItem]:
    tokens = request.meter.measure([request.messages[it.index] for it in items]).tokens
    report = []
    for item, block, k, n in zip(items, blocks, keep, tokens):
        if not (block and k):
            action = "dropped"
        elif any(not verbatim and "omitted" in text for verbatim, text in block):
            action = "truncated"
        else:
            action = "rendered"
        kind = item.parts[0].kind if item.parts else "other"
        report.append(DroppedItem(item.index, item.role, action, n, kind))
    return report


def render_segments(request: CompactionRequest, level: int = 0,
                    strategy: CliffStrategy | None = None) -> list[Seg]:
    """The rendering at ``level`` as segments, nothing dropped (for provenance checks)."""
    strategy = strategy or CliffStrategy()
    items = _collect(request, strategy.carry_forward_human)
    blocks = [_render_item(request, it, strategy.levels[level]) for it in items]
    return _assemble(blocks, [True] * len(blocks))


def settings_dict(strategy: CliffStrategy) -> dict[str, Any]:
    return {"levels": [asdict(level) for level in strategy.levels],
            "carry_forward_human": strategy.carry_forward_human}


