"""Background (speculative) compaction: summarize before the cliff, swap in when ready.

A blocking summary strategy stalls the agent for a summarizer call at every cliff.
``BackgroundCompactor`` starts that call earlier, when the context crosses a *soft*
threshold below the engine's trigger, and lets the agent keep going meanwhile::

    engine = Engine(strategy="summary", strategy_settings={...}, trigger_tokens=100_000)
    bg = BackgroundCompactor(engine, soft_trigger_tokens=80_000, wait_s=5.0)
    for each model call:
        result = await bg.compact(messages)     # returns at once unless at the hard trigger
        send(result.messages)

How it works — nothing but the engine's prefix store:

1. Soft crossing: ``engine.aprecompact(messages)`` runs in an ``asyncio`` task. It is the
   engine's own compaction of that history (same cut rules, same strategy, fail-open to
   cliff), stored under the chain digest of the original prefix it replaces. Meanwhile
   ``compact`` returns the uncompacted context (``engine.acompact`` under the trigger).
2. The next ``compact`` after the task finished finds the stored prefix: the engine
   substitutes it (head + summary + every turn since the cut verbatim, including the turns
   that arrived while the summary was being written). No summarizer call on this path.
3. Hard trigger before it is ready: wait up to ``wait_s`` for the task; if it is still
   not done, compact with cliff (instant, verbatim) through a sibling engine sharing the
   store, reported through ``on_compaction`` as the strategy's failure with
   ``fallback="cliff"``. The same happens when, even with the summary swapped in, the
   context is still over the trigger (so the agent never blocks on a summary).

Async only; the agent loop and the task share one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .engine import CompactionResult, Engine
from .errors import ConfigError, SummarizerError
from .strategies.base import CompactionRequest, Rendered

__all__ = ["BackgroundCompactor", "BackgroundStats"]


@dataclass
class BackgroundStats:
    """What the compactor did: tasks started and finished, swaps, waits, fallbacks."""

    started: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    swapped: int = 0
    waited: int = 0
    fell_back: int = 0
    wait_s: float = 0.0
    last_error: str | None = None


class _NotReady:
    """A strategy that always fails: lets the sibling engine report the fallback."""

    def __init__(self, name: str, wait_s: float) -> None:
        self.name = name
        self.wait_s = wait_s

    def compact(self, request: CompactionRequest) -> Rendered:
        raise SummarizerError(f"background summary not ready within wait_s={self.wait_s}s; "
                              "compacted with cliff")


class BackgroundCompactor:
    """Pre-computes the engine's compaction past a soft threshold (see module docstring).

    :param engine: the engine (typically ``strategy="summary"`` or ``"parallel"``).
    :param soft_trigger_tokens: start the background compaction above this many tokens;
        must be below the engine's trigger (default: midway between target and trigger).
    :param wait_s: at the hard trigger, how long to wait for a running task before
        falling back to cliff.
    """

    def __init__(self, engine: Engine, soft_trigger_tokens: int | None = None,
                 wait_s: float = 5.0) -> None:
        budget = engine.budget
        soft = soft_trigger_tokens if soft_trigger_tokens is not None else (
            (budget.target + budget.trigger) // 2)
        if not 0 < soft < budget.trigger:
            raise ConfigError(f"soft_trigger_tokens={soft} must be in (0, trigger="
                              f"{budget.trigger})")
        if wait_s < 0:
            raise ConfigError(f"wait_s must be >= 0, got {wait_s}")
        self.engine = engine
        self.soft_trigger_tokens = soft
        self.wait_s = wait_s
        self.stats = BackgroundStats()
        self._cliff = Engine(
            _NotReady(engine.strategy_name, wait_s), engine.dialect, budget,
            counter=engine.counter, store=engine.store, plugins=engine.pm,
            strict=engine.strict, validate_output=engine.validate_output,
            episode_id=engine.episode_id)
        self._task: asyncio.Task[CompactionResult] | None = None
        self._started_len = -1
        self._sent_cut = 0

    @property
    def pending(self) -> bool:
        """True while a background compaction is running."""
        return self._task is not None and not self._task.done()

    async def prepare(self, messages: Sequence[Any]) -> bool:
        """Start a background compaction if ``messages`` is past the soft threshold and
        none is running; return True when one was started."""
        self._reap()
        if self.pending or len(messages) <= self._started_len:
            return False
        if self.engine.context_tokens(messages) <= self.soft_trigger_tokens:
            return False
        self._start(messages)
        return True

    async def compact(self, messages: Sequence[Any]) -> CompactionResult:
        """The context to send now; never blocks on a summary longer than ``wait_s``."""
        self._reap()
        if self.engine.context_tokens(messages) <= self.engine.budget.trigger:
            await self.prepare(messages)
            return await self._send(messages)
        if self._task is None:
            self._start(messages)  # jumped past the soft threshold straight to the hard one
        if self.pending:
            await self._wait()
        self._reap()
        if not self.pending and self.engine.context_tokens(messages) <= self.engine.budget.trigger:
            return await self._send(messages)
        await self._cancel()
        self.stats.fell_back += 1
        return await self._cliff.acompact(messages)

    async def aclose(self) -> None:
        """Cancel a running background compaction."""
        await self._cancel()

    # --- internals --------------------------------------------------------------------
    def _start(self, messages: Sequence[Any]) -> None:
        self._started_len = len(messages)
        self._task = asyncio.create_task(self.engine.aprecompact(list(messages)),
                                         name="agentcompact-background")
        self.stats.started += 1

    async def _send(self, messages: Sequence[Any]) -> CompactionResult:
        result = await self.engine.acompact(messages)
        if result.modified and not result.compacted and result.cut != self._sent_cut:
            self.stats.swapped += 1
        self._sent_cut = result.cut
        return result

    async def _wait(self) -> None:
        assert self._task is not None
        t0 = time.perf_counter()
        self.stats.waited += 1
        await asyncio.wait({self._task}, timeout=self.wait_s)
        self.stats.wait_s += time.perf_counter() - t0

    def _reap(self) -> None:
        task = self._task
        if task is None or not task.done():
            return
        self._task = None
        if task.cancelled():
            self.stats.cancelled += 1
            return
        error = task.exception()
        if error is not None:
            self.stats.failed += 1
            self.stats.last_error = f"{type(error).__name__}: {error}"
        else:
            self.stats.finished += 1

    async def _cancel(self) -> None:
        task = self._task
        if task is None:
            return
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._reap()
