"""Background (speculative) compaction: summarize before the cliff, swap in when ready.

A blocking summary strategy stalls the agent for a summarizer call at every cliff.
``BackgroundCompactor`` starts that call earlier, when the context crosses a *soft*
threshold below the engine's trigger, and lets the agent keep going meanwhile::

    engine = Engine(strategy=StrategySettings("summary", options={...}),
                    budget=Budget(trigger_tokens=100_000))
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

Starting early enough (``adaptive=True``, the default). A summary started at the soft
threshold is ready in time only if the agent needs longer than the summary's latency ``L``
to grow the context from there to the trigger. The compactor measures both: the growth
rate ``r`` of the original history (tokens per second of wall time between ``compact``
calls) and ``L`` (the duration of its finished background compactions, or
``latency_hint_s`` before the first one). It starts as soon as the context, projected
``lead × L`` seconds ahead, would reach the trigger — possibly well below the soft
threshold (never below the target: there would be nothing to compact).

The limits: right after a swap the context is about ``target + r × L`` (what the agent
added while the summary was written), so one summary at a time keeps up only while
``target + 2·r·L < trigger``. Beyond that, ``max_pending=k`` staggers compactions ``L/k``
apart (only when one at a time cannot keep up): a ready summary of an earlier span is
swapped in while a newer span is being summarized, the turns that arrived meanwhile
verbatim after it; this needs a summarizer serving concurrent requests. Nothing keeps up
once ``target + r·L >= trigger``. At the hard trigger the compactor waits only when the
oldest running task is expected (from its elapsed time and ``L``) to finish within
``wait_s``; otherwise it falls back to cliff at once instead of stalling for nothing.
``stats`` shows ``rate_tokens_s``, ``latency_s``, ``early_starts`` and ``skipped_waits``.

Async only; the agent loop and the task share one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._engine import CompactionResult, Engine
from .errors import ConfigError, SummarizerError
from .strategies._base import CompactionRequest, Rendered

__all__ = ["BackgroundCompactor", "BackgroundStats"]


@dataclass
class BackgroundStats:
    """What the compactor did: tasks started and finished, swaps, waits, fallbacks.

    ``early_starts``: tasks started below the soft threshold (adaptive); ``skipped_waits``:
    hard-trigger fallbacks taken at once because the task could not finish within
    ``wait_s``; ``rate_tokens_s`` and ``latency_s``: the current estimates of the history's
    growth rate and of a background compaction's duration.
    """

    started: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    swapped: int = 0
    waited: int = 0
    fell_back: int = 0
    wait_s: float = 0.0
    skipped_waits: int = 0
    early_starts: int = 0
    rate_tokens_s: float = 0.0
    latency_s: float | None = None
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
    :param adaptive: also start below the soft threshold when the measured growth rate
        and summary latency say the soft threshold is too late (see module docstring).
    :param latency_hint_s: the expected duration of one background compaction, used
        until one has been measured (None: start at the soft threshold until then).
    :param lead: safety factor on that latency (start ``lead × L`` seconds ahead).
    :param max_pending: background compactions in flight at once (default 1). With more,
        a new one starts every ``L / max_pending`` seconds while due, so a summary of an
        earlier span is swapped in while a newer one is still being written: this keeps up
        with faster agents when the summarizer serves requests concurrently (see
        docs/background.md), at the price of more summarizer calls.
    """

    def __init__(self, engine: Engine, soft_trigger_tokens: int | None = None,
                 wait_s: float = 5.0, *, adaptive: bool = True,
                 latency_hint_s: float | None = None, lead: float = 1.5,
                 max_pending: int = 1) -> None:
        budget = engine.budget
        soft = soft_trigger_tokens if soft_trigger_tokens is not None else (
            (budget.target + budget.trigger) // 2)
        if not 0 < soft < budget.trigger:
            raise ConfigError(f"soft_trigger_tokens={soft} must be in (0, trigger="
                              f"{budget.trigger})")
        if wait_s < 0:
            raise ConfigError(f"wait_s must be >= 0, got {wait_s}")
        if lead < 1 or max_pending < 1 or (latency_hint_s is not None and latency_hint_s < 0):
            raise ConfigError(f"need lead >= 1, max_pending >= 1, latency_hint_s >= 0; got "
                              f"lead={lead}, max_pending={max_pending}, "
                              f"latency_hint_s={latency_hint_s}")
        self.max_pending = max_pending
        self.adaptive = adaptive
        self.lead = lead
        self.engine = engine
        self.soft_trigger_tokens = soft
        self.wait_s = wait_s
        self.stats = BackgroundStats(latency_s=latency_hint_s)
        self._cliff = Engine(
            _NotReady(engine.strategy_name, wait_s), engine.dialect, budget,
            counter=engine.counter, store=engine.store, plugins=engine.pm,
            strict=engine.strict, episode_id=engine.episode_id)
        self._jobs: list[_Job] = []  # in start order
        self._started_len = -1
        self._sent_cut = 0
        self._last: tuple[float, int] | None = None  # (time, original tokens) of last call

    @property
    def pending(self) -> bool:
        """True while a background compaction is running."""
        return any(not job.task.done() for job in self._jobs)

    async def prepare(self, messages: Sequence[Any]) -> bool:
        """Start a background compaction if ``messages`` is past the start point (the soft
        threshold, or earlier when adaptive) and there is room for one; True when started."""
        self._reap()
        return self._maybe_start(messages, self.engine.context_tokens(messages))

    async def compact(self, messages: Sequence[Any]) -> CompactionResult:
        """The context to send now; never blocks on a summary longer than ``wait_s``."""
        self._reap()
        self._observe(messages)
        trigger = self.engine.budget.trigger
        tokens = self.engine.context_tokens(messages)
        if tokens <= trigger:
            self._maybe_start(messages, tokens)
            return await self._send(messages)
        if not self._jobs and not self._too_slow(0.0):
            self._start(messages)  # jumped past the soft threshold straight to the hard one
        deadline = time.perf_counter() + self.wait_s
        waited = False
        while self._jobs and self.engine.context_tokens(messages) > trigger:
            oldest = self._jobs[0]
            now = time.perf_counter()
            if now >= deadline or self._too_slow(now - oldest.t0):
                break
            waited = True
            await asyncio.wait({oldest.task}, timeout=deadline - now)
            self._reap()
        if waited:
            self.stats.waited += 1
            self.stats.wait_s += time.perf_counter() - (deadline - self.wait_s)
        if self.engine.context_tokens(messages) <= trigger:
            return await self._send(messages)
        if not waited:
            self.stats.skipped_waits += 1
        await self._cancel()
        self.stats.fell_back += 1
        return await self._cliff.acompact(messages)

    async def aclose(self) -> None:
        """Cancel the running background compactions."""
        await self._cancel()

    # --- internals --------------------------------------------------------------------
    def _due(self, tokens: int) -> bool:
        """Is it time to start: past the soft threshold, or (adaptive) would the context
        reach the trigger within ``lead × latency`` at the measured growth rate?"""
        if tokens > self.soft_trigger_tokens:
            return True
        budget = self.engine.budget
        latency, rate = self.stats.latency_s, self.stats.rate_tokens_s
        if not self.adaptive or tokens <= budget.target or latency is None or rate <= 0:
            return False
        return tokens + rate * latency * self.lead >= budget.trigger

    def _room(self, tokens: int) -> bool:
        """Room for another task: fewer than ``max_pending``; a second one only when one at a
        time cannot keep up (``target + 2·r·L > trigger``); staggered so swaps come at even
        intervals — the newest started at least ``L / max_pending`` ago, or, before any
        latency is known, the context grew by ``(trigger - soft) / max_pending`` past the
        soft threshold per task already running."""
        if not self._jobs:
            return True
        if len(self._jobs) >= self.max_pending:
            return False
        budget = self.engine.budget
        latency = self.stats.latency_s
        if latency is None:
            step = (budget.trigger - self.soft_trigger_tokens) / self.max_pending
            return tokens >= self.soft_trigger_tokens + len(self._jobs) * step
        # one at a time keeps up when a swap (target + r·L) leaves room for another r·L
        if budget.target + 2 * self.stats.rate_tokens_s * latency <= budget.trigger:
            return False
        return time.perf_counter() - self._jobs[-1].t0 >= latency / self.max_pending

    def _maybe_start(self, messages: Sequence[Any], tokens: int) -> bool:
        if len(messages) <= self._started_len or not self._room(tokens) or not self._due(tokens):
            return False
        if tokens <= self.soft_trigger_tokens:
            self.stats.early_starts += 1
        self._start(messages)
        return True

    def _observe(self, messages: Sequence[Any]) -> None:
        """Update the growth rate (original tokens per second between calls, EWMA)."""
        now, size = time.perf_counter(), self.engine.count(messages)
        last, self._last = self._last, (now, size)
        if last is None or size <= last[1] or now <= last[0]:
            return
        sample = (size - last[1]) / (now - last[0])
        rate = self.stats.rate_tokens_s
        self.stats.rate_tokens_s = sample if rate <= 0 else 0.5 * rate + 0.5 * sample

    def _start(self, messages: Sequence[Any]) -> None:
        self._started_len = len(messages)
        task = asyncio.create_task(self.engine.aprecompact(list(messages)),
                                   name="agentcompact-background")
        job = _Job(task, time.perf_counter())
        task.add_done_callback(job.finished)
        self._jobs.append(job)
        self.stats.started += 1

    async def _send(self, messages: Sequence[Any]) -> CompactionResult:
        result = await self.engine.acompact(messages)
        if result.modified and not result.compacted and result.cut != self._sent_cut:
            self.stats.swapped += 1
        self._sent_cut = result.cut
        return result

    def _too_slow(self, elapsed: float) -> bool:
        """Adaptive: a task that has run ``elapsed`` s is expected to need more than
        ``wait_s`` more (measured latency) — waiting would stall for nothing."""
        latency = self.stats.latency_s
        return self.adaptive and latency is not None and latency - elapsed > self.wait_s

    def _reap(self) -> None:
        """Account for finished tasks; drop (cancel) older ones a newer finished task
        supersedes (its stored prefix is longer, the older one would never be used)."""
        done = [k for k, job in enumerate(self._jobs) if job.task.done()]
        if not done:
            return
        newest_ok = max((k for k in done if _succeeded(self._jobs[k].task)), default=-1)
        keep: list[_Job] = []
        for k, job in enumerate(self._jobs):
            if not job.task.done():
                if k < newest_ok:
                    job.task.cancel()  # superseded: its result would never be used
                    self.stats.cancelled += 1
                    continue
                keep.append(job)
                continue
            self._account(job)
        self._jobs = keep

    def _account(self, job: _Job) -> None:
        task = job.task
        took = job.took if job.took is not None else time.perf_counter() - job.t0
        if task.cancelled():
            self.stats.cancelled += 1
            # it ran `took` seconds without finishing: the latency is at least that
            self.stats.latency_s = max(took, self.stats.latency_s or 0.0)
            return
        error = task.exception()
        if error is not None:
            self.stats.failed += 1
            self.stats.last_error = f"{type(error).__name__}: {error}"
            return
        self.stats.finished += 1
        if task.result().events:  # a real compaction (not a no-op) was timed
            latency = self.stats.latency_s
            self.stats.latency_s = took if latency is None else 0.5 * latency + 0.5 * took

    async def _cancel(self) -> None:
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            if not job.task.done():
                job.task.cancel()
        if jobs:
            await asyncio.gather(*(job.task for job in jobs), return_exceptions=True)
        for job in jobs:
            self._account(job)


@dataclass
class _Job:
    task: asyncio.Task[CompactionResult]
    t0: float
    took: float | None = None

    def finished(self, task: asyncio.Task[CompactionResult]) -> None:
        self.took = time.perf_counter() - self.t0


def _succeeded(task: asyncio.Task[CompactionResult]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None
