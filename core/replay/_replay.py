"""The replay: every model call of recorded sessions, sent through every chosen strategy.

A *call* is the history before a model turn (the messages before each run of assistant
messages). Each strategy gets its own contender per session and is called at every call in
order — incrementally, as a live agent would call it — and what it sends is measured:

* **tokens** with one counter for every strategy (o200k_base by default; a system prompt
  kept outside the messages is counted in every call);
* **cached prefix**: the leading messages equal (by content digest) to the previous call's
  first messages; the system prompt counts as cached from the second call on;
* **cost** of the input with prompt caching (:mod:`.pricing`);
* **time** spent inside the strategy for the call;
* **needed-context recall** (:mod:`.recall`);
* a **compaction record**: which original messages each compaction dropped, rendered or
  truncated, their tokens, and the salient items no longer present anywhere in what was sent.
"""

from __future__ import annotations

import bisect
import itertools
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._archive import Archive
from .._events import CompactionEvent
from .._pins import pinned_texts
from .._pluginmanager import get_plugin_manager, registry
from .._tokens import MessageMeter, TokenCounter, make_counter
from .._turns import split_turns
from ..dialects._base import Dialect
from ..plugins.rules import is_rule, typed_text
from ..trajectory._loaders import Trajectory
from ._baselines import Contender, ContenderSettings, Sent, build_contender, unavailable_reason
from ._pricing import ModelPrice, call_cost, resolve_price
from ._recall import ItemIndex, RecallCount

__all__ = [
    "LOST_ITEMS_CAP",
    "CompactionRecord",
    "ReplayReport",
    "SharedCounter",
    "StrategyRun",
    "TrajectoryReplay",
    "count_calls",
    "replay",
    "replay_trajectory",
]

#: salient items listed per compaction record (the count is always complete)
LOST_ITEMS_CAP = 100
_SYSTEM_KEY = "<system>"
_HANDLE = re.compile(r"ac-[0-9a-f]{12}")


class SharedCounter:
    """A token counter caching counts by text, shared by every engine of a replay so a
    message is tokenized once however many strategies measure it."""

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner
        self.name = inner.name
        self._cache: dict[str, int] = {}

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        cache = self._cache
        missing = [t for t in dict.fromkeys(texts) if t not in cache]
        if missing:
            cache.update(zip(missing, self.inner.count_texts(missing)))
        return [cache[t] for t in texts]


@dataclass
class CompactionRecord:
    """One compaction: when, how big before/after, what went and which salient items."""

    call: int
    at: int
    tokens_before: int
    tokens_after: int
    dropped: list[dict[str, Any]]
    lost_items: list[tuple[str, str]]
    lost_count: int
    reason: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"call": self.call, "at": self.at, "tokens_before": self.tokens_before,
                "tokens_after": self.tokens_after, "reason": self.reason, "error": self.error,
                "dropped": self.dropped, "lost_count": self.lost_count,
                "lost_items": [list(x) for x in self.lost_items]}


