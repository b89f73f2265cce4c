"""The engine: decide, cut, render, store, validate — the same way for every strategy.

``Engine.compact(messages)`` returns the list to send. Rules it keeps for any strategy:

- **never compact a compaction**: strategies receive original messages; a compaction
  message that comes back as input is carried on verbatim, never rendered again;
- **prefix store**: a compaction is stored under the chain digest of the original prefix
  it replaced (seeded with the engine's settings fingerprint and episode); later calls
  carrying that prefix reuse the identical compacted prefix until the next cliff (cache
  hits). A long history arriving at once is compacted by replaying
  the threshold crossings at each turn start, so it gets the result an incrementally
  called engine would have;
- **one-way pipeline**: view → decide → plan the cut → render → validate → store →
  assemble → report; the engine checks validity (dialect rules, the thinking-loop rule),
  pins, kept messages (instructions, opaque items, compaction messages fed back in) and
  the budget for any strategy, and stores only what passed;
- **fail-open**: a strategy that raises or fails a check yields the cliff result, then a
  plain safe cut, then the uncompacted history — every rung validated; the errors and the
  rung go to ``on_compaction`` (no message content), never the context; an observer
  that raises is warned about and does not undo the stored compaction (``_report``);
- **deterministic**; the caller's list and messages are never mutated; kept messages are
  passed through by reference.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import inspect
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import pluggy
import xxhash

from ._archive import handles_keyed
from ._budget import Budget
from ._events import CompactionEvent, DroppedItem, new_id
from ._fixed import FixedTokens
from ._interner import Interner, same_objects
from ._markers import COMPACTION_HEADER
from ._pins import PIN_SHARE, bound_pins, pinned_texts
from ._pluginmanager import get_plugin_manager, registry
from ._settings import StrategySettings
from ._store import (
    InMemoryPrefixStore,
    PrefixEntry,
    PrefixScan,
    PrefixStore,
    chain_digests,
    extend_chain,
)
from ._tokens import MessageMeter, TokenCounter, make_counter
from ._turns import loop_start, problems, split_turns, starts_with_thinking, thinking_loop_error
from .dialects._base import Dialect
from .errors import AgentCompactError, ConfigError, DialectError, OverBudgetError, PluginError
from .strategies._base import CompactionRequest, Rendered
from .strategies._cliff import CliffStrategy

__all__ = ["CompactionResult", "Engine", "describe_error"]

log = logging.getLogger("agentcompact")

_TAIL_SHARE = 0.75  # kept turns may use this share of the target; the rest is for rendering
_TRUNCATE_FLOOR = 1_000  # tokens: kept messages above this may be truncated (last resort)
_FLOOR_SHARE = 0.15  # the strategy's floor takes at most this of the trigger (fixed part aside)
_FLOOR_MIN = 1_000  # ... or this, when it is more (never over the target, though)
#: a large tool output of the newest kept turn, whole at a compaction because the agent has
#: not read it, is folded to about this many tokens at the first call after it has (head,
#: tail and error lines, with the handle of the original: ``Engine._fold``)
_FOLD_TOKENS = 300


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


@dataclass
class _View:
    messages: list[Any]
    digests: list[str]
    tokens: list[int]  # 0 for a message in ``pending``
    chain: list[str]
    prefix: list[int]  # prefix[i] = tokens of messages[:i]
    fixed: int = 0  # tokens sent besides the messages (system prompt, tool schemas)
    #: messages not counted yet (index -> an upper bound of their count): counted by
    #: :meth:`Engine._resolve` when a decision or a figure needs them
    pending: dict[int, int] = field(default_factory=dict)


@dataclass
class _State:
    entry: PrefixEntry | None

    def tokens_at(self, view: _View, end: int) -> int:
        e = self.entry
        if e is None:
            return view.prefix[end] + view.fixed
        total = view.fixed + view.prefix[e.head_len] + e.message_tokens
        total += view.prefix[end] - view.prefix[e.cut]
        for idx in e.kept:
            total += view.tokens[idx]
        for idx, (digest, _, tokens) in e.overrides.items():
            if idx < end and view.digests[idx] == digest:
                total += tokens - view.tokens[idx]
        return total

    def messages_at(self, view: _View, end: int) -> list[Any]:
        e = self.entry
        msgs = view.messages
        if e is None:
            return msgs[:end]
        out = msgs[: e.head_len]
        if e.kept:
            out += [msgs[i] for i in e.kept]
        if e.message is not None:
            out.append(e.message)
        tail = msgs[e.cut : end]
        for idx, (digest, copy, _) in e.overrides.items():
            if e.cut <= idx < end and view.digests[idx] == digest:
                tail[idx - e.cut] = copy
        return out + tail


@dataclass(frozen=True)
class _Plan:
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


@dataclass(frozen=True)
class _Checked:
    """Outcome of "validate" for one rung: the entry, and the problem that rejects it."""

    entry: PrefixEntry | None
    rung: str
    rendered: Rendered | None
    problem: str | None


@dataclass(frozen=True)
class _Outcome:
    """What the pipeline hands to "assemble": the view, the tokens that would have been
    sent, the state (stored entry in force) and the compaction events."""

    view: _View
    before: int
    state: _State
    events: tuple[CompactionEvent, ...]


_Pipeline = Generator[tuple[str, CompactionRequest], tuple[Rendered | None, str | None],
                      _Outcome]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_FINGERPRINT_HOOKS = ("agentcompact_pin", "agentcompact_render_message",
                      "agentcompact_summary_prompt")


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


def _rendered_or_error(rendered: Any) -> tuple[Rendered | None, str | None]:
    if not isinstance(getattr(rendered, "tokens", None), int) or not hasattr(rendered,
                                                                              "message"):
        return None, (f"PluginError: the strategy returned a {type(rendered).__name__}, not "
                      "a Rendered")
    return rendered, None


def _thinking_safe(cuts: list[int], msgs: Sequence[Any], c: int, dialect: Dialect) -> list[int]:
    """The cuts that keep the thinking-loop rule: when the tool loop running at ``c``
    starts with thinking, a cut inside it must land on a message starting with thinking."""
    start = loop_start(msgs, dialect, c)
    if start is None or not starts_with_thinking(msgs[start], dialect):
        return cuts
    # not even at ``c`` itself: the loop's next steps would follow the compaction message
    return [s for s in cuts if s <= start or (s < c and starts_with_thinking(msgs[s], dialect))]


def _stable_repr(value: Any, depth: int = 0) -> str:
    """A repr without memory addresses (the same in every process)."""
    if depth < 3 and hasattr(value, "__dict__") and not isinstance(value, type):
        items = sorted((str(k), _stable_repr(v, depth + 1)) for k, v in vars(value).items())
        return f"{type(value).__qualname__}{items}"
    if depth < 3 and isinstance(value, dict):
        return "{" + ",".join(sorted(f"{k!r}:{_stable_repr(v, depth + 1)}"
                                     for k, v in value.items())) + "}"
    return _ADDRESS.sub("", repr(value))


def _check_settings(name: str, factory: Callable[..., Any], settings: dict[str, Any]) -> None:
    """A clear error when a strategy does not take the given settings (``summarizer`` or
    ``model`` given to ``cliff``, a misspelt knob), before anything is constructed."""
    if not settings:
        return
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins / C callables: let the call decide
        return
    try:
        sig.bind(**settings)
    except TypeError as exc:
        raise ConfigError(f"strategy {name!r} does not take the settings "
                          f"{', '.join(sorted(settings))}: {exc}") from None


class Engine:
    """Compacts message histories of one dialect under a token budget.

    >>> engine = Engine(strategy="cliff", dialect="anthropic",
    ...                 budget=Budget(trigger_tokens=60000))   # doctest: +SKIP
    >>> result = engine.compact(messages)                       # doctest: +SKIP
    >>> send(result.messages)                                   # doctest: +SKIP

    :param strategy: a registered strategy name, a :class:`StrategySettings` (a name with
        its options and summarizer settings) or a strategy object.
    :param dialect: a registered dialect name or a ``Dialect``.
    :param budget: the token budget (default ``Budget(trigger_tokens=100_000)``).
    :param counter: ``"tiktoken"`` (default, o200k_base), ``"tiktoken:ENC"``, ``"hf:PATH"``,
        ``"chars"``, a ``TokenCounter``, or a :class:`~agentcompact._tokens.MessageMeter` of
        this dialect: a counter with its per-message token/digest cache, to bound the cache
        (``max_entries``; long-lived servers holding many engines lower it) or to share it
        between engines used from one thread (default: a cache of 200,000 messages).
    :param store: a ``PrefixStore`` (default: in-memory LRU); share one between engines
        of the same settings (or proxy workers) to share compacted prefixes.
    :param plugins: a pluggy ``PluginManager`` (default: the process-wide one).
    :param strict: raise ``OverBudgetError`` when the context is still over the budget's
        limit after every escalation (default: send it anyway and flag ``over_budget``).
    :param episode_id: stamped on events for RL export, and the scope of the prefix-store
        keys: engines of other episodes never reuse its compactions (``new_episode()``
        starts a new one).

    The configuration is read back from the read-only attributes ``strategy``,
    ``strategy_name``, ``dialect``, ``budget``, ``counter``, ``store``, ``pm`` (the plugin
    manager), ``strict`` and ``episode_id``.
    """

    def __init__(
        self,
        strategy: str | StrategySettings | Any = "cliff",
        dialect: str | Dialect = "openai_chat",
        budget: Budget | None = None,
        *,
        counter: str | TokenCounter | MessageMeter | None = None,
        store: PrefixStore | None = None,
        plugins: pluggy.PluginManager | None = None,
        strict: bool = False,
        episode_id: str | None = None,
    ) -> None:
        self._pm = plugins if plugins is not None else get_plugin_manager()
        reg = registry(self._pm)
        self._dialect = reg.dialect(dialect) if isinstance(dialect, str) else dialect
        if budget is None:
            budget = Budget(trigger_tokens=100_000)
        elif not isinstance(budget, Budget):
            raise ConfigError(f"budget must be a Budget, got {type(budget).__name__}")
        self._budget = budget
        if isinstance(strategy, str):
            strategy = StrategySettings(strategy)
        self._settings: dict[str, Any] = {}
        if isinstance(strategy, StrategySettings):
            factory = reg.strategy_factory(strategy.name)
            self._settings = strategy.factory_kwargs()
            _check_settings(strategy.name, factory, self._settings)
            strategy = factory(**self._settings)
        if not callable(getattr(strategy, "compact", None)):
            raise ConfigError(f"strategy {strategy!r} has no compact(request) method")
        self._strategy = strategy
        self._fallback = CliffStrategy()
        if isinstance(counter, MessageMeter):
            if counter.dialect is not self._dialect:
                raise ConfigError(f"counter: a MessageMeter of dialect {counter.dialect.name!r} "
                                  f"given to an engine of dialect {self._dialect.name!r}")
            self._meter = counter
        else:
            self._meter = MessageMeter(make_counter(counter), self._dialect)
        self._counter = self._meter.counter
        self._store: PrefixStore = store if store is not None else InMemoryPrefixStore()
        self._strict = strict
        self._episode_id = episode_id
        self._lock = threading.RLock()
        self._last_view: _View | None = None
        self._scan = PrefixScan(self._store)
        self._interner = Interner()
        self._fixed = FixedTokens(self._counter, getattr(self._dialect, "fixed_keys", None))
        self._warned = False
        self._warned_fixed = False
        self._failed_observers: set[str] = set()
        self._min_budget = _min_budget(self._strategy)
        self._plugins_key: tuple[Any, ...] | None = None
        #: the pin hook's answer for each message asked about, by identity (with the
        #: message and its index: :meth:`_pins`), for the plugin set of ``_plugins_key``
        self._pin_memo: dict[int, tuple[Any, int, bool]] = {}
        #: the pinned text of each pin and its tokens, by identity (:meth:`_pin_text`)
        self._pin_texts: dict[int, tuple[Any, tuple[str, ...], int]] = {}
        self._shaping_hooks = tuple(getattr(self._pm.hook, name) for name in _FINGERPRINT_HOOKS)
        self._should_compact_hook = self._pm.hook.agentcompact_should_compact
        self._seed = ""
        self._refresh_seed()

    # --- store scope: configuration fingerprint and episode ---------------------------
    def fingerprint(self) -> str:
        """A digest of everything that changes this engine's output for a given history:
        the strategy and its settings, the budget, the dialect, the counter, the plugins
        that pin or render, output validation. It seeds the chain digests that key the
        prefix store (with the episode), so engines of other settings sharing a store
        never reuse each other's compactions."""
        strategy = self._strategy
        own = getattr(strategy, "fingerprint", None)
        if callable(own):
            own = own()
        settings = own if isinstance(own, str) else _stable_repr(
            self._settings if self._settings else strategy)
        plugins = sorted(
            f"{name}:{self._pm.get_name(impl.plugin)}:{impl.function.__qualname__}"
            for name in _FINGERPRINT_HOOKS
            for impl in getattr(self._pm.hook, name).get_hookimpls())
        parts = ["agentcompact-store-2", self.strategy_name,
                 f"{type(strategy).__module__}.{type(strategy).__qualname__}", settings,
                 repr(self._budget), self._dialect.name,
                 f"{type(self._dialect).__module__}.{type(self._dialect).__qualname__}",
                 str(getattr(self._counter, "name", type(self._counter).__qualname__)),
                 "True", *plugins]  # "True": output validated (always; kept: same keys)
        return xxhash.xxh3_128_hexdigest("\x00".join(parts).encode("utf-8", "surrogatepass"))

    def new_episode(self, episode_id: str | None = None) -> str:
        """Start a new episode (an RL rollout, a new task on a reused client): later
        compactions are stored under a scope of their own, so nothing compacted in an
        earlier episode is reused, and events carry the new ``episode_id`` (default: a
        fresh id). Returns it. ``Engine(episode_id=...)`` scopes from the start."""
        with self._lock:
            self._episode_id = episode_id if episode_id is not None else new_id()
            self._refresh_seed(force=True)
        return self._episode_id

    def _refresh_seed(self, force: bool = False) -> None:
        """Recompute the store seed when the plugins that shape the output changed."""
        key = tuple(impl.function for caller in self._shaping_hooks
                    for impl in caller.get_hookimpls())
        if not force and key == self._plugins_key:
            return
        self._plugins_key = key
        self._pin_memo = {}
        seed = xxhash.xxh3_128_hexdigest(
            f"{self.fingerprint()}\x00{self._episode_id or ''}".encode("utf-8", "surrogatepass"))
        if seed != self._seed:
            self._seed = seed
            self._last_view = None
            self._scan.forget()

    # --- configuration, read back ----------------------------------------------------
    @property
    def strategy(self) -> Any:
        """The strategy object compacting (built from the name or settings given)."""
        return self._strategy

    @property
    def strategy_name(self) -> str:
        return str(getattr(self._strategy, "name", type(self._strategy).__name__))

    @property
    def dialect(self) -> Dialect:
        return self._dialect

    @property
    def budget(self) -> Budget:
        return self._budget

    @property
    def counter(self) -> TokenCounter:
        return self._counter

    @property
    def store(self) -> PrefixStore:
        return self._store

    @property
    def pm(self) -> pluggy.PluginManager:
        """The plugin manager the engine calls its hooks on."""
        return self._pm

    @property
    def strict(self) -> bool:
        return self._strict

    @property
    def episode_id(self) -> str | None:
        return self._episode_id

    # --- public API -----------------------------------------------------------------
    def compact(self, messages: Sequence[Any], *, force: bool = False,
                fixed_tokens: int = 0) -> CompactionResult:
        """The messages to send for ``messages`` (see the module docstring).

        ``force`` compacts even under the trigger, one escalation level harder (reactive
        retry after a provider's context-length error). ``fixed_tokens`` is what the request
        carries besides the messages (system prompt, tool schemas): the budget covers both,
        and the result's token figures include it.
        """
        return self._drive(messages, self._pipeline(messages, force, fixed_tokens))

    async def acompact(self, messages: Sequence[Any], *, force: bool = False,
                       fixed_tokens: int = 0) -> CompactionResult:
        """``compact`` for async code: awaits strategies that define ``acompact``."""
        return await self._adrive(messages, self._pipeline(messages, force, fixed_tokens))

    def compact_request(self, body: dict[str, Any], *, force: bool = False
                        ) -> tuple[dict[str, Any], CompactionResult]:
        """Compact a provider request body; returns (body to send, result).

        The body is returned unchanged (same object) when nothing was modified. The
        system prompt, instructions and tool schemas count against the budget. A body
        parsed afresh costs what is new in it: messages byte-identical to the previous
        body's at the same position are measured as those (``agentcompact._interner``).
        """
        messages = self._dialect.messages_of(body)
        interned = messages
        if isinstance(messages, (list, tuple)):
            with self._lock:
                interned = self._interner.intern(messages)
        result = self.compact(interned, force=force, fixed_tokens=self.fixed_tokens(body))
        if not result.modified:
            return body, result
        theirs = {id(a): b for a, b in zip(interned, messages) if a is not b}
        if theirs:  # the caller's own objects in what is sent
            result.messages = [theirs.get(id(m), m) for m in result.messages]
        return self._dialect.with_messages(body, result.messages), result

    def fixed_tokens(self, body: dict[str, Any]) -> int:
        """Tokens of a request body besides its messages: system, instructions, tools.

        Remembered by content, and by identity for the last body's values
        (``agentcompact._fixed``). Like messages, the values are taken as immutable once
        counted.
        """
        return self._fixed.count(body)

    def count(self, messages: Sequence[Any]) -> int:
        """Tokens of ``messages`` in this engine's counter (cached per message)."""
        with self._lock:
            return sum(self._meter.measure(messages).tokens)

    def context_tokens(self, messages: Sequence[Any]) -> int:
        """Tokens that would be sent for ``messages`` without a new compaction (the stored
        compacted prefix substituted)."""
        view = self._resolve(self._view(messages))
        n = len(view.messages)
        return _State(self._lookup(view, n)).tokens_at(view, n)

    def precompact(self, messages: Sequence[Any]) -> CompactionResult:
        """Compact ``messages`` now, under the trigger, and store the result in the prefix
        store: the next ``compact`` of a history extending ``messages`` substitutes it
        (background compaction, see ``agentcompact._background``). Reason ``"background"``.
        """
        return self._drive(messages, self._precompact_pipeline(messages))

    async def aprecompact(self, messages: Sequence[Any]) -> CompactionResult:
        """``precompact`` for async code (awaits strategies that define ``acompact``)."""
        return await self._adrive(messages, self._precompact_pipeline(messages))

    def _precompact_pipeline(self, messages: Sequence[Any]) -> _Pipeline:
        if not isinstance(messages, (list, tuple)):
            raise ConfigError(f"messages must be a list, got {type(messages).__name__}")
        view = self._resolve(self._view(messages))
        n = len(view.messages)
        state = _State(self._lookup(view, n))
        before = state.tokens_at(view, n)
        starts = split_turns(view.messages, self._dialect).starts
        entry, event = yield from self._compact_at(view, starts, n, state, "background", 0)
        if entry is not None:
            self._store.put(view.chain[entry.cut - 1], entry)  # validated: see _check
            state = _State(entry)
        return _Outcome(view, before, state, (event,) if event is not None else ())

    # --- driving a pipeline: the only difference between the sync and async APIs -------
    # ``_finish`` runs outside the ``except StopIteration``: an error it raises (strict
    # mode) must not chain the StopIteration, whose value holds the whole history.
    # A DialectError names the message it is about by index and type (found again on
    # this error path only, so the hot path pays nothing for it).
    # Handles made during a call (skim lines, truncation markers) are keyed by the
    # tenant of the strategy's archive, if it has one (``agentcompact._archive``).
    def _drive(self, messages: Sequence[Any], gen: _Pipeline) -> CompactionResult:
        with self._handles():
            try:
                step = next(gen)
                while True:
                    step = gen.send(self._render_sync(*step))
            except StopIteration as stop:
                outcome: _Outcome = stop.value
            except DialectError:
                self._name_bad_message(messages)
                raise
            return self._finish(outcome)

    async def _adrive(self, messages: Sequence[Any], gen: _Pipeline) -> CompactionResult:
        with self._handles():
            try:
                step = next(gen)
                while True:
                    step = gen.send(await self._render_async(*step))
            except StopIteration as stop:
                outcome: _Outcome = stop.value
            except DialectError:
                self._name_bad_message(messages)
                raise
            return self._finish(outcome)

    def _handles(self) -> contextlib.AbstractContextManager[None]:
        key = getattr(getattr(self._strategy, "archive", None), "handle_key", None)
        return handles_keyed(key) if key is not None else contextlib.nullcontext()

    # --- rendering: one rung of the fallback chain ----------------------------------
    def _strategy_for(self, rung: str) -> Any:
        return self._strategy if rung == "strategy" else self._fallback

    def _render_sync(self, rung: str, request: CompactionRequest
                     ) -> tuple[Rendered | None, str | None]:
        strategy = self._strategy_for(rung)
        try:
            rendered = strategy.compact(request)
            if inspect.isawaitable(rendered):
                close = getattr(rendered, "close", None)
                if close is not None:
                    close()
                raise ConfigError(f"strategy {self.strategy_name!r} is async-only: use acompact")
            return _rendered_or_error(rendered)
        except Exception as exc:  # fail-open: the next rung renders
            return None, describe_error(exc)

    async def _render_async(self, rung: str, request: CompactionRequest
                            ) -> tuple[Rendered | None, str | None]:
        strategy = self._strategy_for(rung)
        try:
            acompact = getattr(strategy, "acompact", None)
            if acompact is not None:
                return _rendered_or_error(await acompact(request))
            rendered = strategy.compact(request)
            if inspect.isawaitable(rendered):
                rendered = await rendered
            return _rendered_or_error(rendered)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return None, describe_error(exc)

    # --- the pipeline ---------------------------------------------------------------
    # view → decide → plan the cut → render → validate → store → assemble → report.
    def _pipeline(self, messages: Sequence[Any], force: bool, fixed: int = 0) -> _Pipeline:
        if not isinstance(messages, (list, tuple)):
            raise ConfigError(f"messages must be a list, got {type(messages).__name__}")
        view = self._view(messages)                                        # view
        view.fixed = fixed
        n = len(view.messages)
        state = _State(self._lookup(view, n))
        events: list[CompactionEvent] = []
        unfolded = -1
        if self._fold_due(view, state, n):
            view = self._resolve(view)
            unfolded = state.tokens_at(view, n)
            state = self._fold(view, state, n, events)                    # fold
        if view.pending:
            # under the trigger by the bound alone: nothing to decide, counted when read
            if not force and not self._should_compact_hook.get_hookimpls() and (
                    state.tokens_at(view, n) + sum(view.pending.values())
                    <= self._budget.trigger):
                return _Outcome(view, -1, state, ())
            view = self._resolve(view)
        before = state.tokens_at(view, n)
        if not (force or self._should_compact(view, state, n, before)):   # decide
            return _Outcome(view, before if unfolded < 0 else unfolded, state, tuple(events))
        turns = split_turns(view.messages, self._dialect)
        points = [s for s in turns.starts if s > (state.entry.cut if state.entry else 0)]
        if not points or points[-1] != n:
            points.append(n)
        initial = state.entry
        for c in points:
            last = c == n
            if self._fold_due(view, state, c):
                state = self._fold(view, state, c, events)  # as a call at c would
            if not last and state.tokens_at(view, c) <= self._budget.trigger:
                continue
            if last and not force and state.entry is not initial and not self._should_compact(
                view, state, n
            ):
                break
            reason = "reactive" if force and last else ("trigger" if last else "replay")
            entry, event = yield from self._compact_at(view, turns.starts, c, state, reason,
                                                       1 if force and last else 0)
            if event is not None:
                events.append(event)
            if entry is not None:                                          # store
                self._store.put(view.chain[entry.cut - 1], entry)  # validated: see _check
                state = _State(entry)
        return _Outcome(view, before, state, tuple(events))

    def _compact_at(
        self, view: _View, starts: Sequence[int], c: int, state: _State, reason: str, level: int,
    ) -> Generator[tuple[str, CompactionRequest], tuple[Rendered | None, str | None],
                   tuple[PrefixEntry | None, CompactionEvent | None]]:
        t0 = time.perf_counter()
        plan = self._plan(view, starts, c, state, reason, level)          # plan the cut
        if plan is None:
            return None, None
        request = CompactionRequest(
            messages=view.messages[:c], dialect=self._dialect, head_len=plan.head_len,
            span_start=plan.span_start, cut=plan.cut, budget_tokens=plan.budget_tokens,
            meter=self._meter, pm=self._pm, level=level, episode_id=self._episode_id,
            reason=reason, kept=frozenset(plan.kept), pins=frozenset(plan.pins),
            unpinned=frozenset(plan.unpinned),
        )
        errors: list[str] = []
        checked: _Checked | None = None
        for rung in self._rungs:
            rendered: Rendered | None
            if rung == "safe":
                rendered, error = self._safe_render(view, plan), None
            else:
                rendered, error = yield rung, request                      # render
            if rendered is None:
                errors.append(f"{self._rung_name(rung)}: {error}")
                continue
            checked = self._check(view, plan, rendered, rung)              # validate
            if checked.problem is None:
                break
            errors.append(f"{self._rung_name(rung)}: {checked.problem}")
            checked = None
        entry = checked.entry if checked is not None else None
        rung = checked.rung if checked is not None else "none"
        event = self._event(view, plan, entry, rung, errors, t0,
                            checked.rendered if checked is not None else None)
        return entry, event

    @property
    def _rungs(self) -> tuple[str, ...]:
        if isinstance(self._strategy, CliffStrategy) and self._strategy == self._fallback:
            return ("strategy", "safe")  # the strategy is the default cliff: no second try
        return ("strategy", "cliff", "safe")

    def _rung_name(self, rung: str) -> str:
        return self.strategy_name if rung == "strategy" else rung

    def _plan(self, view: _View, starts: Sequence[int], c: int, state: _State, reason: str,
              level: int) -> _Plan | None:
        """Where to cut for a compaction at ``c``: the head, the span, the messages of the
        span kept verbatim, how many recent turns stay, and the strategy's budget (made
        at least the strategy's minimum when dropping turns or truncating the largest kept
        tool output can make it so)."""
        msgs = view.messages
        dialect = self._dialect
        turn_starts = [s for s in starts if s < c]
        if not turn_starts:
            return None
        head_len = turn_starts[0]
        while head_len > 0 and dialect.is_synthetic(msgs[head_len - 1]):
            head_len -= 1
        prev_cut = state.entry.cut if state.entry else turn_starts[0]
        cuts = [s for s in turn_starts if s > prev_cut] + [c]  # cuts[-1-r] keeps r turns
        budget = self._budget
        if dialect.thinking_loops():
            cuts = _thinking_safe(cuts, msgs, c, dialect)
        kept_turns = {s: len(turn_starts) - bisect.bisect_left(turn_starts, s) for s in cuts}
        options = [s for s in cuts if kept_turns[s] >= budget.min_recent_turns]
        if not options:
            return None  # nothing new to compact without breaking min_recent_turns
        is_kept = dialect.is_kept
        head = view.prefix[head_len] + view.fixed
        head_fixed = view.fixed + sum(view.tokens[i] for i in range(head_len) if is_kept(msgs[i]))
        # the span's kept messages stay for every cut: only their set is cut-dependent
        first = next((k for k, s in enumerate(options) if kept_turns[s] <= budget.recent_turns),
                     len(options) - 1)
        pins = self._pins(view, head_len, c)
        # kept messages before the previous cut are the previous entry's; scan the rest once
        known = tuple(i for i in state.entry.kept if i >= head_len) if state.entry else ()
        scan_from = prev_cut if state.entry else head_len
        candidates = known + tuple(i for i in range(scan_from, options[-1])
                                   if self._kept_type(msgs[i]))
        candidates = self._with_partners(msgs, candidates, head_len, c)
        foldable = self._foldable(view, turn_starts[-1], c, pins)
        k = first
        while True:
            cut = options[k]
            kept = tuple(i for i in candidates if i < cut)
            kept_tokens = sum(view.tokens[i] for i in kept)
            target = budget.target_for(head_fixed + kept_tokens)
            tail = view.prefix[c] - view.prefix[cut]
            # what the fold will take off the newest turn: the target is where the context
            # lands once the agent has read it (never over the trigger before)
            folds = tuple((i, view.digests[i]) for i in foldable if i >= cut)
            extra = min(sum(view.tokens[i] - _FOLD_TOKENS for i, _ in folds),
                        max(0, budget.trigger - target))
            room = target - head - kept_tokens - tail + extra
            # the strategy's floor, scaled to what the fixed part leaves of the trigger
            share = int(_FLOOR_SHARE * max(0, budget.trigger - head_fixed - kept_tokens))
            floor = min(self._min_budget, max(_FLOOR_MIN, share))
            if k == len(options) - 1 or (
                head + kept_tokens + tail <= target * _TAIL_SHARE and room >= floor
            ):
                break
            k += 1
        if head_fixed + kept_tokens >= budget.trigger and not self._warned_fixed:
            self._warned_fixed = True
            log.warning("agentcompact: the fixed part of the request (%d tokens: system "
                        "prompt, tools, instructions) reaches the trigger (%d tokens); "
                        "compaction cannot bring the context under it", head_fixed + kept_tokens,
                        budget.trigger)
        overrides: dict[int, tuple[str, Any, int]] = {}
        if room < floor:  # make room: the largest tool outputs of older kept turns first
            overrides = self._shrink_tail(view, cut, c, floor - room, tool_only=True,
                                          pins=pins, newest=False)
            room += _saved(view, overrides)
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
                overrides = self._shrink_tail(view, cut, c, floor - room + extra,
                                              tool_only=True, pins=pins, overrides=overrides)
                room = target - head - kept_tokens - tail + _saved(view, overrides)
                goal, folds = target, tuple(f for f in folds if f[0] not in overrides)
        # pins are bounded: the newest pinned text of the span up to the pin budget
        span_pins = [i for i in pins if i < cut and i not in kept]
        pinned, unpinned = bound_pins(
            span_pins, {i: self._pin_text(msgs[i])[1] for i in span_pins},
            int(PIN_SHARE * budget.target_for(head_fixed + kept_tokens)))
        return _Plan(
            c=c, head_len=head_len, span_start=prev_cut, cut=cut, kept=kept,
            pinned=pinned, pins=tuple(i for i in pins if i not in unpinned),
            unpinned=unpinned, recent_turns=kept_turns[cut], target=goal,
            budget_tokens=max(0, room),
            overrides=tuple(sorted(overrides.items())), reason=reason, level=level,
            before=state.tokens_at(view, c), folds=folds,
        )

    def _with_partners(self, msgs: Sequence[Any], kept: tuple[int, ...], lo: int, hi: int
                       ) -> tuple[int, ...]:
        """``kept`` and, among ``msgs[lo:hi]``, every message that answers a tool call of a
        kept one or issues a call a kept one answers (and theirs, in turn): a message kept
        verbatim (an opaque one, with a block type no dialect models, may issue calls) keeps
        its calls paired, where rendering its partner into compaction text would leave a
        call without its result, or a result without its call."""
        dialect = self._dialect
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

    def _foldable(self, view: _View, start: int, c: int, pins: Sequence[int]) -> list[int]:
        """The tool outputs of the newest turn ``[start, c)`` the fold would truncate once
        the agent has read them: over ``_TRUNCATE_FLOOR`` tokens (the cliff strategy
        archives those originals), not pinned."""
        msgs, role = view.messages, self._dialect.role
        return [i for i in range(start, c) if view.tokens[i] > _TRUNCATE_FLOOR
                and i not in pins and not self._kept_type(msgs[i]) and role(msgs[i]) == "tool"]

    def _fold_due(self, view: _View, state: _State, n: int) -> bool:
        """Whether the entry of ``state`` has folds the agent has read in ``messages[:n]``."""
        return state.entry is not None and bool(state.entry.folds) and self._read(view, state, n)

    def _read(self, view: _View, state: _State, n: int) -> bool:
        """Whether the agent has read the entry's folds: a model output follows them in
        ``messages[:n]``."""
        assert state.entry is not None
        is_model = self._dialect.is_model_output
        msgs = view.messages
        return any(is_model(msgs[k]) for k in range(max(i for i, _ in state.entry.folds) + 1,
                                                     n))

    def _fold(self, view: _View, state: _State, n: int, events: list[CompactionEvent]
              ) -> _State:
        """The entry with its folds done: each large tool output of the newest kept turn,
        whole at the compaction because the agent had not read it, truncated to about
        ``_FOLD_TOKENS`` (``Dialect.truncate``: head, tail, error lines, the handle of the
        original). Only the messages from the first fold on are sent anew (a cache write,
        1.25x, instead of a read, 0.1x, for a few thousand tokens), and every later call
        reads thousands of tokens less. Appends the event; the entry is stored."""
        t0 = time.perf_counter()
        entry = state.entry
        assert entry is not None
        before = state.tokens_at(view, n)
        overrides = dict(entry.overrides)
        dropped: list[DroppedItem] = []
        for i, digest in entry.folds:
            if i >= n or view.digests[i] != digest or i in overrides:
                continue
            copy, tokens = self._shrink(view.messages[i], view.tokens[i], _FOLD_TOKENS)
            if copy is not view.messages[i] and tokens < view.tokens[i]:
                overrides[i] = (digest, copy, tokens)
                dropped.append(DroppedItem(i, self._dialect.role(view.messages[i]),
                                           "truncated", view.tokens[i] - tokens, "tool_result"))
        # stored under the prefix that holds the read (the first ``messages[:m]`` the rule
        # calls read), not the compaction's: a retry of the compacting request, or another
        # rollout from its prefix, has not read the output and still gets it whole
        length = self._read_at(view, state, n)
        folded = replace(entry, overrides=overrides, folds=(), length=length)
        state = _State(folded)
        out = state.messages_at(view, n) if dropped else []
        problem = self._validity(view, out, n) if dropped else None
        if problem is not None:  # nothing folded, and not tried again
            folded, dropped = replace(entry, folds=(), length=length), []
            state = _State(folded)
            out = state.messages_at(view, n)
        self._store.put(view.chain[length - 1], folded)
        if out:
            after = state.tokens_at(view, n)
            events.append(CompactionEvent(
                strategy=self.strategy_name, dialect=self._dialect.name,
                tokens_before=before, tokens_after=after, messages_before=n,
                messages_after=len(out), head_len=folded.head_len,
                cut=folded.cut, reason="fold", level=folded.level,
                over_budget=after > self._budget.limit,
                latency_s=time.perf_counter() - t0, dropped=dropped,
                episode_id=self._episode_id, error=problem,
                fallback=None if problem is None else "none"))
        return state

    def _read_at(self, view: _View, state: _State, n: int) -> int:
        """The least ``m <= n`` for which :meth:`_read` holds of ``messages[:m]`` (it holds
        of ``messages[:n]``, and once it holds it holds of every longer history)."""
        assert state.entry is not None
        lo, hi = max(i for i, _ in state.entry.folds) + 1, n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._read(view, state, mid):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def _pins(self, view: _View, head_len: int, end: int) -> tuple[int, ...]:
        """Indices in ``[head_len, end)`` a plugin pins (``agentcompact_pin``). The hook is
        asked once per message and index (its answer is a function of the message, its
        index and the dialect, as the store keys already assume: a stored compaction is
        reused without asking again); answers are remembered for the plugin set they came
        from, so a compaction does not call every plugin on every message of the history."""
        hook = self._pm.hook.agentcompact_pin
        if not hook.get_hookimpls():
            return ()
        memo = self._pin_memo
        if len(memo) > _PIN_MEMO_MAX:
            memo.clear()
        dialect = self._dialect
        out = []
        for i in range(head_len, end):
            message = view.messages[i]
            found = memo.get(id(message))
            if found is not None and found[0] is message and found[1] == i:
                pinned = found[2]
            else:
                pinned = not dialect.is_synthetic(message) and any(
                    r is True for r in hook(message=message, index=i, dialect=dialect))
                memo[id(message)] = (message, i, pinned)
            if pinned:
                out.append(i)
        return tuple(out)

    def _pin_text(self, message: Any) -> tuple[tuple[str, ...], int]:
        """The pinned text of ``message`` (:func:`~agentcompact._pins.pinned_texts`) and
        its tokens, remembered by the message's identity."""
        memo = self._pin_texts
        found = memo.get(id(message))
        if found is not None and found[0] is message:
            return found[1], found[2]
        if len(memo) > _PIN_MEMO_MAX:
            memo.clear()
        texts = pinned_texts(self._dialect, message)
        tokens = sum(self._counter.count_texts(list(texts))) if texts else 0
        memo[id(message)] = (message, texts, tokens)
        return texts, tokens

    def _safe_render(self, view: _View, plan: _Plan) -> Rendered:
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
                texts = list(self._pin_text(view.messages[i])[0])
            except Exception:  # unreadable: the pin check names it
                texts = []
            pieces.append("\n\n[pinned message, verbatim]\n" + "\n".join(texts))
        text = "".join(pieces)
        return Rendered(self._dialect.text_message(text), self._meter.count_text_message(text))

    def _check(self, view: _View, plan: _Plan, rendered: Rendered, rung: str) -> _Checked:
        """The invariants, for any strategy: the assembled output passes the dialect's
        rules (problems inherited from the input aside) and the thinking-loop rule, the
        pinned text of every pin within the pin budget is in the compaction message
        verbatim, the message is within its budget (that pinned text aside), and no kept
        message's pinned text was cut."""
        message = rendered.message
        dialect = self._dialect
        trusted = rung == "safe" or isinstance(self._strategy_for(rung), CliffStrategy)
        try:  # the engine counts a third-party strategy's message itself
            tokens = 0 if message is None else (
                rendered.tokens if trusted else self._meter.count(message))
            text = dialect.text_of(message) if message is not None and plan.pinned else ""
        except Exception as exc:
            return _Checked(None, rung, rendered,
                            f"the compaction message cannot be read: {describe_error(exc)}")
        name = self.strategy_name if rung == "strategy" else rung
        entry = PrefixEntry(plan.head_len, plan.cut, message, tokens, name, rendered.level,
                            dict(plan.overrides), plan.kept, plan.folds)
        entry = self._truncate_tail(view, entry, plan)
        out = _State(entry).messages_at(view, plan.c)
        problem = self._validity(view, out, plan.c)
        if problem is None:
            for i in plan.pinned:
                try:
                    texts = self._pin_text(view.messages[i])[0]
                except Exception:
                    texts = ("",)
                if message is None or not all(t in text for t in texts):
                    problem = f"pinned message {i} is not in the compaction message verbatim"
                    break
        if problem is None and message is not None:
            pinned = sum(self._pin_text(view.messages[i])[1] for i in plan.pinned)
            allowed = plan.budget_tokens + pinned + max(64, plan.budget_tokens // 4)
            if tokens > allowed:
                problem = (f"the compaction message is {tokens} tokens, over its budget of "
                           f"{plan.budget_tokens}")
        return _Checked(entry, rung, rendered, problem)

    def _validity(self, view: _View, out: list[Any], c: int) -> str | None:
        dialect = self._dialect
        found = problems(out, dialect, allow_pending=True)
        if found:
            inherited = {key for key, _ in problems(view.messages[:c], dialect,
                                                    allow_pending=True)}
            new = [exc for key, exc in found if key not in inherited]
            if new:
                return f"output failed validation: {new[0]}"
        if dialect.thinking_loops():
            return thinking_loop_error(view.messages, c, out, dialect)
        return None

    def _kept_type(self, message: Any) -> bool:
        return self._dialect.is_kept(message) or self._dialect.is_synthetic(message)

    def _shrink_tail(self, view: _View, cut: int, c: int, excess: int, *, tool_only: bool,
                     pins: Sequence[int] = (),
                     overrides: dict[int, tuple[str, Any, int]] | None = None,
                     newest: bool = True) -> dict[int, tuple[str, Any, int]]:
        """Head+tail truncate the largest kept messages of ``[cut, c)`` until ``excess``
        tokens are saved: messages of older kept turns first, the newest turn last (with
        ``newest``; never without); instructions, opaque items and compaction messages
        never, ``pins`` only where their pinned text stays whole."""
        out = dict(overrides or {})
        start = self._newest_turn(view, cut, c)
        msgs = view.messages
        groups = (range(cut, start), range(start, c)) if newest else (range(cut, start),)
        for group in groups:
            for _ in range(3):  # a truncation may land a little over: refine
                size = {i: out[i][2] if i in out else view.tokens[i] for i in group}
                saved = 0
                for i in sorted(group, key=lambda i: -size[i]):
                    current = size[i]
                    if excess <= 0 or current <= _TRUNCATE_FLOOR // 2:
                        break
                    if view.tokens[i] <= _TRUNCATE_FLOOR or self._kept_type(msgs[i]):
                        continue
                    if tool_only and self._dialect.role(msgs[i]) != "tool":
                        continue
                    keep_tokens = max(_TRUNCATE_FLOOR // 2, current - excess)
                    copy, new_tokens = self._shrink(msgs[i], view.tokens[i], keep_tokens)
                    if copy is msgs[i] or new_tokens >= current:
                        continue
                    if i in pins and not self._keeps_pinned(msgs[i], copy):
                        continue  # the parts beside a pin may be cut, its text never
                    out[i] = (view.digests[i], copy, new_tokens)
                    excess -= current - new_tokens
                    saved += current - new_tokens
                if excess <= 0 or not saved:
                    break
        return out

    def _keeps_pinned(self, message: Any, copy: Any) -> bool:
        """Whether the truncated ``copy`` of pinned ``message`` holds its pinned text."""
        try:
            text = self._dialect.text_of(copy)
            return all(t in text for t in self._pin_text(message)[0])
        except Exception:
            return False

    def _turn_start(self, view: _View, i: int) -> bool:
        is_model = self._dialect.is_model_output
        return is_model(view.messages[i]) and (i == 0 or not is_model(view.messages[i - 1]))

    def _newest_turn(self, view: _View, cut: int, c: int) -> int:
        """Where the newest turn of the kept messages ``[cut, c)`` starts (``cut`` if none
        does)."""
        return max((s for s in range(cut, c) if self._turn_start(view, s)), default=cut)

    def _truncate_tail(self, view: _View, entry: PrefixEntry, plan: _Plan) -> PrefixEntry:
        """Last resort: head+tail truncate the largest kept messages until under the plan's
        goal; the newest turn's only over the trigger or when the plan truncated it
        already (it alone left the strategy no room under the trigger)."""
        total = _State(entry).tokens_at(view, plan.c)
        excess = total - plan.target
        if excess <= 0:
            return entry
        start = self._newest_turn(view, entry.cut, plan.c)
        newest = total > self._budget.trigger or any(i >= start for i in entry.overrides)
        overrides = self._shrink_tail(view, entry.cut, plan.c, excess, tool_only=False,
                                      pins=plan.pins, overrides=entry.overrides, newest=newest)
        return replace(entry, overrides=overrides)

    def _shrink(self, message: Any, tokens: int, keep_tokens: int) -> tuple[Any, int]:
        """Head+tail truncate ``message`` to about ``keep_tokens`` (a few refinements)."""
        try:
            chars = max(200, len(self._dialect.text_of(message)) * keep_tokens // max(tokens, 1))
            copy, size = message, tokens
            for _ in range(4):
                copy = self._dialect.truncate(message, chars)
                size = self._meter.count(copy) if copy is not message else tokens
                if size <= keep_tokens or chars <= 200:
                    break
                chars = max(200, chars * keep_tokens // size - 16)
        except Exception:  # a message the dialect cannot truncate stays as it is
            return message, tokens
        return copy, size

    # --- report -----------------------------------------------------------------------
    def _event(self, view: _View, plan: _Plan, entry: PrefixEntry | None, rung: str,
               errors: list[str], t0: float, rendered: Rendered | None) -> CompactionEvent:
        dropped = list(rendered.items) if rendered is not None and entry is not None else []
        after = _State(entry).tokens_at(view, plan.c) if entry is not None else plan.before
        if entry is not None:
            for idx, (_, _, tokens) in sorted(entry.overrides.items()):
                dropped.append(DroppedItem(idx, self._dialect.role(view.messages[idx]),
                                           "truncated", view.tokens[idx] - tokens))
        n = len(view.messages)
        n_after = (plan.head_len + len(entry.kept) + (entry.message is not None) + n - plan.cut
                   if entry is not None else n)
        event = CompactionEvent(
            strategy=self.strategy_name, dialect=self._dialect.name,
            tokens_before=plan.before, tokens_after=after, messages_before=n,
            messages_after=n_after, head_len=plan.head_len, cut=plan.cut, reason=plan.reason,
            level=entry.level if entry else 0, recent_turns=plan.recent_turns,
            over_budget=after > self._budget.limit, latency_s=time.perf_counter() - t0,
            error="; ".join(errors) if errors else None,
            fallback=None if rung == "strategy" else rung, dropped=dropped,
            episode_id=self._episode_id, unpinned=list(plan.unpinned),
        )
        if rendered is not None and entry is not None:
            event.errors = [str(e) for e in (getattr(rendered, "errors", None) or [])]
        return event

    def _finish(self, outcome: _Outcome) -> CompactionResult:                # assemble
        view, state, events = outcome.view, outcome.state, list(outcome.events)
        n = len(view.messages)
        if view.pending:  # nothing compacted, within the trigger (so the limit) by the bound
            entry = state.entry
            result = _DeferredResult(
                messages=state.messages_at(view, n), compacted=False,
                modified=entry is not None, tokens_original=0, tokens_before=0,
                tokens_after=0, head_len=entry.head_len if entry else 0,
                cut=entry.cut if entry else 0)
            result.__dict__["_count"] = functools.partial(self._figures, view, state)
            return result
        original = view.prefix[n] + view.fixed
        entry = state.entry
        out = state.messages_at(view, n)
        after = state.tokens_at(view, n)
        compacted = False
        failed = None
        if events:
            compacted = any(e.fallback != "none" for e in events)
            self._report(events)                                              # report
            failed = next((e for e in events if e.error), None)
        if failed is not None and not self._warned:
            self._warned = True
            log.warning("agentcompact: a %s compaction fell back to %s (%s); later fallbacks "
                        "of this engine go to on_compaction only", failed.strategy,
                        failed.fallback, failed.error)
        over = after > self._budget.limit
        if over and self._strict:
            raise OverBudgetError(
                f"context is {after} tokens after compaction, over the limit "
                f"{self._budget.limit}", after, self._budget.limit)
        return CompactionResult(
            messages=out, compacted=compacted, modified=entry is not None,
            tokens_original=original, tokens_before=outcome.before, tokens_after=after,
            over_budget=over, event=events[-1] if events else None, events=events,
            head_len=entry.head_len if entry else 0, cut=entry.cut if entry else 0,
        )

    def _report(self, events: Sequence[CompactionEvent]) -> None:
        """Each event to every ``on_compaction`` observer, each observer on its own.

        The compaction was validated and stored before any observer runs, and it is what
        the caller sends: an observer that raises cannot undo it. So it does not stop the
        call (the result, the store, the caller's counters and the other observers — a
        recorder — all see the same compaction); it is warned about once per engine and
        plugin, by type only (its message may quote the history)."""
        hook = self._pm.hook.agentcompact_on_compaction
        impls = hook.get_hookimpls()
        if not impls:
            return
        plugins = list(dict.fromkeys(impl.plugin for impl in reversed(impls)))  # call order
        callers = [(plugin, hook if len(plugins) == 1 else self._pm.subset_hook_caller(
            "agentcompact_on_compaction", [p for p in plugins if p is not plugin]))
            for plugin in plugins]
        for event in events:
            for plugin, caller in callers:
                try:
                    caller(event=event)
                except Exception as exc:
                    self._observer_failed(plugin, exc)

    def _observer_failed(self, plugin: object, exc: Exception) -> None:
        name = self._pm.get_name(plugin)
        if not name or name == str(id(plugin)):  # registered without a name
            name = type(plugin).__qualname__
        if name in self._failed_observers:
            return
        self._failed_observers.add(name)
        log.warning("agentcompact: plugin %s failed in agentcompact_on_compaction (%s); the "
                    "compaction stands (validated, stored and sent) and the other observers "
                    "got it; later failures of this plugin in this engine are not logged",
                    name, describe_error(exc))

    # --- measuring and lookup ---------------------------------------------------------
    def _name_bad_message(self, msgs: Sequence[Any]) -> None:
        """On the error path only: raise the dialect's error again naming the index and
        type of the first message it cannot read (never its content)."""
        dialect = self._dialect
        for i, message in enumerate(msgs):
            try:
                dialect.role(message)
                dialect.parts(message)
            except DialectError as exc:
                raise DialectError(f"message {i} ({type(message).__name__}): {exc}") from None

    def _view(self, messages: Sequence[Any]) -> _View:
        msgs = list(messages)
        with self._lock:
            self._refresh_seed()
            last = self._last_view
            if last is None:
                measured, pending = self._meter.measure_deferred(msgs)
                digests, tokens = measured.digests, measured.tokens
                view = _View(msgs, digests, tokens, chain_digests(digests, seed=self._seed),
                             [0, *itertools.accumulate(tokens)], pending=pending)
            else:
                view = self._extend_view(last, msgs)
            self._last_view = view
        return view

    def _resolve(self, view: _View) -> _View:
        """``view`` with its pending messages counted (``view`` itself when none is)."""
        if not view.pending:
            return view
        at = sorted(view.pending)
        msgs, digests = view.messages, view.digests
        with self._lock:
            counts = self._meter.count_deferred([msgs[i] for i in at], [digests[i] for i in at])
            tokens = list(view.tokens)
            for i, count in zip(at, counts):
                tokens[i] = count
            resolved = _View(msgs, digests, tokens, view.chain,
                             _prefix_sums(view.prefix, tokens, at[0]), view.fixed)
            if self._last_view is view:
                self._last_view = resolved
        return resolved

    def _figures(self, view: _View, state: _State) -> dict[str, int]:
        """The token figures of a call that compacted nothing (:class:`_DeferredResult`)."""
        view = self._resolve(view)
        n = len(view.messages)
        after = state.tokens_at(view, n)
        return {"tokens_original": view.prefix[n] + view.fixed, "tokens_before": after,
                "tokens_after": after}

    def _extend_view(self, last: _View, msgs: list[Any]) -> _View:
        """The view of ``msgs``, reusing ``last``'s figures for the leading messages that
        are the same objects (an in-process agent's growing list; the proxy's parser hands
        back the earlier objects for unchanged messages, and :class:`~agentcompact._interner.
        Interner` does for other callers parsing requests afresh). The rest is measured
        (``MessageMeter`` caches by identity and by digest)."""
        k = same_objects(msgs, last.messages)
        if k == len(last.messages) and _grown_only(last):
            return self._grow_view(last, msgs)
        digests = last.digests[:k]
        tokens = last.tokens[:k]
        pending = last.pending
        if pending and k < len(last.messages):  # the last view's messages from k on differ
            pending = {i: b for i, b in pending.items() if i < k}
        else:
            pending = dict(pending)
        if len(msgs) > k:
            self._measure_onto(msgs, k, digests, tokens, pending)
        # the chain and the prefix sums are recomputed from the first changed message
        chain = chain_digests(digests, last.chain[: _common(digests, last.digests, k)],
                              seed=self._seed)
        prefix = _prefix_sums(last.prefix, tokens, _common(tokens, last.tokens, k))
        return _View(msgs, digests, tokens, chain, prefix, pending=pending)

    def _grow_view(self, last: _View, msgs: list[Any]) -> _View:
        """The view of ``msgs``, the messages of ``last`` followed by new ones: ``last``'s
        digests, counts, chain and prefix sums are extended in place, not copied (a view
        reads only the entries of its own messages, which never change; an older view
        sharing the lists sees what it saw). Copying them cost a pass over every message
        at every call."""
        m = len(last.messages)
        digests, tokens, chain, prefix = last.digests, last.tokens, last.chain, last.prefix
        pending = dict(last.pending)
        if len(msgs) > m:
            self._measure_onto(msgs, m, digests, tokens, pending)
            extend_chain(chain, digests[m:], self._seed)
            sums = itertools.accumulate(tokens[m:], initial=prefix[-1])
            next(sums)  # the initial value: prefix[m], there already
            prefix += sums
        return _View(msgs, digests, tokens, chain, prefix, pending=pending)

    def _measure_onto(self, msgs: list[Any], k: int, digests: list[str], tokens: list[int],
                      pending: dict[int, int]) -> None:
        """Measure ``msgs[k:]`` (deferred: :meth:`MessageMeter.measure_deferred`) onto the
        lists of ``msgs[:k]``'s digests and counts, and their byte bounds into ``pending``."""
        measured, new = self._meter.measure_deferred(msgs[k:])
        digests += measured.digests
        tokens += measured.tokens
        for i, bound in new.items():
            pending[k + i] = bound

    def _lookup(self, view: _View, n: int) -> PrefixEntry | None:
        """The stored entry replacing the longest prefix of ``view.messages[:n]``."""
        with self._lock:
            return self._scan.find(view.chain, n)

    def _should_compact(self, view: _View, state: _State, n: int, tokens: int | None = None
                        ) -> bool:
        if tokens is None:
            tokens = state.tokens_at(view, n)
        hook = self._should_compact_hook
        if hook.get_hookimpls():
            decided = hook(
                messages=state.messages_at(view, n), tokens=tokens, budget=self._budget,
                dialect=self._dialect,
            )
            if decided is not None:
                if not isinstance(decided, bool):
                    raise PluginError(f"agentcompact_should_compact returned a "
                                      f"{type(decided).__name__}; expected True, False or None")
                return decided
        return tokens > self._budget.trigger


def _saved(view: _View, overrides: dict[int, tuple[str, Any, int]]) -> int:
    """Tokens the truncated copies in ``overrides`` save over the messages they replace."""
    return sum(view.tokens[i] - t for i, (_, _, t) in overrides.items())


def _grown_only(view: _View) -> bool:
    """Whether ``view``'s lists hold its messages' entries and no more (no later view
    extended them in place: :meth:`Engine._grow_view` may)."""
    m = len(view.messages)
    return len(view.digests) == len(view.tokens) == len(view.chain) == m == len(view.prefix) - 1


def _common(a: list[Any], b: list[Any], k: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, known to be at least ``k``."""
    m = min(len(a), len(b))
    if a[k:m] == b[k:m]:  # list compares run in C (identity first)
        return m
    return next(i for i in range(k, m) if a[i] != b[i])


def _prefix_sums(prefix: list[int], tokens: list[int], t: int) -> list[int]:
    """The prefix sums of ``tokens`` (``out[i]`` = tokens of the first ``i``), reusing
    ``prefix``'s first ``t + 1`` (``tokens[:t]`` is unchanged since it was computed)."""
    out = prefix[: t + 1]
    out += itertools.accumulate(tokens[t:], initial=out[-1])
    del out[t + 1]  # accumulate repeats its initial value
    return out


_PIN_MEMO_MAX = 200_000  # pin answers remembered (more: forgotten, asked again)

_SUMMARY_OVERHEAD = 32  # tokens of a summary message besides its output (header, framing)


def _min_budget(strategy: Any) -> int:
    """The smallest ``budget_tokens`` the strategy works with: its ``min_budget_tokens``,
    else its minimum output (``min_output_tokens``, ``min_block_output_tokens``) plus the
    header and framing, else 0."""
    for attr in ("min_budget_tokens", "min_output_tokens", "min_block_output_tokens"):
        value = getattr(strategy, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return max(0, value + (0 if attr == "min_budget_tokens" else _SUMMARY_OVERHEAD))
    return 0
