"""The engine: decide, cut, render, store, validate — the same way for every strategy.

``Engine.compact(messages)`` returns the list to send. Rules it keeps for any strategy:

- **never compact a compaction**: strategies receive original messages; a compaction
  message that comes back as input is never rendered again;
- **prefix store**: a compaction is stored under the chain digest of the original prefix
  it replaced; later calls carrying that prefix reuse the identical compacted prefix until
  the next cliff (cache hits). A long history arriving at once is compacted by replaying
  the threshold crossings at each turn start, so it gets the result an incrementally
  called engine would have;
- **fail-open**: a strategy that raises yields the cliff result (or the uncompacted
  history when even that fails); the error goes to ``on_compaction``, never the context;
- **deterministic**; the caller's list and messages are never mutated; kept messages are
  passed through by reference.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import operator
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pluggy
import xxhash

from .budget import Budget
from .dialects.base import Dialect
from .errors import AgentCompactError, ConfigError, OverBudgetError
from .events import CompactionEvent, DroppedItem
from .pluginmanager import get_plugin_manager, registry
from .store import InMemoryPrefixStore, PrefixEntry, PrefixStore, chain_digests
from .strategies.base import CompactionRequest, Rendered
from .strategies.cliff import CliffStrategy
from .tokens import MessageMeter, TokenCounter, make_counter
from .turns import split_turns, validate

__all__ = ["CompactionResult", "Engine"]

_TAIL_SHARE = 0.75  # kept turns may use this share of the target; the rest is for rendering
_TRUNCATE_FLOOR = 1_000  # tokens: kept messages above this may be truncated (last resort)


@dataclass
class CompactionResult:
    """What ``Engine.compact`` returns.

    ``messages`` is the list to send. ``compacted`` is true when this call performed a
    compaction; ``modified`` when ``messages`` differs from the input at all (a stored
    compacted prefix was substituted). ``tokens_original`` is the input history,
    ``tokens_before`` what would have been sent without a new compaction,
    ``tokens_after`` what is sent.
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


@dataclass
class _View:
    messages: list[Any]
    digests: list[str]
    tokens: list[int]
    chain: list[str]
    prefix: list[int]  # prefix[i] = tokens of messages[:i]
    fixed: int = 0  # tokens sent besides the messages (system prompt, tool schemas)
    raw: list[Any] | None = None  # digests of each message's JSON as sent, if taken


@dataclass
class _State:
    entry: PrefixEntry | None

    def tokens_at(self, view: _View, end: int) -> int:
        e = self.entry
        if e is None:
            return view.prefix[end] + view.fixed
        total = view.fixed + view.prefix[e.head_len] + e.message_tokens
        total += view.prefix[end] - view.prefix[e.cut]
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
        if e.message is not None:
            out.append(e.message)
        tail = msgs[e.cut : end]
        for idx, (digest, copy, _) in e.overrides.items():
            if e.cut <= idx < end and view.digests[idx] == digest:
                tail[idx - e.cut] = copy
        return out + tail


_Pipeline = Generator[CompactionRequest, tuple[Rendered | None, str | None],
                      tuple[_View, int, _State, list[CompactionEvent]]]


