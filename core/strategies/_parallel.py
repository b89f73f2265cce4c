"""The parallel strategy: the compacted range split into blocks summarized concurrently.

The range ``messages[head_len:cut]`` is covered by blocks of whole turns (cut only at
turn boundaries, ``split_turns``). Blocks are summarized from **original** messages, each
with its own output budget, concurrently (asyncio with a semaphore of ``max_concurrency``;
the sync path uses a thread pool of that size), and the summaries are joined in order
into ONE message starting with ``SUMMARY_HEADER``.

Incremental, with no summary of a summary: every block summary is cached by the digest of
its block's messages (and the model and prompt). At the next compaction the earlier range
``messages[head_len:span_start]`` is re-covered by the cached blocks (walking forward,
taking the longest cached block at each position), so only the new span's blocks are sent
to the summarizer. A block not in the cache (evicted, a fresh process) is re-summarized
from its originals.

Blocks: the new span is split into ``blocks`` token-balanced blocks, or into
``ceil(span_tokens / block_tokens)`` of them (never more than its turns, nor more than the
budget gives ``min_block_output_tokens`` each).

Budget: the message must fit ``budget_tokens``. The new blocks get a share proportional
to their original size (or ``block_output_tokens`` each, capped to that share); cached
summaries of older blocks keep their size, and the oldest are dropped (with a marker) when
they no longer fit beside the new ones — older detail ages out, nothing is rewritten.

Failures: a block whose summarizer call fails (HTTP error, timeout, context length after
one refit) is rendered by the cliff strategy restricted to that block (verbatim excerpts,
not cached, retried next time) and its error is listed in ``Rendered.errors`` (the engine
copies it to ``CompactionEvent.errors``). When every block fails (none summarized now,
none cached) the strategy raises ``SummarizerError`` and the engine falls back to cliff
for the whole span.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from .._events import DroppedItem
from .._history import history_of
from .._markers import COMPACTION_HEADER, SUMMARY_HEADER
from .._summarizer import AsyncSession, CallInfo, Summarizer, SyncSession
from .._tokens import MESSAGE_OVERHEAD
from ..errors import AgentCompactError, CompactionError, ConfigError, SummarizerError
from ._base import CompactionRequest, Rendered
from ._cliff import CliffStrategy
from ._summary import (
    DEFAULT_PROMPT,
    SummaryCache,
    SummaryJob,
    default_prompt,
    digest,
    fit_entries,
    fit_text,
    hook_prompt,
    make_summarizer,
    pinned_block,
    run_job_async,
    run_job_sync,
    summarized_items,
    summary_entries,
    training_cache_size,
)

__all__ = ["Block", "ParallelStrategy", "balanced_blocks"]

_WINDOW_MARGIN = 0.9
_PROMPT_OVERHEAD = 64
_FAILED = "[verbatim excerpts of these turns: their summary could not be made]\n"


@dataclass
class Block:
    """Messages ``[start, end)`` of the original history: whole turns."""

    start: int
    end: int
    tokens: int
    key: str
    text: str | None = None  # cached or produced summary
    max_tokens: int = 0
    new: bool = True
    error: str | None = None
    items: list[DroppedItem] = field(default_factory=list)


def balanced_blocks(units: Sequence[tuple[int, int, int]], n: int) -> list[tuple[int, int]]:
    """Group consecutive units ``(start, end, tokens)`` into ``n`` token-balanced runs.

    Boundary ``j`` is the unit end whose cumulative size is nearest ``j * total / n``
    (each run keeps at least one unit). Deterministic.
    """
    n = max(1, min(n, len(units)))
    cumulative = list(itertools.accumulate(u[2] for u in units))
    total = cumulative[-1] if cumulative else 0
    edges = [0]
    for j in range(1, n):
        lo, hi = edges[-1] + 1, len(units) - (n - j)
        goal = total * j / n
        edges.append(min(range(lo, hi + 1), key=lambda b: (abs(cumulative[b - 1] - goal), b)))
    edges.append(len(units))
    return [(units[a][0], units[b - 1][1]) for a, b in zip(edges, edges[1:], strict=False)]


class ParallelStrategy:
    """Token-balanced blocks of whole turns, summarized concurrently and cached by digest.

    :param summarizer: a :class:`~agentcompact._summarizer.Summarizer`, or its settings
        (``base_url``, ``model``, ``api_key``, ``timeout``, ``stream``, ``context_window``…).
    :param block_tokens: target original tokens per block (default 8000).
    :param blocks: split each new span into exactly this many blocks (overrides
        ``block_tokens``).
    :param max_concurrency: summarizer requests in flight at once.
    :param block_output_tokens: fixed output budget per block (default: proportional).
    :param min_block_output_tokens: smallest useful per-block budget.
    :param prompt: system prompt replacing the default (``{max_tokens}`` substituted).
    :param cache_size: block summaries remembered (0: no cache, no incremental reuse);
        default 4096, or 0 for a trained summarizer (which refuses a cache: each summary
        must be the current policy's sample, logged and trained in its own episode).
    """

    name = "parallel"

    def __init__(self, summarizer: Summarizer | None = None, *, block_tokens: int = 8_000,
                 blocks: int | None = None, max_concurrency: int = 8,
                 block_output_tokens: int | None = None, min_block_output_tokens: int = 48,
                 prompt: str | None = None, cache_size: int | None = None,
                 **client: Any) -> None:
        if block_tokens <= 0 or (blocks is not None and blocks <= 0) or max_concurrency <= 0:
            raise ConfigError(f"parallel: block_tokens={block_tokens}, blocks={blocks}, "
                              f"max_concurrency={max_concurrency} must be positive")
        self.summarizer = make_summarizer(summarizer, client)
        cache_size = training_cache_size(self.summarizer, cache_size, 4096)
        self.block_tokens = block_tokens
        self.blocks = blocks
        self.max_concurrency = max_concurrency
        self.block_output_tokens = block_output_tokens
        self.min_block_output_tokens = min_block_output_tokens
        self.prompt = prompt or DEFAULT_PROMPT
        self.cache = SummaryCache(cache_size)

    # --- entry points -----------------------------------------------------------------
    def compact(self, request: CompactionRequest) -> Rendered:
        plan = self._plan(request)
        todo = [b for b in plan.blocks if b.text is None]
        if todo:
            with self.summarizer.session() as session, ThreadPoolExecutor(
                    max_workers=min(self.max_concurrency, len(todo)),
                    thread_name_prefix="agentcompact-parallel") as pool:
                jobs = [self._job(request, b, k) for k, b in enumerate(plan.blocks)
                        if b.text is None]
                for job in jobs:
                    job.ready()  # hook awaitables are refused here, in the caller's thread
                futures = [pool.submit(self._run_sync, session, request, b, j)
                           for b, j in zip(todo, jobs, strict=False)]
                for future in futures:
                    future.result()
        return self._rendered(request, plan)

    async def acompact(self, request: CompactionRequest) -> Rendered:
        plan = self._plan(request)
        todo = [(k, b) for k, b in enumerate(plan.blocks) if b.text is None]
        if todo:
            semaphore = asyncio.Semaphore(self.max_concurrency)
            async with self.summarizer.asession() as session:
                async def one(index: int, block: Block) -> None:
                    job = self._job(request, block, index)
                    async with semaphore:
                        await self._run_async(session, request, block, job)
                await asyncio.gather(*(one(k, b) for k, b in todo))
        return self._rendered(request, plan)

    def _run_sync(self, session: SyncSession, request: CompactionRequest, block: Block,
                  job: SummaryJob) -> None:
        try:
            block.text = run_job_sync(session, job, self._info(request, job))
            self.cache.put(block.key, block.text)
        except AgentCompactError as exc:
            block.error = str(exc)

    async def _run_async(self, session: AsyncSession, request: CompactionRequest,
                         block: Block, job: SummaryJob) -> None:
        try:
            block.text = await run_job_async(session, job, self._info(request, job))
            self.cache.put(block.key, block.text)
        except AgentCompactError as exc:
            block.error = str(exc)

    def _info(self, request: CompactionRequest, job: SummaryJob) -> CallInfo:
        return CallInfo(self.name, request.pm, request.episode_id, job.block)

    # --- planning ---------------------------------------------------------------------
    def _plan(self, request: CompactionRequest) -> _Plan:
        counter = request.meter.counter
        budget = (request.budget_tokens - MESSAGE_OVERHEAD
                  - counter.count_texts([SUMMARY_HEADER + "\n" + pinned_block(request)])[0])
        if budget < self.min_block_output_tokens:
            raise CompactionError(f"parallel: budget {budget} tokens is below "
                                  f"min_block_output_tokens={self.min_block_output_tokens}")
        history = request.history  # the engine's facts of the history, else the span's own
        if history is None:
            history = history_of(request.messages[: request.cut], request.meter,
                                 request.dialect, resolve=True)
        digests, tokens = history.digests[: request.cut], history.tokens[: request.cut]
        starts = history.turn_starts(request.cut)
        ctx = _Context(request, digests, tokens, self._prompt_id(request))
        units = _units(starts, request.head_len, request.cut, tokens)
        earlier = [u for u in units if u[1] <= request.span_start]
        span = [u for u in units if u[0] >= request.span_start]
        blocks = self._recover(ctx, earlier)
        span_tokens = sum(u[2] for u in span)
        old_tokens = sum(b.tokens for b in blocks if b.text is not None)
        span_share = budget * span_tokens // max(1, span_tokens + old_tokens)
        blocks += self._split(ctx, span, max(span_share, self.min_block_output_tokens))
        if not blocks:
            raise CompactionError("parallel: nothing to summarize in the compacted range")
        for block in blocks:
            if block.text is None:
                block.text = self.cache.get(block.key)
            block.new = block.text is None
        need = sum(b.tokens for b in blocks if b.new)
        new_share = budget * need // max(1, sum(b.tokens for b in blocks))
        blocks, omitted = _drop_oldest(blocks, budget - new_share, counter)
        self._assign_budgets(blocks, budget, counter)
        return _Plan(blocks, omitted, budget)

    def _prompt_id(self, request: CompactionRequest) -> str:
        hooks = [impl.plugin_name
                 for impl in request.pm.hook.agentcompact_summary_prompt.get_hookimpls()]
        return digest(self.summarizer.model, self.prompt, hooks)

    def _recover(self, ctx: _Context, units: list[tuple[int, int, int]]) -> list[Block]:
        """Re-cover the earlier range with cached blocks (longest first); else re-split."""
        blocks: list[Block] = []
        k = 0
        while k < len(units):
            hit = self._longest_cached(ctx, units, k)
            if hit is None:
                return blocks + self._split(ctx, units[k:], None)
            block, k = hit
            blocks.append(block)
        return blocks

    def _longest_cached(self, ctx: _Context, units: list[tuple[int, int, int]], k: int
                        ) -> tuple[Block, int] | None:
        h = hashlib.blake2b(ctx.prompt_id.encode(), digest_size=16)
        best: tuple[Block, int] | None = None
        tokens = 0
        for j in range(k, len(units)):
            start, end, size = units[j]
            for d in ctx.digests[start:end]:
                h.update(d.encode())
            tokens += size
            key = h.copy().hexdigest()
            text = self.cache.get(key)
            if text is not None:
                best = (Block(units[k][0], end, tokens, key, text, new=False), j + 1)
        return best

    def _split(self, ctx: _Context, units: list[tuple[int, int, int]],
               out_budget: int | None) -> list[Block]:
        if not units:
            return []
        total = sum(u[2] for u in units)
        n = self.blocks or math.ceil(total / self.block_tokens)
        if out_budget is not None:
            n = min(n, max(1, out_budget // self.min_block_output_tokens))
        out = []
        for start, end in balanced_blocks(units, n):
            h = hashlib.blake2b(ctx.prompt_id.encode(), digest_size=16)
            for d in ctx.digests[start:end]:
                h.update(d.encode())
            out.append(Block(start, end, sum(ctx.tokens[start:end]), h.hexdigest()))
        return out

    def _assign_budgets(self, blocks: list[Block], budget: int, counter: Any) -> None:
        """Output budgets of the blocks to summarize: the room the cached summaries leave,
        shared in proportion to original size (capped by ``block_output_tokens``)."""
        room = budget - sum(_size(b, counter) for b in blocks if not b.new)
        todo = [b for b in blocks if b.new]
        total = sum(b.tokens for b in todo) or 1
        for block in todo:
            share = max(1, room * block.tokens // total)
            if self.block_output_tokens is not None:
                share = min(share, self.block_output_tokens)
            block.max_tokens = share

    def _job(self, request: CompactionRequest, block: Block, index: int,
             window: int | None = None) -> SummaryJob:
        counter = request.meter.counter
        window = window or self.summarizer.context_window
        entries = summary_entries(request, range(block.start, block.end))
        system = counter.count_texts([self.prompt])[0]
        limit = int(window * _WINDOW_MARGIN) - block.max_tokens - system - _PROMPT_OVERHEAD
        pieces = fit_entries(entries, max(64, limit), counter)
        settings = {"strategy": self.name, "max_tokens": block.max_tokens, "block": index,
                    "transcript": pieces}
        prompt = hook_prompt(request, entries, settings,
                             lambda: default_prompt(self.prompt, pieces, block.max_tokens))

        def refit(shrink: float) -> SummaryJob:
            return self._job(request, block, index, int(window * shrink))

        return SummaryJob(prompt, block.max_tokens, block.key, index, refit,
                          tuple(e.index for e in entries))

    # --- rendering --------------------------------------------------------------------
    def _rendered(self, request: CompactionRequest, plan: _Plan) -> Rendered:
        counter = request.meter.counter
        if all(b.error for b in plan.blocks):
            raise SummarizerError(f"parallel: every block failed; first: {plan.blocks[0].error}")
        pieces = ([f"[… summaries of {plan.omitted} earlier parts omitted …]"]
                  if plan.omitted else [])
        errors: list[str] = []
        items: list[DroppedItem] = []
        for block in plan.blocks:
            if block.error is not None:
                errors.append(f"block {block.start}-{block.end}: {block.error}")
                pieces.append(self._cliff_block(request, block))
                items += block.items
            else:
                pieces.append(fit_text(block.text or "", max(block.max_tokens, _size(
                    block, counter)), counter))
                if block.start >= request.span_start:
                    entries = summary_entries(request, range(block.start, block.end))
                    items += summarized_items(request, entries)
        body = fit_text("\n\n".join(p.strip() for p in pieces if p.strip()), plan.budget,
                        counter)
        text = f"{SUMMARY_HEADER}\n{body}{pinned_block(request)}"
        tokens = request.meter.count_text_message(text)
        rendered = Rendered(request.dialect.text_message(text), tokens, request.level, items)
        rendered.errors.extend(errors)
        return rendered

    def _cliff_block(self, request: CompactionRequest, block: Block) -> str:
        sub = replace(request, span_start=block.start, cut=block.end,
                      budget_tokens=max(block.max_tokens, self.min_block_output_tokens) + 16)
        rendered = CliffStrategy(carry_forward_human=False).compact(sub)
        block.items = rendered.items
        text = request.dialect.text_of(rendered.message)
        return _FAILED + text.removeprefix(COMPACTION_HEADER).strip()


@dataclass
class _Context:
    request: CompactionRequest
    digests: list[str]
    tokens: list[int]
    prompt_id: str


@dataclass
class _Plan:
    blocks: list[Block]
    omitted: int
    budget: int


def _units(starts: Sequence[int], head_len: int, cut: int, tokens: Sequence[int]
           ) -> list[tuple[int, int, int]]:
    """Turns inside ``[head_len, cut)`` as ``(start, end, tokens)``."""
    inside = [s for s in starts if head_len <= s < cut]
    ends = [*inside[1:], cut]
    return [(s, e, sum(tokens[s:e])) for s, e in zip(inside, ends, strict=False)]


def _size(block: Block, counter: Any) -> int:
    return int(counter.count_texts([block.text or ""])[0]) + 1 if block.text else 0


def _drop_oldest(blocks: list[Block], room: int, counter: Any) -> tuple[list[Block], int]:
    """Drop the oldest cached summaries until the cached ones fit ``room``."""
    sizes = [_size(b, counter) for b in blocks]
    cached = sum(size for b, size in zip(blocks, sizes, strict=False) if not b.new)
    out: list[Block] = []
    dropped = 0
    for block, size in zip(blocks, sizes, strict=False):
        if not block.new and cached > max(0, room):
            cached -= size
            dropped += 1
            continue
        out.append(block)
    return out, dropped
