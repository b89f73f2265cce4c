"""What the replay compares: every contender turns the history of one model call into the
messages it would send.

* :class:`EngineContender` — any strategy registered with agentcompact (``cliff``,
  ``summary``, ``parallel``, third-party ones), each with its own :class:`~agentcompact.Engine`
  called incrementally, as a live agent would.
* :class:`FullHistory` (``none``) — the history as it is.
* :class:`SlidingWindow` (``window``) — the head and the most recent whole turns that fit
  under the trigger, recomputed at every call (what ``trim_messages``-style truncation does).
* :class:`CliffCompactionContender` (``cliffcompaction``) — the CliffCompaction peer's own
  engine on the request body, when the package is installed (extra ``bench``).

A contender returns a :class:`Sent`: the messages, whether this call compacted, and the
engine's compaction events when it has them.
"""

from __future__ import annotations

import bisect
import inspect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pluggy

from .._budget import Budget
from .._engine import Engine
from .._events import CompactionEvent
from .._pluginmanager import registry
from .._settings import StrategySettings
from .._tokens import MessageMeter, TokenCounter
from .._turns import split_turns
from ..dialects._base import Dialect
from ..errors import ConfigError

__all__ = [
    "BASELINES",
    "LLM_STRATEGIES",
    "CliffCompactionContender",
    "Contender",
    "ContenderSettings",
    "EngineContender",
    "FullHistory",
    "Sent",
    "SlidingWindow",
    "build_contender",
    "unavailable_reason",
]

#: contenders that are not engine strategies
BASELINES = ("none", "window", "cliffcompaction")
#: strategies that call a summarizer model
LLM_STRATEGIES = ("summary", "parallel")


@dataclass
class Sent:
    """What a contender sends for one call.

    ``drop_action`` names what happened to the messages it stopped sending verbatim when
    it has no engine events to say so (``dropped`` for a window, ``compacted`` for a peer
    that renders them into its own summary).
    """

    messages: Sequence[Any]
    compacted: bool = False
    events: list[CompactionEvent] = field(default_factory=list)
    error: str | None = None
    drop_action: str = "dropped"


class Contender(Protocol):
    """One side of the comparison: the messages to send for a call's history."""

    name: str

    def prepare(self, messages: list[Any]) -> Sent:
        """The messages to send for ``messages`` (the history before a model call)."""
        ...


@dataclass(frozen=True)
class ContenderSettings:
    """Shared settings of one replay: the budget, the counter, the summarizer."""

    trigger: int
    target: int | None = None
    counter: TokenCounter | None = None
    pm: pluggy.PluginManager | None = None
    summarizer_url: str | None = None
    summarizer_model: str | None = None
    #: other ``Summarizer`` keyword arguments (``timeout``, ``context_window``, ``api_key``)
    summarizer_options: dict[str, Any] = field(default_factory=dict)

    @property
    def budget(self) -> Budget:
        return Budget(trigger_tokens=self.trigger, target_tokens=self.target)


class FullHistory:
    """``none``: the full history, never compacted."""

    name = "none"

    def prepare(self, messages: list[Any]) -> Sent:
        return Sent(messages)


class SlidingWindow:
    """``window``: head + the most recent whole turns that fit under ``trigger``.

    Recomputed at every call, so the first kept turn moves forward almost every call once
    the history is over the trigger — each move breaks the prompt cache (the baseline the
    cache-stable strategies are measured against). The last turn is always kept, even
    when it alone is over the trigger. Turns come from :func:`agentcompact.split_turns`;
    as a live agent's history only grows by appending, turn starts and token prefix sums
    are extended with the new messages of each call (any other change: recomputed).
    """

    name = "window"

    def __init__(self, dialect: Dialect, meter: MessageMeter, trigger: int) -> None:
        self.dialect = dialect
        self.meter = meter
        self.trigger = trigger
        self._seen: list[Any] = []
        self._prefix = [0]  # tokens of seen[:i]
        self._starts: list[int] = []  # turn starts in seen
        self._start_tokens: list[int] = []  # _prefix at each turn start
        self._start = 0

    def _extend(self, messages: list[Any]) -> None:
        n = len(self._seen)
        if n > len(messages) or (n and (messages[n - 1] is not self._seen[n - 1]
                                        or messages[0] is not self._seen[0])):
            self._seen, self._prefix, self._starts, self._start_tokens = [], [0], [], []
            n = 0
        if n == len(messages):
            return
        tokens = self.meter.measure(messages[n:]).tokens
        self._prefix.extend(itertools.accumulate(tokens, initial=self._prefix[-1]))
        del self._prefix[n + 1]  # accumulate repeats its initial value
        starts = list(split_turns(messages, self.dialect, start=n).starts)
        if starts and starts[0] == n and n and self.dialect.is_model_output(messages[n - 1]):
            starts.pop(0)  # the new messages continue the turn begun before them
        self._starts.extend(starts)
        self._start_tokens.extend(self._prefix[s] for s in starts)
        self._seen = messages

    def prepare(self, messages: list[Any]) -> Sent:
        self._extend(messages)
        starts, prefix = self._starts, self._prefix
        if not starts:
            return Sent(messages)
        head_len, end = starts[0], prefix[len(messages)]
        room = self.trigger - prefix[head_len]
        k = min(bisect.bisect_left(self._start_tokens, end - room), len(starts) - 1)
        start = starts[k]
        moved = start > max(self._start, head_len)
        self._start = max(self._start, start)
        if start == head_len:
            return Sent(messages)
        return Sent(messages[:head_len] + messages[start:], compacted=moved)


