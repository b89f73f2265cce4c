"""The summary strategy: head verbatim + ONE LLM summary message + recent turns verbatim.

The engine keeps the head and the recent turns; this strategy writes the one message
(starting with ``SUMMARY_HEADER``) that stands for ``messages[head_len:cut]``.

What is summarized — always **original** messages, never a previous summary:

- ``cumulative=False`` (default): the originals of the whole compacted range
  ``messages[head_len:cut]`` — this cycle's span *and* the spans of earlier cycles — so a
  fact from the first cycle is read from its source at every compaction (no drift, no
  nesting). When they do not fit the summarizer's window, the earlier cycles' tool output
  is trimmed first, then the transcript is cut head+tail with an explicit marker
  (``overflow="trim"``) or split at message boundaries into parts summarized separately
  and concatenated in order (``overflow="split"``: one level, every part from originals).
- ``cumulative=True`` (opt-in): the previous summary this strategy wrote for the earlier
  range (kept in its own memory, keyed by the digests of that range) plus the originals of
  this cycle's span — cheaper, but a summary of a summary (peers' drift problem).

The default prompt keeps what users say summaries lose: the user's instructions and
constraints verbatim, file paths, commands, identifiers, numbers, errors and their fixes,
the current state and next steps. Override it with ``prompt=`` (system text; ``{max_tokens}``
is substituted) or the ``agentcompact_summary_prompt`` hook. The summary's output budget is
the request's ``budget_tokens`` (minus the header). Pinned messages are appended verbatim.

Summaries are cached by the digest of the prompt sent (LRU, ``cache_size``), so an identical
span is never summarized twice (replays, background pre-computation, several engines) —
except for a trained summarizer (the policy writes its own summaries, to be trained on):
there every summary is a sample of the current policy, logged and trained in its own
episode, so the cache is off (``cache_size`` > 0 is refused) and the cumulative memory is
kept per episode; a cached summary would put another episode's or an older policy's
summary into the prompt, with no call logged, never trained.
On any summarizer failure the strategy raises ``SummarizerError``: the engine falls back
to cliff and reports the error through ``on_compaction``; error text never reaches the context.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .._events import DroppedItem
from .._markers import SUMMARY_HEADER
from .._summarizer import AsyncSession, CallInfo, Summarizer, SummarizerOverflow, SyncSession
from .._tokens import MESSAGE_OVERHEAD, TokenCounter
from ..dialects._base import Part, head_tail
from ..errors import CompactionError, ConfigError, PluginError, SummarizerError
from ._base import CompactionRequest, Rendered

__all__ = [
    "DEFAULT_PROMPT",
    "Entry",
    "SummaryCache",
    "SummaryJob",
    "SummaryStrategy",
    "fit_entries",
    "fit_text",
    "make_summarizer",
    "pinned_block",
    "summary_entries",
    "training_cache_size",
]

DEFAULT_PROMPT = """\
You are compacting the history of a long-running agent session so that the agent can \
continue its task with less context. You are given a transcript of earlier turns (user \
messages, assistant messages, tool calls and tool results). Write the summary the agent \
will read instead of that transcript.

Keep exactly as written:
- every instruction, requirement, constraint and preference the user stated (quote them);
- file paths, URLs, commands with their flags, function/class/variable names, identifiers, \
versions, numbers and configuration values;
- each error met (its exact message) and how it was fixed, or that it is still open.

Then state:
- the task and its current state: what is done, what was verified (tests run, results), \
what was decided and why;
- what was tried and failed, so it is not repeated;
- the next steps the agent was about to take.

Use short sections: User instructions; Files and code; Commands and results; Errors and \
fixes; Decisions; Current state; Next steps. Do not invent anything that is not in the \
transcript, do not continue the task, do not address the user. Stay under {max_tokens} tokens."""

_WINDOW_MARGIN = 0.9  # our token counter is not the summarizer's tokenizer
_PROMPT_OVERHEAD = 64
_REFIT_SHRINK = 0.6  # after a context-length error, refit to this share of the window
_CAPS = (4_000, 1_000, 300)  # chars of tool output/assistant text kept when trimming
_HUMAN_CAP = 4_000
_HUMAN_ROLES = frozenset({"user", "system", "developer"})


# --- the transcript -------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One original message rendered for the summarizer's transcript."""

    index: int
    role: str
    text: str
    human: bool
    earlier: bool = False


