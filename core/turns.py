"""Head and turns, and the validity rules every output must pass.

The head is everything before the first message the model produced (system prompt, task
statement). A turn is a run of model-produced messages (an assistant message; in the
Responses API its reasoning, message and call items) plus the observations that follow
it (tool results, user messages) up to the next run. Cuts happen only between turns, so a
tool call is never separated from its result, parallel calls stay together, and signed
thinking stays in its tool loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ValidationError

if TYPE_CHECKING:
    from .dialects.base import Dialect

__all__ = ["Turns", "split_turns", "validate"]


@dataclass(frozen=True, slots=True)
class Turns:
    """``head_len`` leading messages, then turns starting at ``starts`` (ascending)."""

    head_len: int
    starts: tuple[int, ...]
    size: int

    def end(self, k: int) -> int:
        """Index one past the last message of turn ``k``."""
        return self.starts[k + 1] if k + 1 < len(self.starts) else self.size

    def __len__(self) -> int:
        return len(self.starts)


def split_turns(messages: Sequence[Any], dialect: Dialect, start: int = 0) -> Turns:
    """Group ``messages`` (from index ``start``, the head) into head and turns."""
    is_model = dialect.is_model_output
    starts: list[int] = []
    previous_model = False
    for i in range(start, len(messages)):
        model = is_model(messages[i])
        if model and not previous_model:
            starts.append(i)
        previous_model = model
    head_len = starts[0] if starts else len(messages)
    return Turns(head_len, tuple(starts), len(messages))


def validate(messages: Sequence[Any], dialect: Dialect, *, allow_pending: bool = False) -> None:
    """Raise ``ValidationError`` when ``messages`` would be refused by the provider.

    Checks each message's shape, the dialect's role order, and tool pairing: every tool
    result answers a call issued earlier and not yet answered (no orphan), and every call
    is answered before the model speaks again (and before the end, unless
    ``allow_pending``: an agent state may end with calls not yet run).
    """
    for i, message in enumerate(messages):
        dialect.check_shape(message, i)
    dialect.check_order(messages)
    pending: dict[str, int] = {}
    previous_model = False
    for i, message in enumerate(messages):
        model = dialect.is_model_output(message)
        if model and not previous_model and pending:
            _unanswered(pending, dialect, i)
        for ref in dialect.tool_result_ids(message):
            if ref not in pending:
                raise ValidationError(
                    f"{dialect.name}: message {i} answers tool call {ref!r}, which no "
                    "earlier message issued (orphan tool result)", i)
            del pending[ref]
        for ref in dialect.tool_call_ids(message):
            pending[ref] = i
        previous_model = model
    if pending and not allow_pending:
        _unanswered(pending, dialect, len(messages))


def _unanswered(pending: dict[str, int], dialect: Dialect, at: int) -> None:
    ref, index = next(iter(pending.items()))
    raise ValidationError(
        f"{dialect.name}: tool call {ref!r} issued by message {index} has no result "
        f"before message {at}", index)
