"""Training rows in memory: episodes' events → segment rows and advantages, no files.

The seam for online training loops (a rollout worker, a trainer's agent loop, a proxy
gateway): the loop registers an :class:`EpisodeCollector` where it would register a
``Recorder``, runs episodes through the engine, and turns each finished episode into rows
at once; a batch of episodes then gets its group statistics::

    collector = EpisodeCollector()
    pm.register(collector)
    ...                                   # run episodes; report each EpisodeEnd
    done = [episode_rows(e, tok) for e in collector.finished()]   # per episode, any time
    batch = group_advantages(done)        # GRPO over the episodes of each group
    batch.rows                            # -> collate / to_verl / to_skyrl / the loss

The rows are exactly those ``agentcompact export`` writes for the same events (the
recorder's file and this collector see the same hook calls; a test compares the two, row
for row and field for field): the same segment builder, outcome rules, ``unrewarded``
policy, advantages and length policy (:mod:`agentcompact.trajectory.export`), with the
token fields as NumPy arrays (float fields rounded to float32, as written). The options are
:class:`~agentcompact.trajectory.export.ExportOptions`; those about files (format, shards,
workers) do not apply.

Events are copied when collected, through the recorder's redaction and a JSON round trip,
so a caller changing a message afterwards changes nothing here, and a value that the
recorder could not write is refused here too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson

from .._events import CompactionEvent, EpisodeEnd, ModelCall, SummaryCall
from .._hookspecs import hookimpl
from .._redact import redact
from ..errors import ExportError, TrajectoryError
from ..rl._schema import to_float32
from ._export_index import (
    IndexedEpisode,
    Outcome,
    apply_unrewarded,
    episode_advantages,
    read_outcomes,
)
from ._export_options import ExportOptions
from ._export_policy import (
    ExportCounts,
    accept_episode,
    logprob_recomputer,
    warn_critic_free_gae,
    warn_zero_advantages,
)
from ._export_rows import EpisodeJob, count_compactions, episode_segments, finish_episode
from ._segments import Segment
from ._tokenize import ChatTokenizer

__all__ = [
    "EpisodeCollector",
    "EpisodeEvents",
    "EpisodeRows",
    "RowBatch",
    "episode_rows",
    "group_advantages",
    "rows_from_events",
]

_KINDS: dict[str, Any] = {"model_call": ModelCall, "summary_call": SummaryCall,
                          "compaction": CompactionEvent}


def _frozen(kind: str, value: Any) -> Any:
    """``value`` as the recorder writes it and the exporter reads it back: redacted, then
    through JSON (a copy sharing nothing with the caller's objects)."""
    try:  # orjson writes the dataclass itself: no deep copy (asdict) of the messages
        data = redact(orjson.loads(orjson.dumps(value)))
    except TypeError as exc:  # orjson names the type only, never the value
        raise TrajectoryError(f"cannot collect {kind} event, a value is not JSON-able: "
                              f"{exc}") from None
    return (EpisodeEnd if kind == "episode_end" else _KINDS[kind]).from_dict(data)


@dataclass(frozen=True, slots=True)
class EpisodeEvents:
    """One episode's events as the hooks reported them.

    :ivar items: ``("model_call", ModelCall)``, ``("summary_call", SummaryCall)`` and
        ``("compaction", CompactionEvent)`` pairs, in the order they were reported.
    :ivar end: the episode's ``EpisodeEnd`` (the last one reported), ``None`` while it
        runs or when it crashed before reporting one.
    """

    episode_id: str
    items: tuple[tuple[str, Any], ...]
    end: EpisodeEnd | None = None

    @property
    def calls(self) -> int:
        return sum(1 for kind, _ in self.items if kind == "model_call")

    @property
    def group_id(self) -> str:
        """The GRPO group: the end's ``group_id``, else the first call's, else the episode."""
        if self.end is not None and self.end.group_id:
            return str(self.end.group_id)
        first = next((v.group_id for k, v in self.items if k == "model_call" and v.group_id),
                     None)
        return str(first) if first else self.episode_id


@dataclass
class _Open:
    items: list[tuple[str, Any]] = field(default_factory=list)
    end: EpisodeEnd | None = None


class EpisodeCollector:
    """A plugin keeping each episode's events in memory (the ``Recorder`` without a file).

    Register it on the plugin manager the engines and integrations report to. An engine
    event without an episode id (a compaction of an engine built without one) belongs to
    the episode of the last model call, as in the exporter. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._episodes: dict[str, _Open] = {}
        self._last_call: str | None = None

    # --- hooks -----------------------------------------------------------------------
    @hookimpl
    def agentcompact_log_model_call(self, call: ModelCall) -> None:
        self._add("model_call", str(call.episode_id), call)

    @hookimpl
    def agentcompact_log_summary_call(self, call: SummaryCall) -> None:
        self._add("summary_call", call.episode_id, call)

    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        self._add("compaction", event.episode_id, event)

    @hookimpl
    def agentcompact_log_episode_end(self, episode: EpisodeEnd) -> None:
        end = _frozen("episode_end", episode)
        with self._lock:
            self._episodes.setdefault(str(episode.episode_id), _Open()).end = end

    def _add(self, kind: str, episode_id: str | None, value: Any) -> None:
        copy = _frozen(kind, value)
        with self._lock:
            eid = episode_id if episode_id is not None else self._last_call
            if eid is None:
                return  # nothing to attach it to (the exporter skips it too)
            if kind == "model_call":
                self._last_call = eid
            self._episodes.setdefault(str(eid), _Open()).items.append((kind, copy))

    # --- taking episodes -------------------------------------------------------------
    def episodes(self) -> list[EpisodeEvents]:
        """Every episode held (running ones too), in the order of its first event."""
        with self._lock:
            return [EpisodeEvents(eid, tuple(ep.items), ep.end)
                    for eid, ep in self._episodes.items()]

    def finished(self) -> list[EpisodeEvents]:
        """Remove and return the episodes that reported their end, in first-event order."""
        with self._lock:
            done = [eid for eid, ep in self._episodes.items() if ep.end is not None]
            return [self._pop(eid) for eid in done]

    def take(self, episode_id: str) -> EpisodeEvents:
        """Remove and return one episode (ended or not: a crashed one has no end)."""
        with self._lock:
            if episode_id not in self._episodes:
                raise ExportError(f"episode {episode_id!r}: no events collected")
            return self._pop(episode_id)

    def _pop(self, episode_id: str) -> EpisodeEvents:
        ep = self._episodes.pop(episode_id)
        return EpisodeEvents(episode_id, tuple(ep.items), ep.end)

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)


@dataclass(frozen=True)
class EpisodeRows:
    """One episode's segment rows before its group is known.

    ``rows`` carry zero advantages and the mask of the episode's own outcome (stop reason,
    a missing end or reward, the last token); :func:`group_advantages` gives the group's.
    ``reward`` is ``None`` when the episode reported no reward (or no end): such an episode
    never counts as reward 0 (``ExportOptions.unrewarded``).
    """

    episode_id: str
    group_id: str
    sample_index: int
    reward: float | None
    stop_reason: str
    rows: list[dict[str, Any]]
    episode: dict[str, Any]
    segments: tuple[Segment, ...] = field(repr=False)
    compactions: int = 0
    end: EpisodeEnd | None = field(default=None, repr=False)

    @property
    def rewarded(self) -> bool:
        return self.reward is not None

    def _index_entry(self) -> IndexedEpisode:
        """The exporter's index entry of this episode (its outcome rules take these)."""
        calls = sum(s.num_calls for s in self.segments)
        return IndexedEpisode(self.episode_id, calls=calls, call_group=self.group_id,
                        end=self.end.to_dict() if self.end is not None else None)