def _render(parts: Sequence[Part], role: str, pinned: bool = False) -> tuple[str, bool]:
    """The transcript text of a message of ``parts``, and whether it holds human text (with
    ``pinned``: without its text parts, quoted verbatim beside the summary)."""
    lines: list[str] = []
    human = False
    for part in parts:
        if pinned and part.kind == "text":
            continue
        if part.kind == "text" and part.text:
            lines.append(f"[{role}]\n{part.text}")
            human = human or role in _HUMAN_ROLES
        elif part.kind == "thinking" and part.text:
            lines.append(f"[{role} thinking]\n{part.text}")
        elif part.kind == "tool_call":
            lines.append(f"[tool call {part.name}] {part.text}")
        elif part.kind == "tool_result":
            lines.append(f"[tool result]\n{part.text}")
        elif part.kind == "image":
            lines.append(f"[{role}: image]")
    return "\n".join(lines), human


def summary_entries(request: CompactionRequest, indices: Sequence[int]) -> list[Entry]:
    """Transcript entries of the original messages at ``indices`` (synthetic messages
    skipped: a compaction is never summarized; of a pinned message, what shares it with
    its pinned text: the tool results beside a rule, quoted verbatim apart)."""
    facts = request.known_history.facts(len(request.messages))
    out: list[Entry] = []
    for i in indices:
        role, synthetic, parts, _ = facts[i]
        if synthetic:
            continue
        pinned = request.pinned(i)
        if pinned and not any(p.kind == "text" and p.text for p in parts):
            continue  # its whole text is pinned
        text, human = _render(parts, role, pinned)
        if text:
            out.append(Entry(i, role, text, human, i < request.span_start))
    return out


def pinned_block(request: CompactionRequest) -> str:
    """The pinned text of the span's pins (``CompactionRequest.pinned_text``), each pin as
    ``[pinned message, verbatim]`` and its pieces, for the end of a summary message."""
    facts = request.known_history.facts(request.cut)
    return "".join(
        "\n\n[pinned message, verbatim]\n" + "\n".join(request.pinned_text(i))
        for i in range(request.head_len, request.cut)
        if not facts[i][1] and request.pinned(i))


def _tokens(counter: TokenCounter, texts: Sequence[str]) -> int:
    return sum(counter.count_texts(list(texts))) + len(texts)


def _omitted(count: int, tokens: int) -> str:
    return (f"[… {count} messages (about {tokens} tokens) omitted here to fit the "
            "summarizer's context window …]")


def fit_entries(entries: Sequence[Entry], limit: int, counter: TokenCounter) -> list[str]:
    """Transcript pieces of ``entries`` within ``limit`` tokens; every cut is marked.

    In order, until it fits: tool output and assistant text capped head+tail (4000, 1000,
    300 chars); earlier cycles' non-human messages dropped (one marker); long human
    messages capped; then the middle of the transcript elided (head third, tail two
    thirds kept) with a marker saying how many messages and tokens were left out.
    """
    texts = [e.text for e in entries]
    if _tokens(counter, texts) <= limit:
        return texts
    for cap in _CAPS:
        texts = [e.text if e.human else head_tail(e.text, cap) for e in entries]
        if _tokens(counter, texts) <= limit:
            return texts
    kept = [e for e, t in zip(entries, texts, strict=False) if not e.earlier or e.human]
    dropped = len(entries) - len(kept)
    texts = [t for e, t in zip(entries, texts, strict=False) if not e.earlier or e.human]
    texts = [head_tail(t, _HUMAN_CAP) if e.human else t for e, t in zip(kept, texts, strict=False)]
    if dropped:
        texts.insert(0, f"[… {dropped} tool calls, results and assistant messages of earlier "
                        "turns omitted to fit the summarizer's context window …]")
    if _tokens(counter, texts) <= limit:
        return texts
    return _elide_middle(texts, limit, counter)


def _elide_middle(texts: list[str], limit: int, counter: TokenCounter) -> list[str]:
    sizes = [s + 1 for s in counter.count_texts(texts)]
    room = max(0, limit - 40)
    head: list[int] = []
    used = 0
    for i, size in enumerate(sizes):
        if used + size > room // 3:
            break
        head.append(i)
        used += size
    tail: list[int] = []
    for i in range(len(sizes) - 1, len(head) - 1, -1):
        if used + sizes[i] > room:
            break
        tail.append(i)
        used += sizes[i]
    if not tail and len(sizes) > len(head):  # one huge last message: keep its head+tail
        last = len(texts) - 1
        chars = max(200, (room - used) * 3)
        texts = [*texts[:last], head_tail(texts[last], chars)]
        tail = [last]
    tail.reverse()
    gap = [i for i in range(len(texts)) if i not in head and i not in tail]
    middle = [_omitted(len(gap), sum(sizes[i] for i in gap))] if gap else []
    return [texts[i] for i in head] + middle + [texts[i] for i in tail]


