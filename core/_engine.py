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
- **one-way pipeline**: extend the history (``_scope``) → find the stored prefix →
  fold → decide (``_plan.decide``) → plan (``_plan.plan``) → strategy (``_rungs``) →
  check (``_check.check``) → store → assemble → report; the engine checks validity
  (dialect rules, the thinking-loop rule), pins, kept messages (instructions, opaque
  items, compaction messages fed back in) and the budget for any strategy, and stores
  only what passed;
- **fail-open**: a strategy that raises or fails a check yields the cliff result, then a
  plain safe cut, then the uncompacted history — every rung validated; the errors and the
  rung go to ``on_compaction`` (no message content), never the context; an observer
  that raises is warned about and does not undo the stored compaction (``_observers``);
- **deterministic**; the caller's list and messages are never mutated; kept messages are
  passed through by reference.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Generator, Sequence
from typing import Any

import pluggy

from ._budget import Budget
from ._check import Checked, check, compaction_event, describe_error, safe_render
from ._events import CompactionEvent, new_id
from ._fixed import FixedTokens
from ._fold import fold_due, fold_stored
from ._history import History
from ._interner import Interner
from ._observers import Observers
from ._pins import PinLookup
from ._plan import State, decide, min_budget
from ._plan import plan as plan_cut
from ._pluginmanager import get_plugin_manager, registry
from ._result import CompactionResult, Outcome, assemble
from ._rungs import Rungs
from ._scope import StoreScope, settings_fingerprint
from ._settings import StrategySettings, build_strategy
from ._store import InMemoryPrefixStore, PrefixEntry, PrefixStore
from ._tokens import MessageMeter, TokenCounter, make_counter
from .dialects._base import Dialect
from .errors import ConfigError
from .strategies._base import CompactionRequest, Rendered

__all__ = ["CompactionResult", "Engine", "describe_error"]

log = logging.getLogger("agentcompact")