class EngineContender:
    """A registered strategy run by its own engine (one per trajectory)."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine

    def prepare(self, messages: list[Any]) -> Sent:
        result = self.engine.compact(messages)
        errors = [e.error for e in result.events if e.error]
        # unmodified, the result is the history itself, message for message: say so (the
        # replay then accounts for it without looking at each message)
        sent = result.messages if result.modified else messages
        return Sent(sent, result.compacted, result.events,
                    "; ".join(errors) if errors else None, "compacted")


class CliffCompactionContender:
    """The CliffCompaction peer (``cliffcompaction.engine.Engine.prepare``) on request bodies.

    Its trigger is its own estimate (chars/4 of the serialized body) against the same
    ``trigger`` number; what it sends is measured with the replay's counter like the rest.
    """

    name = "cliffcompaction"

    def __init__(self, dialect: str, trigger: int, system: str | None = None) -> None:
        from cliffcompaction import dialects
        from cliffcompaction.config import Config
        from cliffcompaction.engine import Engine as PeerEngine

        peer = {"anthropic": dialects.anthropic.DIALECT,
                "openai_chat": dialects.openai_chat.DIALECT,
                "openai_responses": dialects.openai_responses.DIALECT}.get(dialect)
        if peer is None:
            raise ConfigError(f"cliffcompaction has no dialect for {dialect!r}")
        self._dialect = peer
        self._engine = PeerEngine(Config(threshold_tokens=trigger))
        self._extra: dict[str, Any] = {}
        if system:
            self._extra["instructions" if dialect == "openai_responses" else "system"] = system

    def prepare(self, messages: list[Any]) -> Sent:
        body = {**self._extra, self._dialect.messages_key: messages}
        ctx = self._engine.prepare(body, self._dialect)
        return Sent(ctx.substituted, ctx.compacted, drop_action="compacted")


def unavailable_reason(name: str, settings: ContenderSettings) -> str | None:
    """Why contender ``name`` cannot run with ``settings`` (``None``: it can)."""
    if name in ("none", "window"):
        return None
    if name == "cliffcompaction":
        try:
            import cliffcompaction.engine  # noqa: F401  (availability probe)
        except ImportError:
            return "cliffcompaction is not installed (pip install 'agentcompact[bench]')"
        return None
    names = registry(settings.pm).strategy_names()
    if name not in names:
        hint = " (needs --summarizer-url)" if name in LLM_STRATEGIES else ""
        return f"strategy {name!r} is not registered{hint}; registered: {', '.join(names)}"
    if name in LLM_STRATEGIES and not (settings.summarizer_url and settings.summarizer_model):
        return "needs a summarizer endpoint: pass --summarizer-url and --summarizer-model"
    return None


def build_contender(name: str, dialect: Dialect, meter: MessageMeter, system: str | None,
                    settings: ContenderSettings) -> Contender:
    """A fresh contender ``name`` for one trajectory of ``dialect``."""
    if name == "none":
        return FullHistory()
    if name == "window":
        return SlidingWindow(dialect, meter, settings.trigger)
    if name == "cliffcompaction":
        return CliffCompactionContender(dialect.name, settings.trigger, system)
    engine = Engine(strategy=StrategySettings(name, options=_summarizer_settings(name, settings)),
                    dialect=dialect, budget=settings.budget, counter=meter, plugins=settings.pm)
    # counter=meter: one meter per session, each message parsed, digested and counted once,
    # however many engines measure it (same counter and dialect: the figures are unchanged).
    return EngineContender(name, engine)


def _summarizer_settings(name: str, settings: ContenderSettings) -> dict[str, Any] | None:
    """Keyword arguments giving an LLM strategy its summarizer, by its factory's signature."""
    if name not in LLM_STRATEGIES or not settings.summarizer_url:
        return None
    factory = registry(settings.pm).strategy_factory(name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]  # builtins without a signature: no kwargs
    if "summarizer" in params:
        from .._summarizer import Summarizer

        return {"summarizer": Summarizer(settings.summarizer_url, settings.summarizer_model,
                                         **settings.summarizer_options)}
    out: dict[str, Any] = {}
    for key in ("base_url", "summarizer_url", "url"):
        if key in params:
            out[key] = settings.summarizer_url
            break
    for key in ("model", "summarizer_model"):
        if key in params:
            out[key] = settings.summarizer_model
            break
    return out or None
