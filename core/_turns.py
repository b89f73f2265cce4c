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
    from .dialects._base import Dialect

__all__ = ["Problem", "Turns", "loop_start", "problems", "split_turns", "starts_with_thinking",
           "thinking_loop_error", "validate"]


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
    is answered before the model speaks again, before any message that answers none of
    the calls waiting (a user text or an instruction between a call and its result), and
    before the end, unless ``allow_pending``: an agent state may end with calls not yet
    run, but nothing else may follow them.
    """
    found = problems(messages, dialect, allow_pending=allow_pending, first=True)
    if found:
        raise found[0][1]


Problem = tuple[tuple[Any, ...], ValidationError]
"""A validity problem: (a key naming it by kind, tool-call id or the message object, the
error). Two lists share a problem when the keys are equal."""


def problems(messages: Sequence[Any], dialect: Dialect, *, allow_pending: bool = False,
             first: bool = False) -> list[Problem]:
    """Every problem :func:`validate` would raise for (only the first with ``first``).

    The engine uses it to accept an output whose only problems are problems of its input
    kept as they were (an orphan tool result in the head, which compaction cannot fix and
    must not be disabled by)."""
    out: list[Problem] = []
    for i, message in enumerate(messages):
        try:
            dialect.check_shape(message, i)
        except ValidationError as exc:
            out.append((("shape", id(message)), exc))
            if first:
                return out
    if out:  # role and pairing rules read messages of the dialect's shape only
        return out
    for error in _order_problems(dialect, messages):
        index = error.index
        at = messages[index] if index is not None and index < len(messages) else None
        out.append((("order", id(at)), error))
        if first:
            return out
    pending: dict[str, int] = {}
    previous_model = False
    for i, message in enumerate(messages):
        model = dialect.is_model_output(message)
        answers = dialect.tool_result_ids(message)
        if pending and ((model and not previous_model) or (
                not model and not any(ref in pending for ref in answers))):
            # the next model turn, or a message that answers none of the calls (a user
            # text between a call and its result): every provider wants the results first
            out += _unanswered(pending, messages, dialect, i)
            if first:
                return out[:1]
            pending.clear()
        for ref in answers:
            if ref not in pending:
                out.append((("orphan", ref, id(message)), ValidationError(
                    f"{dialect.name}: message {i} answers tool call {ref!r}, which no "
                    "earlier message issued (orphan tool result)", i)))
                if first:
                    return out
                continue
            del pending[ref]
        for ref in dialect.tool_call_ids(message):
            pending[ref] = i
        previous_model = model
    if pending and not allow_pending:
        out += _unanswered(pending, messages, dialect, len(messages))
    return out[:1] if first else out


def _order_problems(dialect: Dialect, messages: Sequence[Any]) -> list[ValidationError]:
    """Every role-order problem (``Dialect.order_problems``; a dialect object without it:
    the one ``check_order`` raises). All of them, not the first only: an output that drops
    the first of several problems its input had must not show the next as new."""
    every = getattr(dialect, "order_problems", None)
    if every is not None:
        found: list[ValidationError] = every(messages)
        return found
    try:
        dialect.check_order(messages)
    except ValidationError as exc:
        return [exc]
    return []


def _unanswered(pending: dict[str, int], messages: Sequence[Any], dialect: Dialect,
                at: int) -> list[Problem]:
    return [(("unanswered", ref, id(messages[index])), ValidationError(
        f"{dialect.name}: tool call {ref!r} issued by message {index} has no result "
        f"before message {at}", index)) for ref, index in pending.items()]


def loop_start(messages: Sequence[Any], dialect: Dialect, end: int | None = None) -> int | None:
    """Index of the first model message of the tool loop running at ``end`` (default: the
    end): the first model message after the last ``user`` message that answers no tool
    call; ``None`` when no model message follows it.

    A message answering tool calls continues the loop, also when it carries text beside
    the results (a tool-results-only message has role ``tool``; one with text has role
    ``user``): a tool-use loop is one assistant turn, which only a user turn that is not
    tool results ends (Anthropic's extended-thinking rules), and a harness that adds
    text there means it within the turn — Claude Code surfaces what the user types while
    tools run "within the running turn, often alongside the next tool result, rather
    than as a separate conversation turn" (its own words to the model, 2.1.332)."""
    end = len(messages) if end is None else end
    i = end - 1
    role, answers = dialect.role, dialect.tool_result_ids
    while i >= 0 and (role(messages[i]) != "user" or answers(messages[i])):
        i -= 1
    for j in range(i + 1, end):
        if dialect.is_model_output(messages[j]):
            return j
    return None


def starts_with_thinking(message: Any, dialect: Dialect) -> bool:
    """True when the message's first content part is (signed or redacted) thinking."""
    try:
        parts = dialect.parts(message)
    except Exception:  # a malformed message: validation names the problem
        return False
    return bool(parts) and parts[0].kind == "thinking"


def thinking_loop_error(original: Sequence[Any], end: int, output: Sequence[Any],
                        dialect: Dialect, start: int | None | bool = False) -> str | None:
    """The thinking-loop rule (Anthropic extended thinking): when the tool loop running at
    ``original[end]`` starts with a thinking block, the loop that ``output`` ends in must
    start with one too (a cut inside the loop that lost the thinking block leaves an
    assistant message starting with ``tool_use``, which the provider refuses). Returns
    the problem (indices only), or ``None``. ``start``: ``loop_start(original, dialect,
    end)`` when the caller knows it (``History.loop_start``)."""
    if start is False:
        start = loop_start(original, dialect, end)
    if start is None or not starts_with_thinking(original[start], dialect):
        return None
    out_start = loop_start(output, dialect)
    if out_start is None or starts_with_thinking(output[out_start], dialect):
        return None
    return (f"{dialect.name}: message {out_start} starts a thinking-enabled tool loop "
            f"without its thinking block (the loop starts at original message {start})")