def _opts(options: ExportOptions | None) -> ExportOptions:
    opts = options or ExportOptions()
    opts.check()
    return opts


def _tokenizer(tokenizer: ChatTokenizer | str) -> ChatTokenizer:
    return tokenizer if isinstance(tokenizer, ChatTokenizer) else (
        ChatTokenizer.from_pretrained(tokenizer))


def _own_outcome(entry: IndexedEpisode) -> Outcome:
    return read_outcomes({entry.group_id: [entry]})[entry.episode_id]


def episode_rows(episode: EpisodeEvents, tokenizer: ChatTokenizer | str,
                 options: ExportOptions | None = None) -> EpisodeRows:
    """Cut one episode's events into segment rows (the exporter's builder and rules).

    :param tokenizer: the trainer's tokenizer (a ``ChatTokenizer``, or a name / folder).
    :raises ExportError: the episode has no model call.
    """
    opts, tok = _opts(options), _tokenizer(tokenizer)
    calls = episode.calls
    if not calls:
        raise ExportError(f"episode {episode.episode_id!r}: no model call to train on")
    end = episode.end
    entry = IndexedEpisode(episode.episode_id, calls=calls, call_group=episode.group_id,
                     end=end.to_dict() if end is not None else None)
    outcome = _own_outcome(entry)
    segs = episode_segments(episode.items, tok, opts, episode.episode_id, "")
    compactions = count_compactions(episode.items)
    done = finish_episode(EpisodeJob(episode.episode_id, episode.group_id, [], outcome, 0.0), segs,
                   compactions, tok, replace(opts, advantage="none"))
    return EpisodeRows(
        episode.episode_id, episode.group_id, outcome.sample_index,
        outcome.reward if outcome.rewarded else None, outcome.stop_reason,
        done.rows, done.episode, tuple(segs), compactions, end)