_Pipeline = Generator[tuple[str, CompactionRequest], tuple[Rendered | None, str | None],
                      Outcome]


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
        self._strategy, self._settings = build_strategy(strategy, reg.strategy_factory)
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
        self._lock = threading.RLock()
        self._interner = Interner()
        self._fixed = FixedTokens(self._counter, getattr(self._dialect, "fixed_keys", None))
        self._warned_fixed = False
        self._observers = Observers(self._pm)
        self._min_budget = min_budget(self._strategy)
        self._rungs = Rungs(self._strategy, self.strategy_name)
        #: pins and pinned texts, remembered for the plugin set the scope's seed is of
        self._pins = PinLookup(self._pm, self._dialect, self._counter)
        self._scope = StoreScope(self._meter, self._store, self._pm, self._pins,
                                 self.fingerprint, episode_id, self._lock)
        self._should_compact_hook = self._pm.hook.agentcompact_should_compact
        self._scope.refresh()
        self._assemble = functools.partial(assemble, budget=self._budget, strict=strict,
                                           observers=self._observers,
                                           resolve=self._scope.history)

    # --- store scope: configuration fingerprint and episode ---------------------------
    def fingerprint(self) -> str:
        """A digest of everything that changes this engine's output for a given history:
        the strategy and its settings, the budget, the dialect, the counter, the plugins
        that pin or render, output validation. It seeds the chain digests that key the
        prefix store (with the episode), so engines of other settings sharing a store
        never reuse each other's compactions."""
        return settings_fingerprint(self._strategy, self.strategy_name, self._settings,
                                    self._budget, self._dialect, self._counter, self._pm)

    def new_episode(self, episode_id: str | None = None) -> str:
        """Start a new episode (an RL rollout, a new task on a reused client): later
        compactions are stored under a scope of their own, so nothing compacted in an
        earlier episode is reused, and events carry the new ``episode_id`` (default: a
        fresh id). Returns it. ``Engine(episode_id=...)`` scopes from the start."""
        with self._lock:
            self._scope.episode_id = episode_id if episode_id is not None else new_id()
            self._scope.refresh(force=True)
        return self._scope.episode_id

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
        return self._scope.episode_id

    # --- public API -----------------------------------------------------------------
    def compact(self, messages: Sequence[Any], *, force: bool = False,
                fixed_tokens: int = 0) -> CompactionResult:
        """The messages to send for ``messages`` (see the module docstring).

        ``force`` compacts even under the trigger, one escalation level harder (reactive
        retry after a provider's context-length error). ``fixed_tokens`` is what the request
        carries besides the messages (system prompt, tool schemas): the budget covers both,
        and the result's token figures include it.
        """
        with self._rungs.handles():
            outcome = self._rungs.run(self._pipeline(messages, force, fixed_tokens),
                                      self._dialect, messages)
            return self._assemble(outcome)

    async def acompact(self, messages: Sequence[Any], *, force: bool = False,
                       fixed_tokens: int = 0) -> CompactionResult:
        """``compact`` for async code: awaits strategies that define ``acompact``."""
        with self._rungs.handles():
            outcome = await self._rungs.arun(self._pipeline(messages, force, fixed_tokens),
                                             self._dialect, messages)
            return self._assemble(outcome)

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
        history = self._scope.history(messages, resolve=True)
        n = len(history.messages)
        return State(self._scope.lookup(history, n)).tokens_at(history, n)

    def precompact(self, messages: Sequence[Any]) -> CompactionResult:
        """Compact ``messages`` now, under the trigger, and store the result in the prefix
        store: the next ``compact`` of a history extending ``messages`` substitutes it
        (background compaction, see ``agentcompact._background``). Reason ``"background"``.
        """
        with self._rungs.handles():
            outcome = self._rungs.run(self._precompact_pipeline(messages), self._dialect,
                                      messages)
            return self._assemble(outcome)

    async def aprecompact(self, messages: Sequence[Any]) -> CompactionResult:
        """``precompact`` for async code (awaits strategies that define ``acompact``)."""
        with self._rungs.handles():
            outcome = await self._rungs.arun(self._precompact_pipeline(messages),
                                             self._dialect, messages)
            return self._assemble(outcome)

    def _precompact_pipeline(self, messages: Sequence[Any]) -> _Pipeline:
        if not isinstance(messages, (list, tuple)):
            raise ConfigError(f"messages must be a list, got {type(messages).__name__}")
        history = self._scope.history(messages, resolve=True)
        n = len(history.messages)
        state = State(self._scope.lookup(history, n))
        before = state.tokens_at(history, n)
        entry, event = yield from self._compact_at(history, n, state, "background", 0)
        if entry is not None:
            self._store.put(history.chain[entry.cut - 1], entry)  # validated: see _check
            state = State(entry)
        return Outcome(history, before, state, (event,) if event is not None else ())

    # --- the pipeline ---------------------------------------------------------------
    # extend the history → find the stored prefix → (fold) → decide → plan → strategy →
    # check → store → assemble → report.
    def _pipeline(self, messages: Sequence[Any], force: bool, fixed: int = 0) -> _Pipeline:
        if not isinstance(messages, (list, tuple)):
            raise ConfigError(f"messages must be a list, got {type(messages).__name__}")
        history = self._scope.history(messages)                            # extend
        history.fixed = fixed
        n = len(history.messages)
        state = State(self._scope.lookup(history, n))                      # stored prefix
        events: list[CompactionEvent] = []
        unfolded = -1
        if fold_due(history, state.entry, n):
            history = self._scope.history(history, resolve=True)
            unfolded = state.tokens_at(history, n)
            state = fold_stored(history, state, n, self._store, events,   # fold
                                strategy=self.strategy_name, limit=self._budget.limit,
                                episode_id=self._scope.episode_id)
        if history.pending:
            # under the trigger by the bound alone: nothing to decide, counted when read
            if not force and not self._should_compact_hook.get_hookimpls() and (
                    state.tokens_at(history, n) + sum(history.pending.values())
                    <= self._budget.trigger):
                return Outcome(history, -1, state, ())
            history = self._scope.history(history, resolve=True)
        before = state.tokens_at(history, n)
        decided = force or decide(history, state, n, self._budget, self._should_compact_hook,
                                  before)
        if not decided:                                                    # decide
            return Outcome(history, before if unfolded < 0 else unfolded, state, tuple(events))
        points = [s for s in history.turn_starts()
                  if s > (state.entry.cut if state.entry else 0)]
        if not points or points[-1] != n:
            points.append(n)
        initial = state.entry
        for c in points:
            last = c == n
            if fold_due(history, state.entry, c):
                state = fold_stored(  # as a call at c would
                    history, state, c, self._store, events, strategy=self.strategy_name,
                    limit=self._budget.limit, episode_id=self._scope.episode_id)
            if not last and state.tokens_at(history, c) <= self._budget.trigger:
                continue
            if last and not force and state.entry is not initial and not decide(
                history, state, n, self._budget, self._should_compact_hook
            ):
                break
            reason = "reactive" if force and last else ("trigger" if last else "replay")
            entry, event = yield from self._compact_at(history, c, state, reason,
                                                       1 if force and last else 0)
            if event is not None:
                events.append(event)
            if entry is not None:                                          # store
                self._store.put(history.chain[entry.cut - 1], entry)  # checked
                state = State(entry)
        return Outcome(history, before, state, tuple(events))

    def _compact_at(
        self, history: History, c: int, state: State, reason: str, level: int,
    ) -> Generator[tuple[str, CompactionRequest], tuple[Rendered | None, str | None],
                   tuple[PrefixEntry | None, CompactionEvent | None]]:
        t0 = time.perf_counter()
        plan = plan_cut(history, state.entry, self._budget, self._pins, c=c,  # plan
                        reason=reason, level=level, floor_tokens=self._min_budget)
        if plan is None:
            return None, None
        if plan.fixed_part >= self._budget.trigger and not self._warned_fixed:
            self._warned_fixed = True
            log.warning("agentcompact: the fixed part of the request (%d tokens: system "
                        "prompt, tools, instructions) reaches the trigger (%d tokens); "
                        "compaction cannot bring the context under it", plan.fixed_part,
                        self._budget.trigger)
        request = CompactionRequest(
            messages=history.messages[:c], dialect=self._dialect, head_len=plan.head_len,
            span_start=plan.span_start, cut=plan.cut, budget_tokens=plan.budget_tokens,
            meter=self._meter, pm=self._pm, level=level, episode_id=self._scope.episode_id,
            reason=reason, kept=frozenset(plan.kept), pins=frozenset(plan.pins),
            unpinned=frozenset(plan.unpinned), history=history,
        )
        errors: list[str] = []
        checked: Checked | None = None
        rungs = self._rungs
        for rung in rungs.names:
            rendered: Rendered | None
            if rung == "safe":
                rendered, error = safe_render(history, plan, self._pins), None
            else:
                rendered, error = yield rung, request                      # strategy
            name = rungs.label(rung)
            if rendered is None:
                errors.append(f"{name}: {error}")
                continue
            checked = check(history, plan, rendered, budget=self._budget,   # check
                            pins=self._pins, rung=rung, name=name,
                            trusted=rungs.trusted(rung))
            if checked.problem is None:
                break
            errors.append(f"{name}: {checked.problem}")
            checked = None
        event = compaction_event(history, plan, checked, errors, t0,
                                 strategy=self.strategy_name, limit=self._budget.limit,
                                 episode_id=self._scope.episode_id)
        return (checked.entry if checked is not None else None), event