def fit_text(text: str, max_tokens: int, counter: TokenCounter) -> str:
    """``text`` cut at the end (with a marker) until it is at most ``max_tokens`` tokens."""
    tokens = counter.count_texts([text])[0]
    marker = "\n[… summary cut to fit the budget …]"
    while tokens > max_tokens and text:
        keep = max(0, int(len(text) * max_tokens / tokens * 0.95) - len(marker))
        text = text[:keep].rstrip() + marker if keep else ""
        tokens = counter.count_texts([text])[0]
    return text


# --- prompts and jobs -----------------------------------------------------------------
def default_prompt(system: str, pieces: Sequence[str], max_tokens: int) -> list[dict[str, Any]]:
    transcript = "\n\n".join(pieces)
    return [
        {"role": "system", "content": system.replace("{max_tokens}", str(max_tokens))},
        {"role": "user", "content": f"Transcript to summarize:\n<transcript>\n{transcript}\n"
                                    "</transcript>"},
    ]


Prompt = list[dict[str, Any]]


@dataclass
class SummaryJob:
    """One summarizer request: its prompt (maybe an awaitable from a hook), output budget,
    cache key, and how to rebuild it for a smaller window after a context-length error."""

    prompt: Prompt | Awaitable[Prompt]
    max_tokens: int
    key: str | None = None
    block: int | None = None
    refit: Callable[[float], SummaryJob] | None = None
    indices: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def ready(self) -> Prompt:
        if inspect.isawaitable(self.prompt):
            close = getattr(self.prompt, "close", None)
            if callable(close):
                close()
            raise PluginError("agentcompact_summary_prompt returned an awaitable: "
                              "use Engine.acompact (the sync engine cannot await it)")
        return _checked_prompt(self.prompt)

    async def aready(self) -> Prompt:
        if inspect.isawaitable(self.prompt):
            self.prompt = await self.prompt
        return _checked_prompt(self.prompt)


def _checked_prompt(prompt: Any) -> Prompt:
    if not isinstance(prompt, list) or not all(
            isinstance(m, dict) and "role" in m for m in prompt):
        raise PluginError(f"summary prompt must be a list of chat messages, got {prompt!r:.80}")
    return prompt


def hook_prompt(request: CompactionRequest, entries: Sequence[Entry], settings: dict[str, Any],
                fallback: Callable[[], Prompt]) -> Prompt | Awaitable[Prompt]:
    """The ``agentcompact_summary_prompt`` hook's prompt, else ``fallback()``."""
    result = request.pm.hook.agentcompact_summary_prompt(
        messages=[request.messages[e.index] for e in entries], dialect=request.dialect,
        settings=settings)
    return fallback() if result is None else result


def run_job_sync(session: SyncSession, job: SummaryJob, info: CallInfo) -> str:
    """Run one job (one refit after a context-length error); raises ``SummarizerError``."""
    try:
        return session.summarize(job.ready(), job.max_tokens, info).text
    except SummarizerOverflow:
        if job.refit is None:
            raise
        job = job.refit(_REFIT_SHRINK)
        return session.summarize(job.ready(), job.max_tokens, info).text


async def run_job_async(session: AsyncSession, job: SummaryJob, info: CallInfo) -> str:
    """``run_job_sync`` for async code."""
    try:
        return (await session.summarize(await job.aready(), job.max_tokens, info)).text
    except SummarizerOverflow:
        if job.refit is None:
            raise
        job = job.refit(_REFIT_SHRINK)
        return (await session.summarize(await job.aready(), job.max_tokens, info)).text