@dataclass
class RowBatch:
    """Rows of a batch of episodes, as the exporter writes them.

    :ivar rows: segment rows, episodes of a group contiguous, groups in first-seen order.
    :ivar episodes: the episode table (one row per written episode).
    :ivar counts: what the exporter's manifest counts (episodes, masked, unrewarded,
        overlong, breaks, ...).
    """

    rows: list[dict[str, Any]]
    episodes: list[dict[str, Any]]
    counts: dict[str, Any]


def group_advantages(episodes: Sequence[EpisodeRows], options: ExportOptions | None = None,
                     *, tokenizer: ChatTokenizer | str | None = None) -> RowBatch:
    """Group statistics over a batch of episodes and the rows to train on.

    Episodes are grouped by ``group_id`` (in the order given); the ``unrewarded`` policy,
    the advantage mode (GRPO / Dr.GRPO / RLOO over episodes, or critic-free GAE), the
    length policy and logprob recomputation apply as in the exporter.

    :param tokenizer: the tokenizer the rows were built with (needed only to rebuild rows
        whose group changed their outcome; default: the one named on the rows).
    """
    opts = _opts(options)
    if len({e.episode_id for e in episodes}) != len(episodes):
        raise ExportError("group_advantages: an episode is given twice")
    by_id = {e.episode_id: e for e in episodes}
    groups: dict[str, list[IndexedEpisode]] = {}
    for e in episodes:
        groups.setdefault(e.group_id, []).append(e._index_entry())
    outcomes = read_outcomes(groups)
    groups, unrewarded = apply_unrewarded(groups, outcomes, opts)
    advantage = episode_advantages(groups, outcomes, opts)
    counts = ExportCounts(groups=len(groups), **vars(unrewarded))
    recompute = logprob_recomputer(opts)
    tok = _rows_tokenizer(episodes, tokenizer)
    rows: list[dict[str, Any]] = []
    table: list[dict[str, Any]] = []
    for gid, entries in groups.items():
        for entry in entries:
            e = by_id[entry.episode_id]
            job = EpisodeJob(e.episode_id, gid, [], outcomes[e.episode_id],
                       advantage.get(e.episode_id))
            done = finish_episode(job, list(e.segments), e.compactions, tok, opts)
            if not accept_episode(done, opts, counts, recompute) or not done.kept:
                continue
            rows.extend(to_float32(done.rows))
            table.append(dict(done.episode,
                              episode_reward=float(np.float32(done.episode["episode_reward"]))))
    warn_zero_advantages(opts, counts)
    warn_critic_free_gae(opts.advantage)
    return RowBatch(rows, table, dict(vars(counts)))


class _RowsTokenizer:
    """What ``_rows`` reads of a tokenizer (its ``info()``), from rows already built: the
    rows of a batch are rebuilt from their segments without loading the tokenizer."""

    def __init__(self, info: Mapping[str, Any]) -> None:
        self._info = dict(info)

    def info(self) -> dict[str, Any]:
        return dict(self._info)


_INFO_KEYS = ("tokenizer_name", "tokenizer_sha256", "chat_template_sha256")


def _rows_tokenizer(episodes: Sequence[EpisodeRows],
                    tokenizer: ChatTokenizer | str | None) -> Any:
    if tokenizer is not None:
        return _tokenizer(tokenizer)
    infos = {tuple(r[k] for k in _INFO_KEYS) for e in episodes for r in e.rows}
    if len(infos) > 1:
        raise ExportError("group_advantages: the episodes' rows were built with different "
                          "tokenizers (tokenizer hashes differ)")
    info = next(iter(infos), ("", "", ""))
    return _RowsTokenizer(dict(zip(_INFO_KEYS, info)))


def rows_from_events(episodes: Iterable[EpisodeEvents], tokenizer: ChatTokenizer | str,
                     options: ExportOptions | None = None) -> RowBatch:
    """``agentcompact export`` in memory: the rows of these episodes (in the order given,
    e.g. ``collector.episodes()``); episodes without a model call are skipped and counted
    (``episodes_without_calls``)."""
    opts, tok = _opts(options), _tokenizer(tokenizer)
    built: list[EpisodeRows] = []
    skipped = 0
    for episode in episodes:
        if not episode.calls:
            skipped += 1
            continue
        built.append(episode_rows(episode, tok, opts))
    batch = group_advantages(built, opts, tokenizer=tok)
    batch.counts["episodes_without_calls"] = skipped
    return batch