@dataclass
class StrategyRun:
    """Per-call series and compaction records of one strategy on one trajectory."""

    name: str
    tokens: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    time_s: list[float] = field(default_factory=list)
    needed: list[int] = field(default_factory=list)
    present: list[int] = field(default_factory=list)
    compacted: list[bool] = field(default_factory=list)
    recall_count: RecallCount = field(default_factory=RecallCount)
    #: needed items in context *or one expand away* (in an archived original whose handle
    #: the context names); ``None`` for a contender without an archive
    expand_count: RecallCount | None = None
    #: rule-like user messages (``agentcompact.plugins.rules.is_rule``) before each call,
    #: and how many of them the context still holds verbatim, summed over calls
    rules_needed: int = 0
    rules_present: int = 0
    compactions: list[CompactionRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def merge(self, other: StrategyRun) -> None:
        """Append ``other``'s series (totals over several trajectories)."""
        for name in ("tokens", "cached", "cost", "time_s", "needed", "present", "compacted",
                     "compactions", "errors"):
            getattr(self, name).extend(getattr(other, name))
        self.recall_count.merge(other.recall_count)
        self.rules_needed += other.rules_needed
        self.rules_present += other.rules_present
        if other.expand_count is not None:
            if self.expand_count is None:
                self.expand_count = RecallCount()
            self.expand_count.merge(other.expand_count)

    def totals(self) -> dict[str, Any]:
        total = sum(self.tokens)
        cached = sum(self.cached)
        calls = len(self.tokens)
        return {
            "calls": calls,
            "compactions": len(self.compactions),
            "peak_tokens": max(self.tokens, default=0),
            "total_input_tokens": total,
            "cached_tokens": cached,
            "cached_share": cached / total if total else 0.0,
            "cost_usd": sum(self.cost),
            "time_s": sum(self.time_s),
            "ms_per_call": 1000 * sum(self.time_s) / calls if calls else 0.0,
            "max_ms_per_call": 1000 * max(self.time_s, default=0.0),
            "recall": self.recall_count.recall,
            "needed_items": self.recall_count.needed,
            "present_items": self.recall_count.present,
            "recall_by_kind": {k: {"needed": n, "present": p, "recall": p / n if n else None}
                               for k, (n, p) in sorted((self.recall_count.by_kind or {}).items())},
            "user_rules": {"needed": self.rules_needed, "present": self.rules_present,
                           "survival": (self.rules_present / self.rules_needed
                                        if self.rules_needed else None)},
            "recall_with_expand": (self.expand_count.recall if self.expand_count is not None
                                   else None),
            "recall_by_kind_with_expand": {
                k: {"needed": n, "reachable": p, "recall": p / n if n else None}
                for k, (n, p) in sorted(((self.expand_count.by_kind if self.expand_count
                                          else None) or {}).items())},
            "errors": len(self.errors),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"totals": self.totals(),
                "series": {"tokens": self.tokens, "cached": self.cached,
                           "cost_usd": self.cost, "time_s": self.time_s,
                           "needed": self.needed, "present": self.present,
                           "compacted": self.compacted},
                "compactions": [c.to_dict() for c in self.compactions],
                "errors": self.errors}


@dataclass
class TrajectoryReplay:
    """The replay of one trajectory: its calls and one :class:`StrategyRun` per strategy."""

    source: str
    format: str
    dialect: str
    messages: int
    history_tokens: int
    system_tokens: int
    calls: list[int]
    harness_compactions: list[int]
    runs: dict[str, StrategyRun]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "format": self.format, "dialect": self.dialect,
                "messages": self.messages, "history_tokens": self.history_tokens,
                "system_tokens": self.system_tokens, "calls": self.calls,
                "harness_compactions": self.harness_compactions,
                "strategies": {k: v.to_dict() for k, v in self.runs.items()}}


@dataclass
class ReplayReport:
    """Everything a replay measured (``to_dict`` is the ``--json`` output)."""

    strategies: list[str]
    skipped: dict[str, str]
    trigger: int
    target: int
    price: ModelPrice
    counter: str
    trajectories: list[TrajectoryReplay]
    elapsed_s: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)

    def totals(self) -> dict[str, dict[str, Any]]:
        """Per strategy, figures over every trajectory."""
        out: dict[str, dict[str, Any]] = {}
        for name in self.strategies:
            merged = StrategyRun(name)
            for t in self.trajectories:
                if name in t.runs:
                    merged.merge(t.runs[name])
            out[name] = merged.totals()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"settings": {"strategies": self.strategies, "trigger": self.trigger,
                             "target": self.target, "counter": self.counter,
                             "price": self.price.to_dict()},
                "skipped": self.skipped, "failures": self.failures,
                "elapsed_s": self.elapsed_s, "totals": self.totals(),
                "trajectories": [t.to_dict() for t in self.trajectories]}


class _Session:
    """One trajectory prepared for replay: measured, indexed, split into calls."""

    def __init__(self, traj: Trajectory, dialect: Dialect, meter: MessageMeter) -> None:
        self.traj = traj
        self.dialect = dialect
        self.meter = meter
        self.messages = traj.messages
        # each message's text once, for its count and its items (text_of is counted_text's
        # text unless a dialect overrides text_of)
        counted = None
        if isinstance(dialect, Dialect) and type(dialect).text_of is Dialect.text_of:
            counted = [dialect.counted_text(m) for m in self.messages]
            texts = [text for text, _ in counted]
        else:
            texts = [dialect.text_of(m) for m in self.messages]
        measured = meter.measure(self.messages, counted)
        self.digests = measured.digests
        self.tokens = measured.tokens
        self.prefix = [0, *itertools.accumulate(self.tokens)]  # prefix[i]: tokens of [:i]
        self.index_of = {id(m): i for i, m in enumerate(self.messages)}
        self.rules = [i for i, m in enumerate(self.messages)
                      if dialect.role(m) == "user" and is_rule(_human_text(dialect, m))]
        self.system_tokens = (meter.count_text_message(traj.system) if traj.system else 0)
        self.items = ItemIndex(texts, traj.system or "")
        starts = split_turns(self.messages, dialect).starts
        self.calls = [s for s in starts if s > 0]
        self.outputs = [self._output_items(s) for s in self.calls]
        self._all_present: tuple[int, RecallCount] | None = None

    def all_present(self, call: int, needed: dict[str, str]) -> RecallCount:
        """The recall count of call ``call`` when every original message before it is sent:
        every needed item is present (it appeared in one of them, or in the system prompt).
        Computed once per call for all the contenders that sent the history unchanged."""
        memo = self._all_present
        if memo is None or memo[0] != call:
            count = RecallCount()
            for kind in needed.values():
                count.add(kind, True)
            memo = self._all_present = (call, count)
        return memo[1]

    def _output_items(self, start: int) -> dict[str, str]:
        """Items of the model output that starts at ``start`` (its run of model messages)."""
        items: dict[str, str] = {}
        for i in range(start, len(self.messages)):
            if not self.dialect.is_model_output(self.messages[i]):
                break
            for item, kind in self.items.items[i].items():
                items.setdefault(item, kind)
        return items