class SummaryCache:
    """A thread-safe LRU of summary texts by key (size 0 disables it)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str | None) -> str | None:
        if key is None or not self.size:
            return None
        with self._lock:
            text = self._data.get(key)
            if text is not None:
                self._data.move_to_end(key)
            return text

    def put(self, key: str | None, text: str) -> None:
        if key is None or not self.size:
            return
        with self._lock:
            self._data[key] = text
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


def digest(*parts: Any) -> str:
    return hashlib.blake2b(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS),
                           digest_size=16).hexdigest()


_CLIENT_KEYS = ("base_url", "model", "api_key", "timeout", "max_retries", "backoff_s",
                "backoff_max_s", "stream", "context_window", "temperature", "top_p", "top_k",
                "extra_body", "max_tokens_param", "trained", "logprobs", "return_token_ids",
                "policy_version")


def training_cache_size(summarizer: Summarizer, cache_size: int | None, default: int) -> int:
    """The summary cache's size: ``default``, or 0 for a trained summarizer, which refuses
    a cache (every summary must be the current policy's sample, logged in its episode)."""
    if not summarizer.trained:
        return default if cache_size is None else cache_size
    if cache_size:
        raise ConfigError(
            f"cache_size={cache_size} with a trained summarizer: a cached summary enters "
            "the prompt without a logged call, from another episode or an older policy, and "
            "is never trained; leave cache_size unset (0 while training)")
    return 0


def make_summarizer(summarizer: Summarizer | None, settings: dict[str, Any]) -> Summarizer:
    """The given summarizer, or one built from client settings (and the environment)."""
    unknown = set(settings) - set(_CLIENT_KEYS)
    if unknown:
        raise ConfigError(f"unknown strategy settings: {', '.join(sorted(unknown))}")
    if summarizer is not None:
        if settings:
            raise ConfigError("give summarizer= or client settings, not both")
        return summarizer
    return Summarizer(**settings)


# --- the strategy ---------------------------------------------------------------------
class SummaryStrategy:
    """Head + one LLM summary of the original compacted range + recent turns.

    :param summarizer: a :class:`~agentcompact._summarizer.Summarizer`; or give its settings
        (``base_url``, ``model``, ``api_key``, ``timeout``, ``stream``, ``context_window``,
        ``max_retries``, …) directly, or use the ``AGENTCOMPACT_SUMMARIZER_*`` variables.
    :param prompt: system prompt replacing ``DEFAULT_PROMPT`` (``{max_tokens}`` substituted).
    :param cumulative: feed the previous summary instead of earlier cycles' originals.
    :param overflow: ``"trim"`` (head+tail with a marker) or ``"split"`` (parts, in order).
    :param min_output_tokens: below this budget the strategy refuses (engine uses cliff).
    :param cache_size: summaries remembered by prompt digest (0: no cache); default 256,
        or 0 for a trained summarizer (which refuses a cache).
    """

    name = "summary"

    def __init__(self, summarizer: Summarizer | None = None, *, prompt: str | None = None,
                 cumulative: bool = False, overflow: str = "trim", min_output_tokens: int = 64,
                 cache_size: int | None = None, **client: Any) -> None:
        if overflow not in ("trim", "split"):
            raise ConfigError(f"overflow must be 'trim' or 'split', got {overflow!r}")
        self.summarizer = make_summarizer(summarizer, client)
        cache_size = training_cache_size(self.summarizer, cache_size, 256)
        self.prompt = prompt or DEFAULT_PROMPT
        self.cumulative = cumulative
        self.overflow = overflow
        self.min_output_tokens = min_output_tokens
        self.cache = SummaryCache(cache_size)
        self._previous = SummaryCache(64 if cumulative else 0)

    # --- sync / async entry points ----------------------------------------------------
    def compact(self, request: CompactionRequest) -> Rendered:
        plan = self._plan(request)
        texts: list[str] = []
        with self.summarizer.session() as session:
            for job in plan.jobs:
                texts.append(self._cached(job) or self._store(
                    job, run_job_sync(session, job, self._info(request, job))))
        return self._rendered(request, plan, texts)

    async def acompact(self, request: CompactionRequest) -> Rendered:
        plan = self._plan(request)
        async with self.summarizer.asession() as session:
            async def one(job: SummaryJob) -> str:
                await job.aready()
                hit = self._cached(job)
                if hit is not None:
                    return hit
                return self._store(job, await run_job_async(session, job,
                                                            self._info(request, job)))
            texts = list(await asyncio.gather(*(one(job) for job in plan.jobs)))
        return self._rendered(request, plan, texts)

    # --- planning ---------------------------------------------------------------------
    def _plan(self, request: CompactionRequest) -> _Plan:
        counter = request.meter.counter
        pinned_text = pinned_block(request)
        fixed = counter.count_texts([SUMMARY_HEADER + "\n" + pinned_text])[0] + MESSAGE_OVERHEAD
        out_budget = request.budget_tokens - fixed
        if out_budget < self.min_output_tokens:
            raise CompactionError(f"summary budget {out_budget} tokens is below "
                                  f"min_output_tokens={self.min_output_tokens}")
        previous = None
        first = request.head_len
        if self.cumulative:
            previous = self._previous.get(self._range_key(request, first, request.span_start))
            first = request.span_start if previous is not None else first
        entries = summary_entries(request, range(first, request.cut))
        if not entries:
            raise CompactionError("nothing to summarize in the compacted range")
        window = self.summarizer.context_window
        parts = self._parts(entries, window, out_budget, counter)
        jobs = [self._job(request, part, budget, window, previous if k == 0 else None, k,
                          len(parts))
                for k, (part, budget) in enumerate(parts)]
        return _Plan(jobs, pinned_text, out_budget, entries)

    def _parts(self, entries: list[Entry], window: int, out_budget: int,
               counter: TokenCounter) -> list[tuple[list[Entry], int]]:
        if self.overflow == "trim" or _tokens(counter, [e.text for e in entries]) <= self._limit(
                window, out_budget, counter):
            return [(entries, out_budget)]
        # each part's output is a share of out_budget, at most a quarter of the window
        reserve = min(out_budget, int(window * _WINDOW_MARGIN) // 4)
        limit = self._limit(window, reserve, counter)
        parts: list[list[Entry]] = [[]]
        used = 0
        sizes = counter.count_texts([e.text for e in entries])
        for entry, size in zip(entries, sizes, strict=True):
            if parts[-1] and used + size + 1 > limit:
                parts.append([])
                used = 0
            parts[-1].append(entry)
            used += size + 1
        total = sum(len(e.text) for e in entries) or 1
        return [(p, max(1, min(reserve, out_budget * sum(len(e.text) for e in p) // total)))
                for p in parts]

    def _limit(self, window: int, out_budget: int, counter: TokenCounter) -> int:
        system = counter.count_texts([self.prompt])[0]
        return int(window * _WINDOW_MARGIN) - out_budget - system - _PROMPT_OVERHEAD

    def _job(self, request: CompactionRequest, entries: list[Entry], max_tokens: int,
             window: int, previous: str | None, part: int, n_parts: int) -> SummaryJob:
        counter = request.meter.counter
        limit = self._limit(window, max_tokens, counter)
        prev_tokens = counter.count_texts([previous])[0] if previous else 0
        pieces = fit_entries(entries, max(64, limit - prev_tokens), counter)
        if previous:
            pieces = [f"[summary of the turns before these]\n{previous}", *pieces]
        settings = {"strategy": self.name, "max_tokens": max_tokens, "block": None,
                    "part": part, "parts": n_parts, "transcript": pieces,
                    "cumulative": self.cumulative}
        prompt = hook_prompt(request, entries, settings,
                             lambda: default_prompt(self.prompt, pieces, max_tokens))

        def refit(shrink: float) -> SummaryJob:
            return self._job(request, entries, max_tokens, int(window * shrink), previous,
                             part, n_parts)

        return SummaryJob(prompt, max_tokens, None, None, refit,
                          tuple(e.index for e in entries))

    # --- caching and rendering ----------------------------------------------------------
    def _key(self, job: SummaryJob) -> str:
        return digest(self.summarizer.model, job.max_tokens, job.ready())

    def _cached(self, job: SummaryJob) -> str | None:
        job.key = self._key(job)
        return self.cache.get(job.key)

    def _store(self, job: SummaryJob, text: str) -> str:
        self.cache.put(job.key, text)
        return text

    def _info(self, request: CompactionRequest, job: SummaryJob) -> CallInfo:
        return CallInfo(self.name, request.pm, request.episode_id, job.block)

    def _range_key(self, request: CompactionRequest, start: int, end: int) -> str:
        scope = request.episode_id if self.summarizer.trained else None  # see the module doc
        return digest(self.summarizer.model, scope, [request.dialect.digest(m)
                                                     for m in request.messages[start:end]])

    def _rendered(self, request: CompactionRequest, plan: _Plan, texts: list[str]) -> Rendered:
        counter = request.meter.counter
        body = "\n\n".join(t.strip() for t in texts)
        body = fit_text(body, plan.out_budget, counter)
        if not body:
            raise SummarizerError("summary is empty after fitting it to the budget")
        if self.cumulative:
            self._previous.put(self._range_key(request, request.head_len, request.cut), body)
        text = f"{SUMMARY_HEADER}\n{body}{plan.pinned_text}"
        message = request.dialect.text_message(text)
        tokens = request.meter.count_text_message(text)
        return Rendered(message, tokens, request.level, summarized_items(request, plan.entries))


def summarized_items(request: CompactionRequest, entries: Sequence[Entry]) -> list[DroppedItem]:
    """``DroppedItem``\\ s (``summarized``) for this cycle's span messages among ``entries``."""
    span = [e for e in entries if e.index >= request.span_start]
    sizes = request.meter.measure([request.messages[e.index] for e in span]).tokens
    return [DroppedItem(e.index, e.role, "summarized", n)
            for e, n in zip(span, sizes, strict=True)]


@dataclass
class _Plan:
    jobs: list[SummaryJob]
    pinned_text: str
    out_budget: int
    entries: list[Entry]

