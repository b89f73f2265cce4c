"""Hook specifications for agentcompact plugins.

Every hook lives in this module. Hooks are called with keyword arguments; an
implementation may accept any subset of a hook's arguments (pluggy passes only the ones
it names). Arguments are only ever added, never renamed.

Async rule: pluggy hooks are synchronous. A hook that may need I/O (``summary_prompt`` is
the only one today) may return an awaitable from its implementation; the async engine
(``Engine.acompact``) awaits it, the sync engine rejects it with ``PluginError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ._budget import Budget
    from ._events import CompactionEvent, EpisodeEnd, ModelCall, SummaryCall
    from .dialects._base import Dialect

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("agentcompact")
hookimpl = pluggy.HookimplMarker("agentcompact")


# -------------------------------------------------------------------------------------
# Registration: called once, when the plugin manager builds its registries.
# -------------------------------------------------------------------------------------


@hookspec
def agentcompact_register_strategies(register: Callable[..., None]) -> None:
    """Register compaction strategies by name.

    Called once per plugin manager, the first time a strategy is looked up. Call
    ``register(name, factory)`` for each strategy, where ``factory(**settings)`` returns an
    object with ``name`` and ``compact(request)`` (see ``agentcompact.strategies._base``).
    A later registration of the same name replaces an earlier one; built-in strategies are
    registered ``trylast`` so any plugin overrides them.

    :param register: ``register(name: str, factory: Callable[..., Strategy])``.
    """


@hookspec
def agentcompact_register_dialects(register: Callable[..., None]) -> None:
    """Register message dialects (wire formats of messages) by name.

    Called once per plugin manager, the first time a dialect is looked up. Call
    ``register(dialect)`` with an instance of ``agentcompact.dialects.Dialect``; its
    ``name`` is the key. Built-in dialects are registered ``trylast``.

    :param register: ``register(dialect: Dialect)``.
    """


# -------------------------------------------------------------------------------------
# Deciding: called on every ``Engine.compact`` call.
# -------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def agentcompact_should_compact(
    messages: Sequence[Any], tokens: int, budget: Budget, dialect: Dialect
) -> bool | None:
    """Decide whether the context about to be sent must be compacted now.

    Called on each ``Engine.compact`` with the context that would be sent (stored
    compacted prefix already substituted). Return ``True`` to compact, ``False`` to send
    as is, ``None`` to leave the choice to the default rule (``tokens > budget.trigger``).

    Stops at first non-None result.

    :param messages: the context that would be sent, native messages (read-only).
    :param tokens: its size in the engine's token counter.
    :param budget: the engine's budget.
    :param dialect: the message dialect.
    :returns: ``True``, ``False`` or ``None``.
    """


@hookspec
def agentcompact_pin(message: Any, index: int, dialect: Dialect) -> bool | None:
    """Keep the text of one message of the compacted span verbatim in every compaction.

    Called for each original message a compaction is about to render, drop or summarize.
    If any implementation returns ``True`` the message's **pinned text** is reproduced
    verbatim (as text of the compaction message, never cut): what the user typed in it
    (``agentcompact.pinned_texts``), not the tool results that share its message (a rule
    typed while tools run) nor text a harness injected (``<system-reminder>``,
    ``<environment_context>``: ``agentcompact.typed_pieces``); a message with no typed
    text (a tool output) keeps the text of all its parts. The rest of the message is
    compacted like any other. The engine enforces it for every strategy: a compaction
    message missing the pinned text is rejected and the engine falls back (cliff, then a
    plain safe cut holding the pinned text); the pinned text of a message among the kept
    turns is never cut. **Pins are bounded** whatever the plugins answer: the pinned text
    of one compaction takes at most ``agentcompact.PIN_SHARE`` (10%) of the target; past it
    the oldest pins give way (rendered like any other message; the cliff strategy keeps at
    least their skim line and handle) and ``CompactionEvent.unpinned`` lists them. Use it
    for safety rules, the task statement, or a tool's output that must survive. The answer
    must depend on the message, its index and the dialect only: the engine asks once per
    message and index and remembers it while the plugin set is unchanged.

    :param message: the native message.
    :param index: its index in the original history.
    :param dialect: the message dialect.
    :returns: ``True`` to pin; anything else leaves the decision to others.
    """


# -------------------------------------------------------------------------------------
# Rendering: called while a strategy builds its compaction message.
# -------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def agentcompact_render_message(
    message: Any, dialect: Dialect, settings: dict[str, Any]
) -> list[str] | None:
    """Override how the cliff strategy renders one compacted message.

    Called for each message of the span the cliff strategy compacts. Return a list of
    text parts to use instead of the default rendering (an empty list drops the message
    from the compaction), or ``None`` for the default. Every returned part must be text
    taken from the message (verbatim provenance): the cliff strategy checks each part and
    raises ``PluginError`` otherwise, and the engine falls back to a plain safe cut (the
    error on the event).

    Stops at first non-None result.

    :param message: the native message.
    :param dialect: the message dialect.
    :param settings: ``{"strategy": "cliff"}``.
    :returns: text parts, or ``None``.
    """


@hookspec(firstresult=True)
def agentcompact_summary_prompt(
    messages: Sequence[Any], dialect: Dialect, settings: dict[str, Any]
) -> list[dict[str, Any]] | None:
    """Build the prompt sent to the summarizer for a span of original messages.

    Called by the summary and parallel strategies once per summarizer request. Return
    OpenAI chat messages (``[{"role": "system", ...}, {"role": "user", ...}]``) or
    ``None`` for the default prompt. May return an awaitable (async engine only).

    Stops at first non-None result.

    :param messages: the original messages of the span (or block), native.
    :param dialect: the message dialect.
    :param settings: the strategy settings (output budget in tokens, block index).
    :returns: chat messages, or ``None``.
    """


# -------------------------------------------------------------------------------------
# Observing and RL logging.
# -------------------------------------------------------------------------------------


@hookspec
def agentcompact_on_compaction(event: CompactionEvent) -> None:
    """Observe a compaction (or a failed one).

    Called after every compaction the engine performs, including fallbacks: the event
    carries tokens before and after, the kept and dropped spans, the strategy, latency,
    the errors of the rungs that failed (``error``) and the rung used (``fallback``:
    ``None``, ``"cliff"``, ``"safe"`` or ``"none"``). Errors go here, never into the
    context, and never carry message content.

    Called after the compaction is validated and stored: an implementation that raises
    cannot undo it. The engine warns once (by exception type) and goes on — the result,
    the store and the other observers all see the compaction.

    :param event: the compaction event.
    """


@hookspec
def agentcompact_log_model_call(call: ModelCall) -> None:
    """Record one model call for RL export: the exact context sent and the response.

    Called by the integrations (SDK wrappers, LangGraph, LlamaIndex, the proxy) after each
    model call returns, with the compacted context actually sent, the response, usage
    and, when the serving engine reported them, token ids and logprobs.

    :param call: the model call.
    """


@hookspec
def agentcompact_log_summary_call(call: SummaryCall) -> None:
    """Record one summarizer call (prompt, output, usage) for RL export.

    Called by the summary and parallel strategies after each summarizer request,
    successful or not.

    :param call: the summarizer call.
    """


@hookspec
def agentcompact_log_episode_end(episode: EpisodeEnd) -> None:
    """Record the end of an episode: outcome reward(s) and stop reason.

    Called by the user's harness (``agentcompact.log_episode_end(...)``) or an
    integration when an episode finishes.

    :param episode: the episode end.
    """