class _Accountant:
    """Measures what one contender sends, call after call."""

    def __init__(self, session: _Session, name: str, price: ModelPrice,
                 archive: Archive | None = None) -> None:
        self.s = session
        self.price = price
        self.run = StrategyRun(name)
        self.archive = archive
        if archive is not None:
            self.run.expand_count = RecallCount()
        # the previous call's message keys: a list, or (``_keys is None``) the system key
        # and the digests of the first ``_keys_at`` original messages (an unchanged history)
        self._keys: list[str] | None = []
        self._keys_at = 0
        self._sent_tokens = 0
        self._at = 0
        self._not_kept: set[int] = set()
        self._written: dict[int, tuple[Any, str, int, frozenset[str]]] = {}

    def record(self, call: int, at: int, context: list[Any], sent: Sent, dt: float,
               needed: dict[str, str]) -> None:
        s, run = self.s, self.run
        keys: list[str] | None
        if sent.messages is context:  # sent unchanged: the first ``at`` original messages
            # figures from the session's prefix sums, without a pass over the messages
            kept: Collection[int] = range(at)
            written: list[frozenset[str]] = []
            keys, total = None, s.system_tokens + s.prefix[at]
            if self._keys is None:  # both calls sent original prefixes: the shorter is shared
                cached = s.system_tokens + s.prefix[min(at, self._keys_at)]
            else:
                unchanged, toks = self._system_keys()
                unchanged.extend(s.digests[:at])
                toks.extend(s.tokens[:at])
                cached = sum(toks[: _common_prefix(unchanged, self._keys)])
            count = s.all_present(call, needed)
            if run.expand_count is not None:
                run.expand_count.merge(count)
            rules = bisect.bisect_left(s.rules, at)
            run.rules_needed += rules
            run.rules_present += rules
        else:
            keys, toks, kept, written = self._measure(sent.messages)
            previous = self._keys
            if previous is None:
                previous = self._system_keys()[0] + s.digests[: self._keys_at]
            total, cached = sum(toks), sum(toks[: _common_prefix(keys, previous)])
            count = RecallCount()
            reachable = RecallCount() if self.archive is not None else None
            texts = self._expandable(sent.messages) if reachable is not None else []
            for item, kind in needed.items():
                present = s.items.present(item, kept, written)
                count.add(kind, present)
                if reachable is not None:
                    reachable.add(kind, present or any(item in t for t in texts))
            if reachable is not None and run.expand_count is not None:
                run.expand_count.merge(reachable)
            self._count_rules(at, kept, sent.messages)
        before = self._sent_tokens + (s.prefix[at] - s.prefix[self._at] if self._at < at else 0)
        run.tokens.append(total)
        run.cached.append(cached)
        run.cost.append(call_cost(self.price, total, cached))
        run.time_s.append(dt)
        run.needed.append(count.needed)
        run.present.append(count.present)
        run.compacted.append(sent.compacted)
        run.recall_count.merge(count)
        if sent.error:
            run.errors.append(f"call {call}: {sent.error}")
        if sent.compacted:
            self._compactions(call, at, sent, before, total, kept, written)
        self._keys, self._keys_at, self._sent_tokens, self._at = keys, at, total, at

    def _count_rules(self, at: int, kept: Collection[int], messages: Sequence[Any]) -> None:
        s = self.s
        rules = s.rules[:bisect.bisect_left(s.rules, at)]
        if not rules:
            return
        index_of = s.index_of
        written = [s.dialect.text_of(m) for m in messages if id(m) not in index_of]
        self.run.rules_needed += len(rules)
        for i in rules:
            if i in kept:
                self.run.rules_present += 1
                continue
            pieces = pinned_texts(s.dialect, s.messages[i])
            self.run.rules_present += all(any(p in w for w in written) for p in pieces)

    def _expandable(self, messages: Sequence[Any]) -> list[str]:
        """Originals one expand away: archived under a handle the messages name."""
        archive = self.archive
        if archive is None:
            return []
        index_of = self.s.index_of
        handles: set[str] = set()
        for m in messages:
            if id(m) not in index_of:  # written by the strategy: a compaction, a truncation
                handles.update(_HANDLE.findall(self.s.dialect.text_of(m)))
        found = (archive.get(h) for h in sorted(handles))
        return [item.text for item in found if item is not None]

    def _system_keys(self) -> tuple[list[str], list[int]]:
        if self.s.system_tokens:
            return [_SYSTEM_KEY], [self.s.system_tokens]
        return [], []

    def _measure(self, messages: Sequence[Any]
                 ) -> tuple[list[str], list[int], set[int], list[frozenset[str]]]:
        s = self.s
        keys, toks = self._system_keys()
        written: list[frozenset[str]] = []
        found = list(map(s.index_of.get, map(id, messages)))
        if None not in found:  # only original messages: map them at C speed
            keys.extend(map(s.digests.__getitem__, found))  # type: ignore[arg-type]
            toks.extend(map(s.tokens.__getitem__, found))  # type: ignore[arg-type]
            return keys, toks, set(found), written  # type: ignore[arg-type]
        kept = set(found)
        kept.discard(None)
        start = 0
        for j in _positions(found, None):  # messages the strategy wrote: few, measured once
            keys.extend(map(s.digests.__getitem__, found[start:j]))  # type: ignore[arg-type]
            toks.extend(map(s.tokens.__getitem__, found[start:j]))  # type: ignore[arg-type]
            _, digest, n, items = self._written_message(messages[j])
            keys.append(digest)
            toks.append(n)
            written.append(items)
            start = j + 1
        keys.extend(map(s.digests.__getitem__, found[start:]))  # type: ignore[arg-type]
        toks.extend(map(s.tokens.__getitem__, found[start:]))  # type: ignore[arg-type]
        return keys, toks, kept, written  # type: ignore[return-value]

    def _written_message(self, m: Any) -> tuple[Any, str, int, frozenset[str]]:
        hit = self._written.get(id(m))
        if hit is None or hit[0] is not m:
            measured = self.s.meter.measure([m])
            items = self.s.items.written_items(self.s.dialect.text_of(m))
            hit = self._written[id(m)] = (m, measured.digests[0], measured.tokens[0], items)
        return hit

    def _compactions(self, call: int, at: int, sent: Sent, before: int, after: int,
                     kept: Collection[int], written: list[frozenset[str]]) -> None:
        done = [e for e in sent.events if e.fallback != "none"]
        if done:
            for event in done:
                self._record(call, at, before, after, kept, written, _dropped(event), event)
            return
        not_kept = set(range(at)).difference(kept)
        new = sorted(not_kept - self._not_kept)
        self._not_kept = not_kept
        s = self.s
        dropped = [{"index": i, "role": s.dialect.role(s.messages[i]), "action": sent.drop_action,
                    "tokens": s.tokens[i], "kind": "message"} for i in new]
        self._record(call, at, before, after, kept, written, dropped, None)

    def _record(self, call: int, at: int, before: int, after: int, kept: Collection[int],
                written: list[frozenset[str]], dropped: list[dict[str, Any]],
                event: CompactionEvent | None) -> None:
        items = self.s.items
        candidates: dict[str, str] = {}
        for d in dropped:
            for item, kind in items.items[d["index"]].items():
                candidates.setdefault(item, kind)
        lost = [(i, k) for i, k in candidates.items() if not items.present(i, kept, written)]
        self.run.compactions.append(CompactionRecord(
            call=call, at=at,
            tokens_before=before if event is None else event.tokens_before,
            tokens_after=after, dropped=dropped, lost_items=lost[:LOST_ITEMS_CAP],
            lost_count=len(lost), reason=event.reason if event else None,
            error=event.error if event else None))


