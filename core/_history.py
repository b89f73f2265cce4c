"""The history of one call, measured once: the per-message facts every layer reads.

A :class:`History` holds, for each message of one call's history, its digest and token
count, the chain digest of every prefix (the prefix-store key), the prefix sums of the
counts, and, derived on first read, whether it is model output (so the turn starts), its
role, parts and tool parts (:data:`MessageFacts`) and the index of its tool calls and
results (:class:`ToolIndex`). The engine's planner, checker and fold, and the strategies
(``CompactionRequest.history``; :func:`history_of` for a request without one), read
these instead of deriving them again.

:class:`HistoryCache` is the seam where histories are built: it extends the last call's
history when the new call's messages start with the same objects (an agent's growing
list; the proxy's interned parse), so a call costs what is new in it.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ._interner import same_objects
from ._store import chain_digests, extend_chain
from .dialects._base import Dialect, Part, first_text_marked

if TYPE_CHECKING:
    from ._tokens import MessageMeter

__all__ = ["History", "HistoryCache", "MessageFacts", "ToolIndex", "history_of"]

MessageFacts = tuple[str, bool, tuple[Part, ...], tuple[Part, ...]]
"""A message's role, whether it is synthetic (``Dialect.is_synthetic``), its parts, and
its tool-call and tool-result parts (none when the dialect finds no tool-call or result
id in it)."""


class _ModelFlags:
    """Whether each message is model output, and the turn starts, filled on first read up
    to the length asked for. Shared by the histories of one growing list (each reads the
    entries of its own messages only, which never change)."""

    __slots__ = ("ends", "examined", "flags", "lock", "starts")

    def __init__(self, flags: list[bool] | None = None, starts: list[int] | None = None,
                 ends: list[int] | None = None) -> None:
        self.flags = flags if flags is not None else []
        self.starts = starts if starts is not None else []
        #: the messages that end a tool loop (``loop_start``) among the first ``examined``
        self.ends = ends if ends is not None else []
        self.examined = 0
        self.lock = threading.Lock()  # histories of one list may be read from two threads

    def upto(self, messages: Sequence[Any], dialect: Dialect, end: int) -> None:
        flags, starts = self.flags, self.starts
        if len(flags) >= end:
            return
        is_model = dialect.is_model_output
        with self.lock:
            for i in range(len(flags), end):
                model = is_model(messages[i])
                if model and not (i and flags[i - 1]):
                    starts.append(i)
                flags.append(model)

    def loop_ends(self, messages: Sequence[Any], dialect: Dialect, end: int) -> None:
        """Fill :attr:`ends` up to ``end``: the ``user`` messages answering no tool call."""
        if self.examined >= end:
            return
        role, answers = dialect.role, dialect.tool_result_ids
        with self.lock:
            for i in range(self.examined, end):
                if role(messages[i]) == "user" and not answers(messages[i]):
                    self.ends.append(i)
            self.examined = max(self.examined, end)

    def prefix(self, k: int) -> _ModelFlags:
        """The flags of the first ``k`` messages only (a history that differs from ``k``)."""
        flags = self.flags[:k]
        starts = self.starts[:bisect.bisect_left(self.starts, len(flags))]
        out = _ModelFlags(flags, starts, self.ends[:bisect.bisect_left(self.ends, k)])
        out.examined = min(self.examined, k)
        return out


def _facts_of(dialect: Dialect, message: Any) -> MessageFacts:
    parts = tuple(dialect.parts(message))
    tools = tuple(p for p in parts if p.kind in ("tool_call", "tool_result"))
    if tools and not (dialect.tool_call_ids(message) or dialect.tool_result_ids(message)):
        tools = ()
    role = dialect.role(message)
    if type(dialect).is_synthetic is Dialect.is_synthetic:  # from the parts at hand
        synthetic = role == "user" and first_text_marked(parts)
    else:
        synthetic = dialect.is_synthetic(message)
    return role, synthetic, parts, tools


@dataclass(frozen=True)
class ToolIndex:
    """The tool calls and results of a history's first ``end`` messages: ``calls`` maps a
    call's ref to its (tool name, arguments), ``results`` to the part answering it (the
    last of each ref), ``order`` holds ``(key(name, arguments), ref)`` of every call, in
    order. Never changed once made (a longer history's index is a new one)."""

    end: int
    key: Callable[[str, str], Any]
    calls: dict[str, tuple[str, str]]
    results: dict[str, Part]
    order: list[tuple[Any, str]]


class _MessageFacts:
    """The :data:`MessageFacts` of each message, filled on first read up to the length
    asked for, and the last :class:`ToolIndex` made (the next, of a longer prefix, is made
    from it). Shared as :class:`_ModelFlags` is."""

    __slots__ = ("facts", "index", "lock")

    def __init__(self, facts: list[MessageFacts] | None = None,
                 index: ToolIndex | None = None) -> None:
        self.facts = facts if facts is not None else []
        self.index = index
        self.lock = threading.Lock()

    def upto(self, messages: Sequence[Any], dialect: Dialect, end: int) -> None:
        facts = self.facts
        if len(facts) >= end:
            return
        with self.lock:
            for i in range(len(facts), end):
                facts.append(_facts_of(dialect, messages[i]))

    def tool_index(self, end: int, key: Callable[[str, str], Any]) -> ToolIndex:
        """The index of the first ``end`` messages (their facts filled), made from the
        last one when it is of a shorter prefix with the same ``key``."""
        last = self.index
        if last is not None and last.key is key and last.end <= end:
            if last.end == end:
                return last
            start, calls, results = last.end, dict(last.calls), dict(last.results)
            order = list(last.order)
        else:
            start, calls, results, order = 0, {}, {}, []
        facts = self.facts
        for i in range(start, end):
            for part in facts[i][3]:
                if part.kind == "tool_call":
                    calls[part.ref] = (part.name, part.text)
                    order.append((key(part.name, part.text), part.ref))
                elif part.kind == "tool_result":
                    results[part.ref] = part
        index = self.index = ToolIndex(end, key, calls, results, order)
        return index

    def prefix(self, k: int) -> _MessageFacts:
        """The facts of the first ``k`` messages only (a history that differs from ``k``)."""
        index = self.index
        return _MessageFacts(self.facts[:k], index if index is not None and index.end <= k
                             else None)


@dataclass
class History:
    """One call's messages and their facts (see the module docstring).

    ``tokens[i]`` is 0 while message ``i`` is in ``pending`` (not counted yet: an upper
    bound of its count), which :meth:`HistoryCache.resolve` counts; ``prefix[i]`` is the
    tokens of ``messages[:i]``; ``chain[i]`` the chain digest of ``messages[:i + 1]``;
    ``fixed`` the tokens sent besides the messages (system prompt, tool schemas).
    """

    messages: list[Any]
    digests: list[str]
    tokens: list[int]
    chain: list[str]
    prefix: list[int]
    dialect: Dialect
    meter: MessageMeter
    fixed: int = 0
    pending: dict[int, int] = field(default_factory=dict)
    _model: _ModelFlags = field(default_factory=_ModelFlags, repr=False)
    _facts: _MessageFacts = field(default_factory=_MessageFacts, repr=False)

    def __len__(self) -> int:
        return len(self.messages)

    def is_model(self, i: int) -> bool:
        """Whether ``messages[i]`` is model output (``Dialect.is_model_output``)."""
        self._model.upto(self.messages, self.dialect, i + 1)
        return self._model.flags[i]

    def facts(self, end: int | None = None) -> Sequence[MessageFacts]:
        """The :data:`MessageFacts` of ``messages[:end]``, by index (a list shared with
        the histories of one growing list: read the first ``end`` entries only)."""
        end = len(self.messages) if end is None else end
        self._facts.upto(self.messages, self.dialect, end)
        return self._facts.facts

    def role(self, i: int) -> str:
        """The role of ``messages[i]`` (its :data:`MessageFacts`)."""
        return self.facts(i + 1)[i][0]

    def synthetic(self, i: int) -> bool:
        """Whether ``messages[i]`` is synthetic (a compaction message fed back in)."""
        return self.facts(i + 1)[i][1]

    def tool_index(self, end: int, key: Callable[[str, str], Any]) -> ToolIndex:
        """The :class:`ToolIndex` of ``messages[:end]``, calls keyed by ``key(name,
        arguments)`` (calls with one key supersede each other)."""
        facts = self._facts
        facts.upto(self.messages, self.dialect, end)
        with facts.lock:
            return facts.tool_index(end, key)

    def turn_starts(self, end: int | None = None) -> tuple[int, ...]:
        """The turn starts of ``messages[:end]`` (``split_turns(...).starts``)."""
        end = len(self.messages) if end is None else end
        model = self._model
        model.upto(self.messages, self.dialect, end)
        starts = model.starts
        if starts and starts[-1] >= end:
            return tuple(starts[:bisect.bisect_left(starts, end)])
        return tuple(starts)

    def loop_start(self, end: int | None = None) -> int | None:
        """:func:`~agentcompact._turns.loop_start` of ``messages[:end]``, by bisection on
        the turn starts and the messages ending a tool loop (found once per message: a
        history replayed at once asks at every threshold crossing)."""
        end = len(self.messages) if end is None else end
        model = self._model
        model.upto(self.messages, self.dialect, end)
        model.loop_ends(self.messages, self.dialect, end)
        ends, starts = model.ends, model.starts
        k = bisect.bisect_left(ends, end)
        last = ends[k - 1] if k else -1
        if last >= 0 and model.flags[last]:  # a loop end that is model output: scan
            return next((j for j in range(last + 1, end) if model.flags[j]), None)
        j = bisect.bisect_right(starts, last)
        return starts[j] if j < len(starts) and starts[j] < end else None

    def turn_start(self, i: int) -> bool:
        """Whether a turn starts at ``messages[i]``."""
        return self.is_model(i) and (i == 0 or not self.is_model(i - 1))

    def newest_turn(self, lo: int, hi: int) -> int:
        """Where the newest turn of ``messages[lo:hi]`` starts (``lo`` if none does)."""
        return max((s for s in range(lo, hi) if self.turn_start(s)), default=lo)

    def grown_only(self) -> bool:
        """Whether the lists hold this history's entries and no more (no later history
        extended them in place: :meth:`HistoryCache.extend` may)."""
        m = len(self.messages)
        return (len(self.digests) == len(self.tokens) == len(self.chain) == m
                == len(self.prefix) - 1)


class HistoryCache:
    """Builds each call's :class:`History`, from the last call's where they share leading
    messages (by identity). Not thread-safe: the engine calls it under its lock."""

    def __init__(self, meter: MessageMeter) -> None:
        self._meter = meter
        self._last: History | None = None
        self.seed = ""

    def forget(self, seed: str) -> None:
        """Start afresh with chain digests seeded with ``seed`` (a new store scope)."""
        self.seed = seed
        self._last = None

    def extend(self, messages: Sequence[Any]) -> History:
        """The history of ``messages`` (the new messages measured deferred:
        :meth:`MessageMeter.measure_deferred`)."""
        msgs = list(messages)
        last = self._last
        if last is None:
            measured, pending = self._meter.measure_deferred(msgs)
            digests, tokens = measured.digests, measured.tokens
            history = History(msgs, digests, tokens, chain_digests(digests, seed=self.seed),
                              [0, *itertools.accumulate(tokens)], self._meter.dialect,
                              self._meter, pending=pending)
        else:
            history = self._extend(last, msgs)
        self._last = history
        return history

    def resolve(self, history: History) -> History:
        """``history`` with its pending messages counted (``history`` itself when none is)."""
        if not history.pending:
            return history
        at = sorted(history.pending)
        msgs, digests = history.messages, history.digests
        counts = self._meter.count_deferred([msgs[i] for i in at], [digests[i] for i in at])
        tokens = list(history.tokens)
        for i, count in zip(at, counts):
            tokens[i] = count
        resolved = History(msgs, digests, tokens, history.chain,
                           _prefix_sums(history.prefix, tokens, at[0]), history.dialect,
                           history.meter, history.fixed, _model=history._model,
                           _facts=history._facts)
        if self._last is history:
            self._last = resolved
        return resolved

    def _extend(self, last: History, msgs: list[Any]) -> History:
        """The history of ``msgs``, reusing ``last``'s figures for the leading messages
        that are the same objects (an in-process agent's growing list; the proxy's parser
        hands back the earlier objects for unchanged messages, and :class:`~agentcompact.
        _interner.Interner` does for other callers parsing requests afresh). The rest is
        measured (``MessageMeter`` caches by identity and by digest)."""
        k = same_objects(msgs, last.messages)
        if k == len(last.messages) and last.grown_only():
            return self._grow(last, msgs)
        digests = last.digests[:k]
        tokens = last.tokens[:k]
        pending = last.pending
        if pending and k < len(last.messages):  # the last messages from k on differ
            pending = {i: b for i, b in pending.items() if i < k}
        else:
            pending = dict(pending)
        if len(msgs) > k:
            self._measure_onto(msgs, k, digests, tokens, pending)
        # the chain and the prefix sums are recomputed from the first changed message
        chain = chain_digests(digests, last.chain[: _common(digests, last.digests, k)],
                              seed=self.seed)
        prefix = _prefix_sums(last.prefix, tokens, _common(tokens, last.tokens, k))
        return History(msgs, digests, tokens, chain, prefix, last.dialect, last.meter,
                       pending=pending, _model=last._model.prefix(k),
                       _facts=last._facts.prefix(k))

    def _grow(self, last: History, msgs: list[Any]) -> History:
        """The history of ``msgs``, the messages of ``last`` followed by new ones:
        ``last``'s lists are extended in place, not copied (a history reads only the
        entries of its own messages, which never change; an older one sharing the lists
        sees what it saw). Copying them cost a pass over every message at every call."""
        m = len(last.messages)
        digests, tokens, chain, prefix = last.digests, last.tokens, last.chain, last.prefix
        pending = dict(last.pending)
        if len(msgs) > m:
            self._measure_onto(msgs, m, digests, tokens, pending)
            extend_chain(chain, digests[m:], self.seed)
            sums = itertools.accumulate(tokens[m:], initial=prefix[-1])
            next(sums)  # the initial value: prefix[m], there already
            prefix += sums
        return History(msgs, digests, tokens, chain, prefix, last.dialect, last.meter,
                       pending=pending, _model=last._model, _facts=last._facts)

    def _measure_onto(self, msgs: list[Any], k: int, digests: list[str], tokens: list[int],
                      pending: dict[int, int]) -> None:
        """Measure ``msgs[k:]`` (deferred) onto the lists of ``msgs[:k]``'s digests and
        counts, and their byte bounds into ``pending``."""
        measured, new = self._meter.measure_deferred(msgs[k:])
        digests += measured.digests
        tokens += measured.tokens
        for i, bound in new.items():
            pending[k + i] = bound


def history_of(messages: Sequence[Any], meter: MessageMeter,
               dialect: Dialect | None = None, resolve: bool = False) -> History:
    """The history of ``messages`` on its own (for a strategy called without the engine's:
    ``CompactionRequest.history`` is ``None``), its facts read with ``dialect`` (default:
    the meter's), its pending counts counted with ``resolve``."""
    cache = HistoryCache(meter)
    history = cache.extend(messages)
    if resolve:
        history = cache.resolve(history)
    if dialect is not None and dialect is not history.dialect:
        history = replace(history, dialect=dialect)
    return history


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