def _strategy_settings(settings: dict[str, Any] | None, summarizer: Any,
                       **shortcuts: str | None) -> dict[str, Any]:
    """The strategy factory's keyword arguments: ``strategy_settings`` plus the summarizer
    options given to the engine directly (a key given twice is an error, not an override)."""
    out = dict(settings or {})
    extra: dict[str, Any] = {k: v for k, v in shortcuts.items() if v is not None}
    if summarizer is not None:
        if isinstance(summarizer, dict):
            extra.update(summarizer)
        else:
            extra["summarizer"] = summarizer
    clash = sorted(set(out) & set(extra))
    if clash:
        raise ConfigError(f"summarizer option(s) {', '.join(clash)} given twice "
                          "(in strategy_settings and as engine arguments)")
    out.update(extra)
    return out


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

    :param strategy: a registered strategy name or a strategy object.
    :param dialect: a registered dialect name or a ``Dialect``.
    :param budget: the token budget (or use ``trigger_tokens=``/``target_tokens=``).
    :param counter: ``"tiktoken"`` (default, o200k_base), ``"tiktoken:ENC"``, ``"hf:PATH"``,
        ``"chars"`` or a ``TokenCounter``.
    :param store: a ``PrefixStore`` (default: in-memory LRU); share one between engines
        (or proxy workers) to share compacted prefixes.
    :param plugins: a pluggy ``PluginManager`` (default: the process-wide one).
    :param strict: raise ``OverBudgetError`` when the context is still over the budget's
        limit after every escalation (default: send it anyway and flag ``over_budget``).
    :param episode_id: stamped on events for RL export.
    :param strategy_settings: keyword arguments for the strategy factory.
    :param summarizer: for the LLM strategies (``summary``, ``parallel``): a
        :class:`~agentcompact.summarizer.Summarizer`, or a dict of its settings.
    :param base_url: shortcut: the summarizer's OpenAI-compatible base URL (with ``/v1``).
    :param model: shortcut: the summarizer's model name.
    :param api_key: shortcut: the summarizer's API key. Unset shortcuts fall back to the
        ``AGENTCOMPACT_SUMMARIZER_*`` environment variables.
    :param max_cached_messages: bound on the per-message token/digest cache (default
        200,000 entries); long-lived servers holding many engines lower it.
    """

    def __init__(
        self,
        strategy: str | Any = "cliff",
        dialect: str | Dialect = "openai_chat",
        budget: Budget | None = None,
        *,
        trigger_tokens: int | None = None,
        target_tokens: int | None = None,
        counter: str | TokenCounter | None = None,
        store: PrefixStore | None = None,
        plugins: pluggy.PluginManager | None = None,
        strict: bool = False,
        validate_output: bool = True,
        episode_id: str | None = None,
        strategy_settings: dict[str, Any] | None = None,
        summarizer: Any = None,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        max_cached_messages: int | None = None,
    ) -> None:
        self.pm = plugins if plugins is not None else get_plugin_manager()
        reg = registry(self.pm)
        self.dialect = reg.dialect(dialect) if isinstance(dialect, str) else dialect
        self.budget = _make_budget(budget, trigger_tokens, target_tokens)
        settings = _strategy_settings(strategy_settings, summarizer, base_url=base_url,
                                      model=model, api_key=api_key)
        if isinstance(strategy, str):
            factory = reg.strategy_factory(strategy)
            _check_settings(strategy, factory, settings)
            self.strategy = factory(**settings)
        else:
            if settings:
                raise ConfigError("strategy settings or summarizer options given with a "
                                  "strategy object; configure the object instead")
            self.strategy = strategy
        if not callable(getattr(self.strategy, "compact", None)):
            raise ConfigError(f"strategy {self.strategy!r} has no compact(request) method")
        self._fallback = CliffStrategy()
        self.counter = make_counter(counter)
        if max_cached_messages is not None:
            if max_cached_messages <= 0:
                raise ConfigError(f"max_cached_messages must be positive, got "
                                  f"{max_cached_messages}")
            self.meter = MessageMeter(self.counter, self.dialect,
                                      max_entries=max_cached_messages)
        else:
            self.meter = MessageMeter(self.counter, self.dialect)
        self.store: PrefixStore = store if store is not None else InMemoryPrefixStore()
        self.strict = strict
        self.validate_output = validate_output
        self.episode_id = episode_id
        self._lock = threading.RLock()
        self._last_view: _View | None = None
        # the last prefix-store lookup: (store, its version, n, chain key of n, hit length)
        self._scan: tuple[Any, int, int, str, int] | None = None
        self._by_json = type(self.dialect).digest is Dialect.digest
        self._fixed_cache: dict[str, int] = {}
        self._fixed_last: tuple[tuple[Any, Any, Any], int] | None = None

    @property
    def strategy_name(self) -> str:
        return str(getattr(self.strategy, "name", type(self.strategy).__name__))

    # --- public API -----------------------------------------------------------------
    def compact(self, messages: Sequence[Any], *, force: bool = False,
                fixed_tokens: int = 0) -> CompactionResult:
        """The messages to send for ``messages`` (see the module docstring).

        ``force`` compacts even under the trigger, one escalation level harder (reactive
        retry after a provider's context-length error). ``fixed_tokens`` is what the request
        carries besides the messages (system prompt, tool schemas): the budget covers both,
        and the result's token figures include it.
        """
        return self._drive(self._pipeline(messages, force, fixed_tokens))

    async def acompact(self, messages: Sequence[Any], *, force: bool = False,
                       fixed_tokens: int = 0) -> CompactionResult:
        """``compact`` for async code: awaits strategies that define ``acompact``."""
        return await self._adrive(self._pipeline(messages, force, fixed_tokens))

    def compact_request(self, body: dict[str, Any], *, force: bool = False
                        ) -> tuple[dict[str, Any], CompactionResult]:
        """Compact a provider request body; returns (body to send, result).

        The body is returned unchanged (same object) when nothing was modified. The
        system prompt, instructions and tool schemas count against the budget.
        """
        result = self.compact(self.dialect.messages_of(body), force=force,
                              fixed_tokens=self.fixed_tokens(body))
        if not result.modified:
            return body, result
        return self.dialect.with_messages(body, result.messages), result

    def fixed_tokens(self, body: dict[str, Any]) -> int:
        """Tokens of a request body besides its messages: system, instructions, tools.

        Remembered by content, and by identity for the last body's values (a proxy's next
        request shares them when unchanged: Claude Code's ~80 kB of tools are then not
        serialized again). Like messages, the values are taken as immutable once counted.
        """
        values = (body.get("system"), body.get("instructions"), body.get("tools"))
        last = self._fixed_last
        if last is not None and all(map(operator.is_, values, last[0])):
            return last[1]
        texts = [value if isinstance(value, str) else orjson.dumps(value).decode()
                 for value in values if value]
        cached = 0
        if texts:
            key = "\x00".join(texts)
            found = self._fixed_cache.get(key)
            if found is None:
                found = sum(self.counter.count_texts(texts))
                if len(self._fixed_cache) > 256:
                    self._fixed_cache.clear()
                self._fixed_cache[key] = found
            cached = found
        self._fixed_last = (values, cached)
        return cached

    @property
    def store_version(self) -> int | None:
        """The prefix store's ``version`` (changes on every ``put``), or ``None`` for a
        store without one."""
        version = getattr(self.store, "version", None)
        return version if isinstance(version, int) else None

    def token_bound(self, messages: Sequence[Any]) -> int | None:
        """An upper bound on :meth:`count` of ``messages`` without tokenizing the ones not
        counted yet, or ``None`` when the counter gives no such bound."""
        with self._lock:
            return self.meter.bound(messages)

    def leaves_unchanged(self, tokens_at_most: int, since_version: int | None) -> bool:
        """Whether :meth:`compact` (not forced) is certain to return a history unchanged,
        knowing that it holds at most ``tokens_at_most`` tokens (fixed tokens included),
        and that a history it extends was left unchanged when the prefix store's
        ``version`` was ``since_version``. Then no stored prefix can apply (none did to
        the shorter history, and none was put since) and the trigger is not reached.
        ``False`` whenever that cannot be known: a store without a version, or a plugin
        deciding ``agentcompact_should_compact``."""
        return (since_version is not None and since_version == self.store_version
                and tokens_at_most <= self.budget.trigger
                and not self.pm.hook.agentcompact_should_compact.get_hookimpls())

    def count(self, messages: Sequence[Any]) -> int:
        """Tokens of ``messages`` in this engine's counter (cached per message)."""
        with self._lock:
            return sum(self.meter.measure(messages).tokens)

    def context_tokens(self, messages: Sequence[Any]) -> int:
        """Tokens that would be sent for ``messages`` without a new compaction (the stored
        compacted prefix substituted)."""
        view = self._view(messages)
        n = len(view.messages)
        return _State(self._lookup(view, n)).tokens_at(view, n)

    def precompact(self, messages: Sequence[Any]) -> CompactionResult:
        """Compact ``messages`` now, under the trigger, and store the result in the prefix
        store: the next ``compact`` of a history extending ``messages`` substitutes it
        (background compaction, see ``agentcompact.background``). Reason ``"background"``.
        """
        return self._drive(self._precompact_pipeline(messages))

    async def aprecompact(self, messages: Sequence[Any]) -> CompactionResult:
        """``precompact`` for async code (awaits strategies that define ``acompact``)."""
        return await self._adrive(self._precompact_pipeline(messages))

    def _precompact_pipeline(self, messages: Sequence[Any]
                             ) -> _Pipeline:
        if not isinstance(messages, (list, tuple)):
            raise ConfigError(f"messages must be a list, got {type(messages).__name__}")
        view = self._view(messages)
        n = len(view.messages)
        state = _State(self._lookup(view, n))
        before = state.tokens_at(view, n)
        starts = split_turns(view.messages, self.dialect).starts
        entry, event = yield from self._compact_at(view, starts, n, state, "background", 0)
        if entry is not None:
            self.store.put(view.chain[entry.cut - 1], entry)
            state = _State(entry)
        return view, before, state, [event] if event is not None else []

    # --- driving a pipeline: the only difference between the sync and async APIs -------
    def _drive(self, gen: _Pipeline) -> CompactionResult:
        try:
            request = next(gen)
            while True:
                request = gen.send(self._render_sync(request))
        except StopIteration as stop:
            return self._finish(stop.value)

    async def _adrive(self, gen: _Pipeline) -> CompactionResult:
        try:
            request = next(gen)
            while True:
                request = gen.send(await self._render_async(request))
        except StopIteration as stop:
            return self._finish(stop.value)

    # --- rendering with fallbacks -----------------------------------------------------
    def _render_sync(self, request: CompactionRequest) -> tuple[Rendered | None, str | None]:
        try:
            rendered = self.strategy.compact(request)
            if inspect.isawaitable(rendered):
                raise ConfigError(f"strategy {self.strategy_name!r} is async-only: use acompact")
            return rendered, None
        except Exception as exc:  # fail-open: any strategy error falls back to cliff
            return self._fallback_render(request, exc)

    async def _render_async(self, request: CompactionRequest
                            ) -> tuple[Rendered | None, str | None]:
        try:
            acompact = getattr(self.strategy, "acompact", None)
            if acompact is not None:
                return await acompact(request), None
            rendered = self.strategy.compact(request)
            if inspect.isawaitable(rendered):
                rendered = await rendered
            return rendered, None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._fallback_render(request, exc)

    def _fallback_render(self, request: CompactionRequest, exc: Exception
                         ) -> tuple[Rendered | None, str | None]:
        error = f"{self.strategy_name}: {type(exc).__name__}: {exc}"
        if self.strategy_name == "cliff" and isinstance(self.strategy, CliffStrategy):
            return None, error
        try:
            return self._fallback.compact(request), error
        except Exception as exc2:
            return None, f"{error}; cliff fallback: {type(exc2).__name__}: {exc2}"

    # --- the pipeline ---------------------------------------------------------------
    def _pipeline(self, messages: Sequence[Any], force: bool, fixed: int = 0
                  ) -> _Pipeline:
        if not isinstance(messages, (list, tuple)):
            raise ConfigError(f"messages must be a list, got {type(messages).__name__}")
        view = self._view(messages)
        view.fixed = fixed
        n = len(view.messages)
        state = _State(self._lookup(view, n))
        before = state.tokens_at(view, n)
        events: list[CompactionEvent] = []
        if not (force or self._should_compact(view, state, n)):
            return view, before, state, events
        turns = split_turns(view.messages, self.dialect)
        points = [s for s in turns.starts if s > (state.entry.cut if state.entry else 0)]
        if not points or points[-1] != n:
            points.append(n)
        initial = state.entry
        for c in points:
            last = c == n
            if not last and state.tokens_at(view, c) <= self.budget.trigger:
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
            if entry is not None:
                self.store.put(view.chain[entry.cut - 1], entry)
                state = _State(entry)
        return view, before, state, events

    def _compact_at(
        self, view: _View, starts: Sequence[int], c: int, state: _State, reason: str, level: int,
    ) -> Generator[CompactionRequest, tuple[Rendered | None, str | None],
                   tuple[PrefixEntry | None, CompactionEvent | None]]:
        t0 = time.perf_counter()
        msgs = view.messages
        turn_starts = [s for s in starts if s < c]
        if not turn_starts:
            return None, None
        head_len = turn_starts[0]
        while head_len > 0 and self.dialect.is_synthetic(msgs[head_len - 1]):
            head_len -= 1
        prev_cut = state.entry.cut if state.entry else turn_starts[0]
        cuts = [s for s in turn_starts if s > prev_cut] + [c]  # cuts[-1-r] keeps r turns
        budget = self.budget
        before = state.tokens_at(view, c)
        max_r = len(cuts) - 1
        if max_r < budget.min_recent_turns:
            return None, None  # nothing new to compact without breaking min_recent_turns
        head = view.prefix[head_len] + view.fixed
        r = min(budget.recent_turns, max_r)
        while r > budget.min_recent_turns and (
            head + view.prefix[c] - view.prefix[cuts[-1 - r]] > budget.target * _TAIL_SHARE
        ):
            r -= 1
        cut = cuts[-1 - r]
        tail = view.prefix[c] - view.prefix[cut]
        request = CompactionRequest(
            messages=msgs[:c], dialect=self.dialect, head_len=head_len, span_start=prev_cut,
            cut=cut, budget_tokens=max(0, budget.target - head - tail), meter=self.meter,
            pm=self.pm, level=level, episode_id=self.episode_id, reason=reason,
        )
        rendered, error = yield request
        if rendered is None:
            event = self._event(view, state, before, before, head_len, cut, reason, r, t0,
                                error=error, fallback="none")
            return None, event
        entry = PrefixEntry(head_len, cut, rendered.message, rendered.tokens,
                            self.strategy_name if error is None else "cliff", rendered.level)
        entry = self._truncate_tail(view, entry, c)
        after = _State(entry).tokens_at(view, c)
        event = self._event(view, state, before, after, head_len, cut, reason, r, t0,
                            error=error, fallback="cliff" if error else None,
                            items=rendered.items, entry=entry)
        event.errors = list(getattr(rendered, "errors", None) or [])
        return entry, event

    def _truncate_tail(self, view: _View, entry: PrefixEntry, c: int) -> PrefixEntry:
        """Last resort: head+tail truncate the largest kept messages until under target."""
        state = _State(entry)
        excess = state.tokens_at(view, c) - self.budget.target
        if excess <= 0:
            return entry
        overrides = dict(entry.overrides)
        order = sorted(range(entry.cut, c), key=lambda i: -view.tokens[i])
        for i in order:
            tokens = view.tokens[i]
            if excess <= 0 or tokens <= _TRUNCATE_FLOOR:
                break
            message = view.messages[i]
            keep_tokens = max(_TRUNCATE_FLOOR // 2, tokens - excess)
            copy, new_tokens = self._shrink(message, tokens, keep_tokens)
            if copy is message:
                continue
            overrides[i] = (view.digests[i], copy, new_tokens)
            excess -= tokens - new_tokens
        return PrefixEntry(entry.head_len, entry.cut, entry.message, entry.message_tokens,
                           entry.strategy, entry.level, overrides)

    def _shrink(self, message: Any, tokens: int, keep_tokens: int) -> tuple[Any, int]:
        """Head+tail truncate ``message`` to about ``keep_tokens`` (a few refinements)."""
        chars = max(200, len(self.dialect.text_of(message)) * keep_tokens // max(tokens, 1))
        copy, size = message, tokens
        for _ in range(4):
            copy = self.dialect.truncate(message, chars)
            size = self.meter.count(copy) if copy is not message else tokens
            if size <= keep_tokens or chars <= 200:
                break
            chars = max(200, chars * keep_tokens // size - 16)
        return copy, size

    def _event(
        self, view: _View, state: _State, before: int, after: int, head_len: int, cut: int,
        reason: str, r: int, t0: float, *, error: str | None = None,
        fallback: str | None = None, items: list[DroppedItem] | None = None,
        entry: PrefixEntry | None = None,
    ) -> CompactionEvent:
        dropped = list(items or [])
        if entry is not None:
            for idx, (_, _, tokens) in sorted(entry.overrides.items()):
                dropped.append(DroppedItem(idx, self.dialect.role(view.messages[idx]),
                                           "truncated", view.tokens[idx] - tokens))
        n_after = (head_len + 1 + len(view.messages) - cut) if entry else len(view.messages)
        return CompactionEvent(
            strategy=self.strategy_name, dialect=self.dialect.name, tokens_before=before,
            tokens_after=after, messages_before=len(view.messages), messages_after=n_after,
            head_len=head_len, cut=cut, reason=reason,
            level=entry.level if entry else 0, recent_turns=r,
            over_budget=after > self.budget.limit, latency_s=time.perf_counter() - t0,
            error=error, fallback=fallback, dropped=dropped, episode_id=self.episode_id,
        )

    def _finish(self, outcome: tuple[_View, int, _State, list[CompactionEvent]]
                ) -> CompactionResult:
        view, before, state, events = outcome
        n = len(view.messages)
        original = view.prefix[n] + view.fixed
        entry = state.entry
        out = state.messages_at(view, n)
        after = state.tokens_at(view, n)
        compacted = any(e.fallback != "none" and e.cut for e in events if e.error is None
                        or e.fallback == "cliff")
        if compacted and self.validate_output:
            out, after, entry = self._checked(view, out, after, entry, events)
            compacted = entry is not None
        for event in events:
            self.pm.hook.agentcompact_on_compaction(event=event)
        over = after > self.budget.limit
        if over and self.strict:
            raise OverBudgetError(
                f"context is {after} tokens after compaction, over the limit "
                f"{self.budget.limit}", after, self.budget.limit)
        return CompactionResult(
            messages=out, compacted=compacted, modified=entry is not None,
            tokens_original=original,
            tokens_before=before, tokens_after=after,
            over_budget=over, event=events[-1] if events else None, events=events,
            head_len=entry.head_len if entry else 0, cut=entry.cut if entry else 0,
        )

    def _checked(self, view: _View, out: list[Any], after: int, entry: PrefixEntry | None,
                 events: list[CompactionEvent]) -> tuple[list[Any], int, PrefixEntry | None]:
        try:
            validate(out, self.dialect, allow_pending=True)
        except AgentCompactError as exc:
            if events:
                events[-1].error = f"output failed validation: {exc}"
                events[-1].fallback = "none"
            return list(view.messages), view.prefix[len(view.messages)] + view.fixed, None
        return out, after, entry

    # --- measuring and lookup ---------------------------------------------------------
    def _view(self, messages: Sequence[Any]) -> _View:
        msgs = list(messages)
        with self._lock:
            last = self._last_view
            if last is None:
                measured = self.meter.measure(msgs)
                digests, tokens = measured.digests, measured.tokens
                view = _View(msgs, digests, tokens, chain_digests(digests),
                             [0, *itertools.accumulate(tokens)])
            else:
                view = self._extend_view(last, msgs)
            self._last_view = view
        return view

    def _extend_view(self, last: _View, msgs: list[Any]) -> _View:
        """The view of ``msgs``, reusing ``last``'s figures for the messages they share.

        Shared are the leading messages that are the same objects (an in-process agent's
        growing list), then, position by position, messages whose JSON is byte-identical
        to the previous call's (a request parsed afresh, as a proxy sees it): byte-identical
        JSON has the same digest, so these reuse the digest and the count the meter would
        return (``MessageMeter`` caches counts by digest). Only with the canonical JSON
        digest (a dialect with its own ``digest`` is always measured). Everything else is
        measured.
        """
        old = last.messages
        overlap = min(len(msgs), len(old))
        if all(map(operator.is_, msgs, old)):  # C-speed scan; stops at the first difference
            k = overlap
        else:
            k = next(i for i, (a, b) in enumerate(zip(msgs, old)) if a is not b)
        digests = last.digests[:k]
        tokens = last.tokens[:k]
        raw: list[Any] | None = None
        if k < overlap and self._by_json:  # other objects: compare JSON, position by position
            raw = _raw_digests(msgs, k)
            old_raw = last.raw
            if old_raw is None:
                old_raw = last.raw = [_UNIQUE] * k + _raw_digests(old, k, overlap)
            same = list(map(operator.eq, raw[: overlap - k], old_raw[k:overlap]))
            raw[:0] = old_raw[:k]
            if all(same):
                digests += last.digests[k:overlap]
                tokens += last.tokens[k:overlap]
            else:
                todo = [i for i, s in enumerate(same, k) if not s]
                m = self.meter.measure([msgs[i] for i in todo])
                remeasured = iter(zip(m.digests, m.tokens))
                for i, s in enumerate(same, k):
                    d, t = (last.digests[i], last.tokens[i]) if s else next(remeasured)
                    digests.append(d)
                    tokens.append(t)
        if len(msgs) > len(digests):
            measured = self.meter.measure(msgs[len(digests):])
            digests += measured.digests
            tokens += measured.tokens
        # the chain and the prefix sums are recomputed from the first changed message
        chain = chain_digests(digests, last.chain[: _common(digests, last.digests, k)])
        t = _common(tokens, last.tokens, k)
        prefix = last.prefix[: t + 1]
        prefix += itertools.accumulate(tokens[t:], initial=prefix[-1])
        del prefix[t + 1]
        view = _View(msgs, digests, tokens, chain, prefix)
        view.raw = raw
        return view

    def _lookup(self, view: _View, n: int) -> PrefixEntry | None:
        """The stored entry replacing the longest prefix of ``view.messages[:n]``.

        Every prefix length is checked, longest first. With a versioned store, the prefix
        lengths the previous lookup found empty are skipped while the store's version and
        the history up to them are unchanged (same answer: nothing was put since).
        """
        store = self.store
        get = store.get
        chain = view.chain
        version = getattr(store, "version", None)
        low = 0
        memo = self._scan
        if (version is not None and memo is not None and memo[0] is store
                and memo[1] == version and 0 < memo[2] <= n and chain[memo[2] - 1] == memo[3]):
            low = memo[2]
        found: PrefixEntry | None = None
        at = 0
        for i in range(n, low, -1):
            entry = get(chain[i - 1])
            if entry is not None and entry.cut == i and entry.head_len <= i:
                found, at = entry, i
                break
        else:
            if low:
                hit = memo[4]  # type: ignore[index]
                if hit:
                    entry = get(chain[hit - 1])
                    if entry is not None and entry.cut == hit and entry.head_len <= hit:
                        found, at = entry, hit
                    else:  # removed without a version change: check every prefix
                        self._scan = None
                        return self._lookup(view, n)
        if version is not None and n:
            self._scan = (store, version, n, chain[n - 1], at)
        return found

    def _should_compact(self, view: _View, state: _State, n: int) -> bool:
        tokens = state.tokens_at(view, n)
        if self.pm.hook.agentcompact_should_compact.get_hookimpls():
            decided = self.pm.hook.agentcompact_should_compact(
                messages=state.messages_at(view, n), tokens=tokens, budget=self.budget,
                dialect=self.dialect,
            )
            if decided is not None:
                return bool(decided)
        return tokens > self.budget.trigger


def _common(a: list[Any], b: list[Any], k: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, known to be at least ``k``."""
    m = min(len(a), len(b))
    if a[k:m] == b[k:m]:  # list compares run in C (identity first)
        return m
    return next(i for i in range(k, m) if a[i] != b[i])


_UNIQUE: Any = object()  # a "digest" equal to nothing else: not known / not JSON-able


def _raw_digests(messages: list[Any], start: int, end: int | None = None) -> list[Any]:
    """Digests of the JSON of ``messages[start:end]`` as it is (key order kept);
    ``_UNIQUE`` for a message that is not JSON-able."""
    items = messages[start:end]
    try:
        return list(map(xxhash.xxh3_128_intdigest, map(orjson.dumps, items)))
    except TypeError:
        out: list[Any] = []
        for message in items:
            try:
                out.append(xxhash.xxh3_128_intdigest(orjson.dumps(message)))
            except TypeError:
                out.append(object())
        return out


def _make_budget(budget: Budget | None, trigger: int | None, target: int | None) -> Budget:
    if budget is not None:
        if trigger is not None or target is not None:
            raise ConfigError("give either budget= or trigger_tokens=/target_tokens=, not both")
        if not isinstance(budget, Budget):
            raise ConfigError(f"budget must be a Budget, got {type(budget).__name__}")
        return budget
    return Budget(trigger_tokens=trigger if trigger is not None else 100_000,
                  target_tokens=target)