def _positions(values: list[Any], value: Any) -> list[int]:
    """Indices of ``value`` in ``values`` (each found by ``list.index``, at C speed)."""
    out: list[int] = []
    try:
        while True:
            out.append(values.index(value, out[-1] + 1 if out else 0))
    except ValueError:
        return out


def _common_prefix(a: list[str], b: list[str]) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (list compares run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _human_text(dialect: Dialect, message: Any) -> str:
    """What the user typed in a message (what the rules plugin reads): not its results,
    not harness text."""
    return str(typed_text(message, dialect))


def _archive_of(contender: Any) -> Archive | None:
    """The archive a contender's strategy writes to (the cliff strategy's), if any."""
    archive = getattr(getattr(getattr(contender, "engine", None), "strategy", None),
                      "archive", None)
    return archive if isinstance(archive, Archive) else None


def _dropped(event: CompactionEvent) -> list[dict[str, Any]]:
    return [{"index": d.index, "role": d.role, "action": d.action, "tokens": d.tokens,
             "kind": d.kind} for d in event.dropped]


def replay_trajectory(
    traj: Trajectory, strategies: Sequence[str], settings: ContenderSettings,
    price: ModelPrice, *, on_call: Callable[[], None] | None = None,
    contenders: dict[str, Contender] | None = None,
) -> TrajectoryReplay:
    """Replay every call of ``traj`` through each strategy (fresh contenders).

    ``contenders`` may supply ready contenders by name (tests, custom baselines).
    """
    counter = settings.counter if settings.counter is not None else make_counter(None)
    dialect = registry(settings.pm).dialect(traj.dialect)
    session = _Session(traj, dialect, MessageMeter(counter, dialect))
    chosen = [(contenders or {}).get(name) or build_contender(
        name, dialect, session.meter, traj.system, settings) for name in strategies]
    accountants = [_Accountant(session, name, price, _archive_of(contender))
                   for name, contender in zip(strategies, chosen)]
    messages = session.messages
    for call, at in enumerate(session.calls):
        context = messages[:at]
        needed = session.items.needed(session.outputs[call], at)
        for contender, acc in zip(chosen, accountants):
            t0 = time.perf_counter()
            sent = contender.prepare(context)
            acc.record(call, at, context, sent, time.perf_counter() - t0, needed)
        if on_call is not None:
            on_call()
    return TrajectoryReplay(
        source=traj.source, format=traj.format, dialect=traj.dialect, messages=len(messages),
        history_tokens=sum(session.tokens) + session.system_tokens,
        system_tokens=session.system_tokens, calls=session.calls,
        harness_compactions=[m.index for m in traj.compactions],
        runs={a.run.name: a.run for a in accountants})


def count_calls(traj: Trajectory) -> int:
    """How many model calls a replay of ``traj`` makes per strategy."""
    dialect = registry().dialect(traj.dialect)
    return sum(1 for s in split_turns(traj.messages, dialect).starts if s > 0)


def replay(
    trajectories: Iterable[Trajectory], strategies: Sequence[str], *, trigger: int,
    target: int | None = None, price: str | ModelPrice | None = None,
    model: str | None = None, counter: str | TokenCounter | None = None,
    summarizer_url: str | None = None, summarizer_model: str | None = None,
    summarizer_options: Mapping[str, Any] | None = None,
    on_call: Callable[[], None] | None = None,
) -> ReplayReport:
    """Replay ``trajectories`` through ``strategies``; strategies that cannot run are listed
    in ``skipped`` with the reason, trajectories that fail in ``failures``.
    ``summarizer_options``: further ``Summarizer`` arguments (``timeout``,
    ``context_window``, ``api_key``) for the LLM strategies."""
    t0 = time.perf_counter()
    pm = get_plugin_manager()
    shared = SharedCounter(make_counter(counter))
    settings = ContenderSettings(trigger, target, shared, pm, summarizer_url, summarizer_model,
                                 dict(summarizer_options or {}))
    skipped = {n: r for n in strategies if (r := unavailable_reason(n, settings)) is not None}
    chosen = [n for n in strategies if n not in skipped]
    runs: list[TrajectoryReplay] = []
    failures: dict[str, str] = {}
    prices: dict[str, ModelPrice] = {}
    for traj in trajectories:
        p = price if isinstance(price, ModelPrice) else prices.setdefault(
            traj.dialect, resolve_price(price, model, traj.dialect))
        try:
            runs.append(replay_trajectory(traj, chosen, settings, p, on_call=on_call))
        except Exception as exc:  # one bad session must not lose the others' figures
            failures[traj.source] = f"{type(exc).__name__}: {exc}"
    first = price if isinstance(price, ModelPrice) else (
        next(iter(prices.values())) if prices else resolve_price(price, model, "anthropic"))
    return ReplayReport(chosen, skipped, trigger, settings.budget.target, first,
                        shared.name, runs, time.perf_counter() - t0, failures)

