"""The fold: a large tool output the agent has read is truncated at the next call.

A large tool output of the newest kept turn is whole at a compaction because the agent has
not read it. At the first call after it has (a model output follows it), :func:`fold`
truncates it to about ``FOLD_TOKENS`` (``Dialect.truncate``: head, tail, error lines, the
handle of the original). Only the messages from the first fold on are sent anew (a cache
write, 1.25x, instead of a read, 0.1x, for a few thousand tokens), and every later call
reads thousands of tokens less.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ._check import validity
from ._events import CompactionEvent, DroppedItem
from ._history import History
from ._plan import FOLD_TOKENS, State, shrink
from ._store import PrefixEntry, PrefixStore

__all__ = ["Folded", "fold", "fold_due", "fold_stored"]


@dataclass(frozen=True)
class Folded:
    """The entry with its folds done (``entry``, to store under ``chain[length - 1]``),
    what it truncated (``dropped``; empty when nothing was), and the problem that undid
    the truncation (then nothing is folded, and it is not tried again), and its event."""

    entry: PrefixEntry
    length: int
    dropped: tuple[DroppedItem, ...]
    problem: str | None
    event: CompactionEvent | None = None  # none when nothing was tried


def fold_due(history: History, entry: PrefixEntry | None, n: int) -> bool:
    """Whether ``entry`` has folds the agent has read in ``messages[:n]``."""
    return entry is not None and bool(entry.folds) and _read(history, entry, n)


def _read(history: History, entry: PrefixEntry, n: int) -> bool:
    """Whether the agent has read the entry's folds: a model output follows them in
    ``messages[:n]``."""
    return any(history.is_model(k) for k in range(max(i for i, _ in entry.folds) + 1, n))


def _read_at(history: History, entry: PrefixEntry, n: int) -> int:
    """The least ``m <= n`` for which :func:`_read` holds of ``messages[:m]`` (it holds of
    ``messages[:n]``, and once it holds it holds of every longer history)."""
    lo, hi = max(i for i, _ in entry.folds) + 1, n
    while lo < hi:
        mid = (lo + hi) // 2
        if _read(history, entry, mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def fold(history: History, entry: PrefixEntry, n: int, *, strategy: str, limit: int,
         episode_id: str | None) -> Folded:
    """``entry`` with its read folds truncated in ``overrides``. It is stored under the
    prefix that holds the read (the first ``messages[:m]`` the rule calls read), not the
    compaction's: a retry of the compacting request, or another rollout from its prefix,
    has not read the output and still gets it whole."""
    t0 = time.perf_counter()
    overrides = dict(entry.overrides)
    dropped: list[DroppedItem] = []
    msgs, tokens, dialect = history.messages, history.tokens, history.dialect
    for i, digest in entry.folds:
        if i >= n or history.digests[i] != digest or i in overrides:
            continue
        copy, size = shrink(history, msgs[i], tokens[i], FOLD_TOKENS)
        if copy is not msgs[i] and size < tokens[i]:
            overrides[i] = (digest, copy, size)
            dropped.append(DroppedItem(i, history.role(i), "truncated",
                                       tokens[i] - size, "tool_result"))
    length = _read_at(history, entry, n)
    folded = replace(entry, overrides=overrides, folds=(), length=length)
    if not dropped:
        return Folded(folded, length, (), None)
    problem = validity(history, State(folded).messages_at(history, n), n)
    if problem is not None:
        folded, dropped = replace(entry, folds=(), length=length), []
    state = State(folded)
    before, after = State(entry).tokens_at(history, n), state.tokens_at(history, n)
    event = CompactionEvent(
        strategy=strategy, dialect=dialect.name, tokens_before=before, tokens_after=after,
        messages_before=n, messages_after=len(state.messages_at(history, n)),
        head_len=folded.head_len, cut=folded.cut, reason="fold", level=folded.level,
        over_budget=after > limit, latency_s=time.perf_counter() - t0, dropped=dropped,
        episode_id=episode_id, error=problem, fallback=None if problem is None else "none")
    return Folded(folded, length, tuple(dropped), problem, event)


def fold_stored(history: History, state: State, n: int, store: PrefixStore,
                events: list[CompactionEvent], *, strategy: str, limit: int,
                episode_id: str | None) -> State:
    """``state`` with its entry's read folds done (:func:`fold`; :func:`fold_due` held):
    stored in ``store`` under the prefix holding the read; its event appended to
    ``events``."""
    assert state.entry is not None  # fold_due held
    folded = fold(history, state.entry, n, strategy=strategy, limit=limit,
                  episode_id=episode_id)
    store.put(history.chain[folded.length - 1], folded.entry)
    if folded.event is not None:
        events.append(folded.event)
    return State(folded.entry)
