"""Export recorded runs as segment rows for GPU RL training (``agentcompact-traj/1``).

Two passes over the event logs keep memory bounded by one episode (plus one Parquet row
group and a small per-episode index):

1. *index*: every line is read once; per episode, the byte spans of its events, its group,
   its ``episode_end`` (reward, stop reason, trial). Group statistics for GRPO / Dr.GRPO /
   RLOO are computed here, over episodes (``agentcompact.rl._advantages``).
2. *stream*: group by group, episode by episode, the episode's events are read back by
   offset, cut into segments (``segments.build_segments``), turned into rows, given
   advantages and written. Segments of an episode and episodes of a group are contiguous,
   and a shard is only cut at a group boundary, so every shard can be read on its own.

With ``ExportOptions(workers=N)`` the episodes of pass 2 are read, segmented and turned
into rows by N worker processes, a few episodes per worker sent ahead of the one being
written, and written by this process in the same order: the output does not depend on N.

Output folder: ``segments-NNNNN.parquet`` (or ``.jsonl``), ``episodes.parquet`` (or
``.jsonl``) and ``manifest.json``; ``validate_export(folder)`` re-reads and checks it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import warnings
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from .._events import CompactionEvent, ModelCall, SummaryCall
from ..errors import ConfigError, ExportError, TrajectoryError
from ..rl._advantages import (
    broadcast_to_segments,
    drgrpo_advantages,
    grpo_advantages,
    rloo_advantages,
)
from ..rl._card import dataset_card
from ..rl._gae import assign_gae
from ..rl._schema import EPISODE_SCHEMA, SCHEMA_VERSION, STOP_REASONS, rows_to_table, to_float32
from ._events_log import EventReader, read_event_at
from ._segments import Segment, build_segments
from ._tokenize import ChatTokenizer

__all__ = [
    "ADVANTAGES",
    "DEFAULT_MASKED_STOP_REASONS",
    "UNREWARDED",
    "MAX_AUTO_WORKERS",
    "ExportOptions",
    "available_cpus",
    "default_start_method",
    "export_runs",
    "iter_export_rows",
    "read_export",
    "validate_export",
]

logger = logging.getLogger(__name__)

ADVANTAGES = ("grpo", "drgrpo", "rloo", "gae-chain", "gae-truncated", "none")
#: what to do with an episode without a reward (a crashed rollout, a grader that failed):
#: never count it as reward 0 in its group's statistics (that drags its group). ``mask-group``
#: (default, as SkyRL): every episode of its group is written with ``mask_episode`` (zero
#: loss); ``drop-episode``: it is not written and its group's statistics are computed over
#: the rewarded episodes. Counted in the manifest and warned about either way.
UNREWARDED = ("mask-group", "drop-episode")
DEFAULT_MASKED_STOP_REASONS = frozenset({"context_length", "error", "timeout"})
_ROW_GROUP_TOKENS = 1 << 20  # flush a Parquet row group at about this many tokens


@dataclass
class ExportOptions:
    """How to export. ``advantage``: one of ``ADVANTAGES``; the GAE modes use V = 0 (no
    critic) with ``gamma``/``lam`` and are not whitened (the trainer whitens per batch).
    ``summary_trained`` overrides ``SummaryCall.trained``. Episodes whose stop reason is in
    ``mask_stop_reasons`` get ``mask_episode`` (zero loss).

    ``workers``: processes that read, segment and tokenize episodes (the output is the same
    for any value); ``None``: the available CPUs, at most ``MAX_AUTO_WORKERS``, and fewer
    for a small export (one per 8 episodes when forking, per 64 otherwise); ``1``: all in
    this process. ``start_method``: the ``multiprocessing`` start method of the workers;
    ``None``: ``default_start_method()`` (``fork`` on Linux)."""

    fmt: str = "parquet"
    advantage: str = "grpo"
    rows_per_shard: int = 10_000
    summary_trained: bool | None = None
    mask_stop_reasons: frozenset[str] = DEFAULT_MASKED_STOP_REASONS
    gamma: float = 1.0
    lam: float = 1.0
    eps: float = 1e-6
    keep_messages: bool = False
    keep_prompts: bool = True
    verify_tokens: bool = False
    progress: bool = False
    validate: bool = True
    workers: int | None = None
    start_method: str | None = None
    #: a Hugging Face causal LM (name or path) whose log-probabilities fill
    #: ``rollout_logprobs`` of every sampled token (``agentcompact.rl.recompute``)
    recompute_logprobs: str | None = None
    recompute_device: str = "cpu"
    recompute_batch_tokens: int = 16384
    #: longest row (prompt + response tokens) written as trainable; ``None``: no limit
    max_tokens: int | None = None
    #: an episode with a longer row: ``mask`` (kept, ``mask_episode``: zero loss) or
    #: ``drop`` (not written); counted in the manifest either way, never truncated
    overlong: str = "mask"
    #: an episode without a reward: one of ``UNREWARDED`` (never a silent reward 0)
    unrewarded: str = "mask-group"

    def check(self) -> None:
        if self.fmt not in ("parquet", "jsonl"):
            raise ConfigError(f"format {self.fmt!r}: choose parquet or jsonl")
        if self.advantage not in ADVANTAGES:
            raise ConfigError(f"advantage {self.advantage!r}: choose one of {ADVANTAGES}")
        if self.rows_per_shard < 1:
            raise ConfigError(f"rows_per_shard must be >= 1, got {self.rows_per_shard}")
        unknown = set(self.mask_stop_reasons) - STOP_REASONS
        if unknown:
            raise ConfigError(f"mask_stop_reasons: unknown stop reasons {sorted(unknown)}")
        if self.overlong not in ("mask", "drop"):
            raise ConfigError(f"overlong {self.overlong!r}: choose mask or drop")
        if self.unrewarded not in UNREWARDED:
            raise ConfigError(f"unrewarded {self.unrewarded!r}: choose one of {UNREWARDED}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.recompute_batch_tokens < 1:
            raise ConfigError(f"recompute_batch_tokens must be >= 1, got "
                              f"{self.recompute_batch_tokens}")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers must be >= 1 (or None: automatic), got {self.workers}")
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ConfigError(f"start_method {self.start_method!r}: choose one of {methods}")


# ----------------------------------------------------------------- pass 1: the index


@dataclass
class _Episode:
    episode_id: str
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)  # log, off, len, line
    calls: int = 0
    call_group: str | None = None
    end: dict[str, Any] | None = None

    @property
    def group_id(self) -> str:
        group = (self.end or {}).get("group_id") or self.call_group
        return str(group) if group is not None else self.episode_id


@dataclass
class _Index:
    logs: list[Path]
    episodes: dict[str, _Episode] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)

    def groups(self) -> dict[str, list[_Episode]]:
        out: dict[str, list[_Episode]] = {}
        for ep in self.episodes.values():
            if ep.calls:
                out.setdefault(ep.group_id, []).append(ep)
        return out


def _index(paths: Sequence[str | os.PathLike[str]]) -> _Index:
    readers = [EventReader(p) for p in paths]
    index = _Index([r.path for r in readers])
    for log, reader in enumerate(readers):
        last_call: str | None = None
        for ev in reader:
            if ev.kind == "run_start":
                index.runs.append({"log": str(reader.path), **ev.data})
                continue
            eid = ev.data.get("episode_id")
            if eid is None and ev.kind in ("compaction", "summary_call"):
                eid = last_call  # engine events without an episode follow their call
            if eid is None:
                continue
            ep = index.episodes.setdefault(str(eid), _Episode(str(eid)))
            ep.spans.append((log, ev.offset, ev.length, ev.line))
            if ev.kind == "model_call":
                last_call = str(eid)
                ep.calls += 1
                ep.call_group = ep.call_group or ev.data.get("group_id")
            elif ev.kind == "episode_end":
                ep.end = ev.data
        for torn in [*reader.torn_lines, *([reader.torn_tail] if reader.torn_tail else [])]:
            index.torn.append(torn.describe(reader.path))
    return index


@dataclass(frozen=True)
class _Outcome:
    reward: float
    stop_reason: str
    sample_index: int
    incomplete: bool
    #: the episode_end carried a numeric reward
    rewarded: bool = True
    #: masked because an episode of its group has no reward (``unrewarded=mask-group``)
    group_masked: bool = False


def _outcomes(groups: Mapping[str, list[_Episode]]) -> dict[str, _Outcome]:
    out: dict[str, _Outcome] = {}
    for episodes in groups.values():
        trials = [int((ep.end or {}).get("sample_index", 0)) for ep in episodes]
        renumber = len(set(trials)) != len(trials)  # trials must identify episodes
        for pos, (ep, trial) in enumerate(zip(episodes, trials, strict=True)):
            end = ep.end or {}
            reward = end.get("reward")
            stop = str(end.get("stop_reason", "error"))
            if stop not in STOP_REASONS or stop in ("compacted", "prefix_break"):
                logger.warning("episode %s: stop_reason %r read as 'error'", ep.episode_id, stop)
                stop = "error"
            out[ep.episode_id] = _Outcome(
                reward=float(reward) if isinstance(reward, (int, float)) else 0.0,
                stop_reason=stop if ep.end is not None else "error",
                sample_index=pos if renumber else trial,
                incomplete=ep.end is None or not isinstance(reward, (int, float)),
                rewarded=isinstance(reward, (int, float)) and not isinstance(reward, bool),
            )
    return out


@dataclass
class _Unrewarded:
    """What the ``unrewarded`` policy did (manifest counts)."""

    episodes_unrewarded: int = 0
    groups_unrewarded_masked: int = 0
    episodes_unrewarded_dropped: int = 0


def _unrewarded_policy(
    groups: Mapping[str, list[_Episode]], outcomes: dict[str, _Outcome], opts: ExportOptions
) -> tuple[dict[str, list[_Episode]], _Unrewarded]:
    """Apply ``opts.unrewarded`` to the groups holding an episode without a reward: the
    groups to write (``drop-episode``: those episodes left out) and what was done;
    ``mask-group`` marks every outcome of such a group (``outcomes`` is updated)."""
    done = _Unrewarded()
    kept: dict[str, list[_Episode]] = {}
    for gid, episodes in groups.items():
        missing = [ep for ep in episodes if not outcomes[ep.episode_id].rewarded]
        done.episodes_unrewarded += len(missing)
        if missing and opts.unrewarded == "drop-episode":
            done.episodes_unrewarded_dropped += len(missing)
            episodes = [ep for ep in episodes if outcomes[ep.episode_id].rewarded]
        elif missing:
            done.groups_unrewarded_masked += 1
            for ep in episodes:
                outcomes[ep.episode_id] = replace(outcomes[ep.episode_id], group_masked=True)
        if episodes:
            kept[gid] = episodes
    if done.episodes_unrewarded:
        logger.warning(
            "%d episode(s) without a reward: %s (unrewarded=%s), never counted as reward 0",
            done.episodes_unrewarded,
            f"{done.episodes_unrewarded_dropped} dropped" if opts.unrewarded == "drop-episode"
            else f"their {done.groups_unrewarded_masked} group(s) masked", opts.unrewarded)
    return kept, done


def _episode_advantages(
    groups: Mapping[str, list[_Episode]], outcomes: Mapping[str, _Outcome], opts: ExportOptions
) -> dict[str, float]:
    """Outcome advantages over the rewarded episodes of each group; an episode without a
    reward (only in a masked group) gets 0."""
    table = [{"group_id": gid, "episode_id": ep.episode_id,
              "episode_reward": float(np.float32(outcomes[ep.episode_id].reward))}
             for gid, eps in groups.items() for ep in eps if outcomes[ep.episode_id].rewarded]
    if opts.advantage == "grpo":
        adv = grpo_advantages(table, eps=opts.eps)
    elif opts.advantage == "drgrpo":
        adv = drgrpo_advantages(table)
    elif opts.advantage == "rloo":
        adv = rloo_advantages(table)
    else:
        return {}
    return {ep.episode_id: adv.get(ep.episode_id, 0.0) for eps in groups.values() for ep in eps}


# ----------------------------------------------------------------- pass 2: rows


_DECODERS = {"model_call": ModelCall, "compaction": CompactionEvent, "summary_call": SummaryCall}


def _episode_items(
    ctx: _Context, spans: Sequence[tuple[int, int, int, int]]
) -> Iterator[tuple[str, Any]]:
    for log, offset, length, line in spans:
        ev = read_event_at(ctx.file(log), ctx.logs[log], offset, length, line)
        decoder = _DECODERS.get(ev.kind)
        if decoder is None:
            continue
        try:
            value = decoder.from_dict(ev.data)  # type: ignore[attr-defined]
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            # the exception text may quote values: only its type and the place are named
            raise TrajectoryError(f"{ctx.logs[log]}:{line}: malformed {ev.kind} event "
                                  f"({type(exc).__name__}: its fields do not fit "
                                  f"{decoder.__name__})") from None
        if ev.kind == "model_call":
            _check_call(value, ctx.logs[log], line)
        yield ev.kind, value


def _check_call(call: ModelCall, path: Path, line: int) -> None:
    """The field types the segment builder relies on, checked up front (a wrong one would
    fail deep inside a dialect with a traceback)."""
    where = f"{path}:{line}: malformed model_call event"
    for name in ("messages", "response"):
        if not isinstance(getattr(call, name), list):
            raise TrajectoryError(f"{where}: {name} is {type(getattr(call, name)).__name__}, "
                                  "not a list")
    if not isinstance(call.request, dict) or not isinstance(call.dialect, str):
        raise TrajectoryError(f"{where}: request must be an object and dialect a string")
    for name in ("prompt_token_ids", "response_token_ids", "response_logprobs",
                 "response_token_bytes"):
        value = getattr(call, name)
        if value is not None and not isinstance(value, list):
            raise TrajectoryError(f"{where}: {name} is {type(value).__name__}, not a list")


@dataclass(frozen=True)
class _Job:
    """What one episode's work needs besides the logs, tokenizer and options: small, so it
    is cheap to send to a worker process."""

    episode_id: str
    group_id: str
    spans: list[tuple[int, int, int, int]]  # (log, offset, length, line) of its events
    outcome: _Outcome
    advantage: float | None  # the episode's advantage (grpo / drgrpo / rloo), else None


@dataclass
class _Done:
    """One episode's rows (token fields as NumPy arrays), its episode-table row, what the
    manifest counts of it, and the log records a worker process emitted for it."""

    rows: list[dict[str, Any]]
    episode: dict[str, Any]
    calls: int
    compactions: int
    breaks: list[str]
    incomplete: bool
    records: list[logging.LogRecord] = field(default_factory=list)
    #: counted where it was made (``_accept``): its counts, and whether it is written —
    #: a runner whose workers write the shards sends these, not the rows (``ray_export``)
    counted: _Counts | None = None
    kept: bool = True


class _Context:
    """The logs (opened by this process, on first use), tokenizer and options an episode
    is exported with: one in the exporting process, or one per worker process."""

    def __init__(self, logs: Sequence[Path], tok: ChatTokenizer, opts: ExportOptions) -> None:
        self.logs, self.tok, self.opts = list(logs), tok, opts
        self._files: dict[int, BinaryIO] = {}

    def file(self, log: int) -> BinaryIO:
        f = self._files.get(log)
        if f is None:
            f = self._files[log] = open(self.logs[log], "rb")  # noqa: SIM115 - see close()
        return f

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def _export_episode(ctx: _Context, job: _Job) -> _Done:
    """Read one episode's events back, cut them into segments and build its rows."""
    items = list(_episode_items(ctx, job.spans))
    first, last = job.spans[0], job.spans[-1]
    segs = _segments(items, ctx.tok, ctx.opts, job.episode_id,
                     f"{ctx.logs[first[0]]}:{first[3]}-{last[3]}: ")
    return _finish(job, segs, _count_compactions(items), ctx.tok, ctx.opts)


def _segments(items: Sequence[tuple[str, Any]], tok: ChatTokenizer, opts: ExportOptions,
              episode_id: str, where: str) -> list[Segment]:
    """The episode's segments; a malformed event is a ``TrajectoryError`` naming ``where``
    (its place in the log) and the episode, never a value."""
    try:
        return build_segments(items, tok, summary_trained=opts.summary_trained,
                              verify=opts.verify_tokens, keep_messages=opts.keep_messages,
                              keep_prompts=opts.keep_prompts)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise TrajectoryError(
            f"{where}episode {episode_id!r}: a malformed event ({type(exc).__name__} while "
            "building its segments)") from None


def _count_compactions(items: Sequence[tuple[str, Any]]) -> int:
    return sum(1 for kind, _ in items if kind == "compaction")


def _finish(job: _Job, segs: list[Segment], compactions: int, tok: ChatTokenizer,
            opts: ExportOptions) -> _Done:
    """One episode's rows, advantages and episode-table row from its segments."""
    adv = {} if job.advantage is None else {job.episode_id: job.advantage}
    rows = _with_advantages(_rows(job, segs, tok, opts), adv, opts)
    return _Done(rows, _episode_row(rows, segs, compactions),
                 calls=sum(s.num_calls for s in segs), compactions=compactions,
                 breaks=[s.break_reason for s in segs if s.break_reason],
                 incomplete=job.outcome.incomplete)


def _rows(
    job: _Job, segs: list[Segment], tok: ChatTokenizer, opts: ExportOptions
) -> list[dict[str, Any]]:
    outcome = job.outcome
    k = len(segs)
    loss_tokens = sum(sum(s.response_mask) for s in segs)
    masked = (outcome.stop_reason in opts.mask_stop_reasons or outcome.incomplete
              or outcome.group_masked)
    last_mask = segs[-1].response_mask
    masked = masked or not last_mask or last_mask[-1] != 1  # reward needs a sampled EOS
    rows = []
    for i, s in enumerate(segs):
        last = i == k - 1
        n = len(s.response_ids)
        rows.append({
            "schema_version": SCHEMA_VERSION, "group_id": job.group_id,
            "episode_id": job.episode_id, "sample_index": outcome.sample_index,
            "segment_index": i, "num_segments": k, "is_last_segment": last,
            # token-level fields as NumPy arrays of the Arrow types (written in one piece)
            "prompt_ids": np.array(s.prompt_ids, dtype=np.int32),
            "response_ids": np.array(s.response_ids, dtype=np.int32),
            "response_mask": np.array(s.response_mask, dtype=np.int8),
            "rollout_logprobs": np.array(s.rollout_logprobs, dtype=np.float32),
            "summary_span": s.summary_span, "summary_trained": s.summary_trained,
            "compaction_trigger": "none" if last or s.break_reason not in (
                "compaction", "summary") else s.compaction_trigger,
            "episode_reward": outcome.reward, "segment_reward": 0.0,
            "stop_reason": outcome.stop_reason if last else (
                "compacted" if s.break_reason in ("compaction", "summary") else "prefix_break"),
            "segment_break": None if last else s.break_reason,
            "mask_episode": masked, "loss_weight": 1.0,
            "episode_num_loss_tokens": loss_tokens, "episode_num_segments": k,
            "policy_version": s.policy_version, **tok.info(), "sampling": s.sampling,
            "messages_json": s.messages_json, "prompt_json": s.prompt_json,
            "tools_json": s.tools_json, "advantages": np.zeros(n, dtype=np.float32),
            "returns": None,
        })
    return rows


def _with_advantages(
    rows: list[dict[str, Any]], episode_adv: Mapping[str, float], opts: ExportOptions
) -> list[dict[str, Any]]:
    if opts.advantage in ("grpo", "drgrpo", "rloo"):
        return broadcast_to_segments(rows, episode_adv, arrays=True)
    if opts.advantage.startswith("gae"):
        zeros = [np.zeros(len(r["response_ids"])) for r in rows]  # V = 0: no critic
        return assign_gae(rows, zeros, gamma=opts.gamma, lam=opts.lam,
                          truncated=opts.advantage == "gae-truncated", whiten=False)
    return rows


def _episode_row(rows: Sequence[Mapping[str, Any]], segs: Sequence[Segment],
                 compactions: int) -> dict[str, Any]:
    first = rows[0]
    return {
        "schema_version": SCHEMA_VERSION, "group_id": first["group_id"],
        "episode_id": first["episode_id"], "sample_index": first["sample_index"],
        "episode_reward": first["episode_reward"], "stop_reason": rows[-1]["stop_reason"],
        "mask_episode": first["mask_episode"], "num_segments": len(rows),
        "num_compactions": compactions, "num_loss_tokens": first["episode_num_loss_tokens"],
        "num_response_tokens": sum(len(s.response_ids) for s in segs),
        "max_working_context": max(s.working_context for s in segs),
        "policy_version": max(s.policy_version for s in segs),
    }


# ----------------------------------------------------------------- worker processes

#: ``ExportOptions(workers=None)``: the CPUs this process may run on, at most this many,
MAX_AUTO_WORKERS = 8
#: and at most one worker per this many episodes (a small export stays in-process): a
#: forked worker starts in milliseconds, a spawned one imports transformers and unpickles
#: the tokenizer first (1-2 s of CPU each)
_EPISODES_PER_WORKER = {"fork": 8, "forkserver": 64, "spawn": 64}
#: episodes sent ahead per worker (results are written in order: this bounds what waits)
_AHEAD = 2

_worker: _Context | None = None  # a worker process's context (set by _init_worker)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _workers(opts: ExportOptions, episodes: int, start_method: str) -> int:
    if opts.workers is not None:
        return min(opts.workers, max(1, episodes))
    per = _EPISODES_PER_WORKER.get(start_method, 64)
    return max(1, min(available_cpus(), MAX_AUTO_WORKERS, episodes // per))


class _Capture(logging.Handler):
    """A worker's log records, kept to be handled by the exporting process in episode
    order (so they reach its handlers, ``caplog`` included, as in-process)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None  # args may not pickle
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        self.records.append(record)


def _init_worker(logs: list[Path], tok: ChatTokenizer, opts: ExportOptions,
                 levels: dict[str, int], disable: int) -> None:
    """Per worker process, once: its context, and its logging routed to ``_Capture``."""
    global _worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the exporting process stops us
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_Capture())
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)
    logging.disable(disable)
    _worker = _Context(logs, tok, opts)


def _run_job(job: _Job) -> _Done:
    """In a worker process: ``_export_episode`` with its log records attached."""
    assert _worker is not None, "worker not initialized"
    capture = next(h for h in logging.getLogger().handlers if isinstance(h, _Capture))
    try:
        done = _export_episode(_worker, job)
    except Exception as exc:
        raise _portable(exc) from None
    finally:
        records, capture.records = capture.records, []
    done.records = records
    return done


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling (the exporting process re-raises it as it is), else
    a ``TrajectoryError`` with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return TrajectoryError(f"{type(exc).__name__}: {exc}")
    return exc


def _log_levels() -> dict[str, int]:
    """Effective levels of the root logger and of agentcompact's, for the workers."""
    names = [n for n, lg in logging.root.manager.loggerDict.items()
             if n.startswith("agentcompact") and isinstance(lg, logging.Logger)]
    return {name: logging.getLogger(name or None).getEffectiveLevel()
            for name in ["", "agentcompact", *names]}


class _Episodes:
    """Episodes exported in order: in this process (``workers == 1``), or by a pool of
    worker processes with at most ``_AHEAD`` episodes per worker sent ahead of the one
    being written (memory stays bounded), results taken in submission order.

    On any exception, KeyboardInterrupt included, pending episodes are cancelled and the
    workers terminated before it propagates.
    """

    def __init__(self, ctx: _Context, workers: int, start_method: str) -> None:
        self.ctx, self.workers, self.start_method = ctx, workers, start_method
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Episodes:
        if self.workers > 1:
            ctx = self.ctx
            mp = multiprocessing.get_context(self.start_method)
            if self.start_method == "fork":
                _load_plugins()
            with _fork_guard(self.start_method):
                self._pool = ProcessPoolExecutor(
                    self.workers, mp_context=mp, initializer=_init_worker,
                    initargs=(ctx.logs, ctx.tok, ctx.opts, _log_levels(),
                              logging.root.manager.disable))
                self._pool.submit(int)  # fork: all processes start on the first submit
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.ctx.close()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kind is None:
            pool.shutdown(wait=True)
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # a long episode need not finish: stop now
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(5)

    def run(self, jobs: Iterator[_Job]) -> Iterator[_Done]:
        if self._pool is None:
            for job in jobs:
                yield _export_episode(self.ctx, job)
            return
        ahead: deque[Future[_Done]] = deque()
        for job in jobs:
            ahead.append(self._pool.submit(_run_job, job))
            if len(ahead) > _AHEAD * self.workers:
                yield self._take(ahead.popleft())
        while ahead:
            yield self._take(ahead.popleft())

    @staticmethod
    def _take(future: Future[_Done]) -> _Done:
        try:
            done = future.result()
        except BrokenProcessPool as exc:
            raise TrajectoryError(f"export worker process died: {exc}") from exc
        for record in done.records:
            log = logging.getLogger(record.name)
            if log.isEnabledFor(record.levelno):
                log.handle(record)
        return done


def _load_plugins() -> None:
    """Load the installed plugins (the dialects episodes are read with) in the exporting
    process before it forks: otherwise every worker loads them on its first episode
    (entry points scanned, plugin modules imported), about 0.1 s of CPU per worker."""
    from .._pluginmanager import registry  # imported late, as segments.get_dialect does

    registry().dialect_names()


def default_start_method() -> str:
    """``fork`` on Linux (workers start in milliseconds, sharing the loaded tokenizer),
    else ``spawn``."""
    methods = multiprocessing.get_all_start_methods()
    return "fork" if sys.platform == "linux" and "fork" in methods else "spawn"


@contextlib.contextmanager
def _fork_guard(start_method: str) -> Iterator[None]:
    """Around forking the workers: ``TOKENIZERS_PARALLELISM=false`` in their environment
    (the tokenizers library's thread pool does not survive a fork; with the variable unset
    it would print a warning in each child and turn parallelism off itself, with it set to
    true a child would wait on threads that do not exist), and Python 3.12's warning about
    forking a process that has threads (those threads are the tokenizer's, which the
    workers never use) silenced."""
    if start_method != "fork":
        yield
        return
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            yield
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


# ----------------------------------------------------------------- writers


def _lists(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with its arrays as lists (JSON floats as Python writes the float32 values)."""
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in row.items()}


class _Writer:
    """Segment shards (cut at group boundaries) and the episode table.

    :param episodes: write the episode table (``False``: segment shards only).
    :param first_shard: the number of the first shard written (a worker writing one shard
        of an export, ``ray_export``).
    """

    def __init__(self, out: Path, opts: ExportOptions, *, episodes: bool = True,
                 first_shard: int = 0) -> None:
        self.out, self.opts = out, opts
        self.with_episodes, self.first_shard = episodes, first_shard
        self.files: list[dict[str, Any]] = []
        self._shard: Any = None
        self._buffer: list[dict[str, Any]] = []
        self._tokens = 0
        self._episodes: list[dict[str, Any]] = []
        self._ep_writer: Any = None
        self.episode_rows = 0
        ext = "parquet" if opts.fmt == "parquet" else "jsonl"
        self.episodes_path = out / f"episodes.{ext}"
        if opts.fmt == "jsonl" and episodes:
            self._ep_writer = open(self.episodes_path, "wb")  # noqa: SIM115 - closed in close()

    def shard_name(self, number: int) -> str:
        return f"segments-{number:05d}.{self.opts.fmt}"

    def _open_shard(self) -> None:
        name = self.shard_name(self.first_shard + len(self.files))
        self.files.append({"path": name, "rows": 0})
        path = self.out / name
        if self.opts.fmt == "parquet":
            from ..rl._schema import SEGMENT_SCHEMA

            self._shard = pq.ParquetWriter(str(path), SEGMENT_SCHEMA)
        else:
            self._shard = open(path, "wb")  # noqa: SIM115 - closed in _close_shard()

    def add(self, rows: list[dict[str, Any]], episode: dict[str, Any]) -> None:
        if self._shard is None:
            self._open_shard()
        rows = to_float32(rows)
        self.files[-1]["rows"] += len(rows)
        if self.opts.fmt == "jsonl":
            self._shard.write(b"".join(orjson.dumps(_lists(r)) + b"\n" for r in rows))
        else:
            self._buffer.extend(rows)
            self._tokens += sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
            if self._tokens >= _ROW_GROUP_TOKENS or len(self._buffer) >= self.opts.rows_per_shard:
                self._flush()
        self._add_episode(episode)

    def _add_episode(self, episode: dict[str, Any]) -> None:
        if not self.with_episodes:
            return
        self.episode_rows += 1
        episode = dict(episode, episode_reward=float(np.float32(episode["episode_reward"])))
        if self.opts.fmt == "jsonl":
            self._ep_writer.write(orjson.dumps(episode) + b"\n")
            return
        self._episodes.append(episode)
        if len(self._episodes) >= 4096:
            self._flush_episodes()

    def _flush_episodes(self) -> None:
        if not self._episodes:
            return
        table = pa.Table.from_pylist(self._episodes, schema=EPISODE_SCHEMA)
        if self._ep_writer is None:
            self._ep_writer = pq.ParquetWriter(str(self.episodes_path), EPISODE_SCHEMA)
        self._ep_writer.write_table(table)
        self._episodes = []

    def _flush(self) -> None:
        if self._buffer:
            self._shard.write_table(rows_to_table(self._buffer))
        self._buffer, self._tokens = [], 0

    def end_group(self) -> None:
        if self._shard is not None and self.files[-1]["rows"] >= self.opts.rows_per_shard:
            self._close_shard()

    def _close_shard(self) -> None:
        if self.opts.fmt == "parquet":
            self._flush()
        self._shard.close()
        self._shard = None

    def close(self) -> None:
        if self._shard is not None:
            self._close_shard()
        if not self.with_episodes:
            return
        if self.opts.fmt == "parquet":
            self._flush_episodes()
            if self._ep_writer is None:  # no episodes: still write an empty table
                pq.write_table(EPISODE_SCHEMA.empty_table(), str(self.episodes_path))
        if self._ep_writer is not None:
            self._ep_writer.close()


# ----------------------------------------------------------------- the export


@dataclass
class _Counts:
    groups: int = 0
    episodes: int = 0
    segments: int = 0
    episodes_masked: int = 0
    episodes_incomplete: int = 0
    episodes_without_calls: int = 0
    model_calls: int = 0
    compactions: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    loss_tokens: int = 0
    #: mask-1 tokens of unmasked episodes with a non-zero reward whose advantage is 0
    #: (gae-* modes; under grpo a group whose episodes all got the same reward has A = 0)
    zero_advantage_loss_tokens: int = 0
    #: episodes with a row over ``max_tokens``: masked, or dropped (not written)
    episodes_overlong_masked: int = 0
    episodes_overlong_dropped: int = 0
    #: episodes without a reward, and what ``unrewarded`` did with them
    episodes_unrewarded: int = 0
    groups_unrewarded_masked: int = 0
    episodes_unrewarded_dropped: int = 0
    breaks: dict[str, int] = field(default_factory=dict)

    def add(self, done: _Done) -> None:
        rows = done.rows
        self.episodes += 1
        self.segments += len(rows)
        self.episodes_masked += int(rows[0]["mask_episode"])
        self.episodes_incomplete += int(done.incomplete)
        self.model_calls += done.calls
        self.compactions += done.compactions
        for r in rows:
            self.prompt_tokens += len(r["prompt_ids"])
            self.response_tokens += len(r["response_ids"])
            self.loss_tokens += int(np.count_nonzero(r["response_mask"]))
            if not r["mask_episode"] and r["episode_reward"] != 0:
                mask = np.asarray(r["response_mask"]) == 1
                self.zero_advantage_loss_tokens += int(
                    np.count_nonzero(np.asarray(r["advantages"])[mask] == 0))
        for reason in done.breaks:
            self.breaks[reason] = self.breaks.get(reason, 0) + 1

    def merge(self, other: _Counts) -> None:
        """Add the counts of ``other`` (one episode's, counted by a worker): in episode
        order, the same counts as ``add`` in this process (``breaks`` in the same order)."""
        for name, value in vars(other).items():
            if name == "breaks":
                for reason, n in value.items():
                    self.breaks[reason] = self.breaks.get(reason, 0) + n
            else:
                setattr(self, name, getattr(self, name) + value)


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("export"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[segments]} segments"), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=not enabled, transient=True)


def export_runs(
    runs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: ChatTokenizer | str | os.PathLike[str],
    options: ExportOptions | None = None,
    *,
    keep_events: str | os.PathLike[str] | None = None,
    runner: Any = None,
) -> dict[str, Any]:
    """Export runs to ``out_dir``: what ``agentcompact export`` accepts.

    :param runs: recorded runs (folders holding ``events.jsonl``, or such files) and
        trajectory files / folders the loaders read (Claude Code, SWE-agent,
        mini-swe-agent, tau-bench, message lists), converted to events first
        (``agentcompact.trajectory._importers``); an episode may not span two logs.
    :param out_dir: created if missing; existing segment files in it are an error.
    :param tokenizer: the trainer's tokenizer (name, path, or a ``ChatTokenizer``).
    :param keep_events: a folder to keep the events converted from trajectory files in
        (default: a temporary folder, removed afterwards).
    :param runner: what exports the episodes, ``(context, workers, start_method)`` → a
        context manager with ``run(jobs)`` yielding their results in order (default: this
        process or its worker processes; ``ray_export`` passes a Ray Data one).
    :returns: the manifest (also written to ``out_dir/manifest.json``).
    """
    from ._importers import is_event_log

    logs = [r for r in runs if is_event_log(r)]
    files = [r for r in runs if not is_event_log(r)]
    with _private_files():
        if not files:
            return _export_logs(logs, out_dir, tokenizer, options, runner)
        return _import_and_export(logs, files, out_dir, tokenizer, options, keep_events,
                                  runner)


def _import_and_export(
    logs: list[str | os.PathLike[str]],
    files: list[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: ChatTokenizer | str | os.PathLike[str],
    options: ExportOptions | None,
    keep_events: str | os.PathLike[str] | None,
    runner: Any,
) -> dict[str, Any]:
    from ._importers import import_trajectories

    with tempfile.TemporaryDirectory(prefix="agentcompact-import-") as tmp:
        folder = Path(keep_events) if keep_events is not None else Path(tmp)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        events = folder / "events.jsonl"
        count = import_trajectories(files, events)
        logger.info("converted %d trajectories to %s", count, events)
        return _export_logs([*logs, events], out_dir, tokenizer, options, runner)


@contextlib.contextmanager
def _private_files() -> Iterator[None]:
    """Files the export writes are ``0600`` and folders ``0700`` (umask 077 meanwhile)."""
    saved = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(saved)


def _export_logs(
    runs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: ChatTokenizer | str | os.PathLike[str],
    options: ExportOptions | None = None,
    runner: Any = None,
) -> dict[str, Any]:
    opts = options or ExportOptions()
    opts.check()
    tok = tokenizer if isinstance(tokenizer, ChatTokenizer) else (
        ChatTokenizer.from_pretrained(tokenizer))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("segments-*")) or (out / "manifest.json").exists():
        raise ConfigError(f"{out}: already holds an export; choose an empty folder")
    index = _index(runs)
    outcomes = _outcomes(index.groups())
    groups, unrewarded = _unrewarded_policy(index.groups(), outcomes, opts)
    episode_adv = _episode_advantages(groups, outcomes, opts)
    counts = _Counts(groups=len(groups), episodes_without_calls=sum(
        1 for ep in index.episodes.values() if not ep.calls), **vars(unrewarded))
    total = sum(len(eps) for eps in groups.values())
    start_method = opts.start_method or default_start_method()
    recompute = _recomputer(opts)
    episodes = (runner or _Episodes)(_Context(index.logs, tok, opts),
                                     _workers(opts, total, start_method), start_method)
    with episodes:  # worker processes (if any) start before the writer opens files
        writer = getattr(episodes, "writer", _Writer)(out, opts)  # Ray: workers write
        try:
            with _progress(opts.progress) as bar:
                task = bar.add_task("export", total=total, segments=0)
                sizes = [len(eps) for eps in groups.values()]
                jobs = (_Job(ep.episode_id, ep.group_id, ep.spans, outcomes[ep.episode_id],
                             episode_adv.get(ep.episode_id))
                        for eps in groups.values() for ep in eps)
                results = episodes.run(jobs)
                for size in sizes:
                    for _ in range(size):
                        done = next(results)
                        if done.counted is not None:  # counted by the worker
                            counts.merge(done.counted)
                        elif not _accept(done, opts, counts, recompute):
                            continue
                        if not done.kept:
                            continue
                        writer.add(done.rows, done.episode)
                        bar.update(task, advance=1, segments=counts.segments)
                    writer.end_group()
        finally:
            writer.close()
    manifest = _manifest(index, tok, opts, counts, writer)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out / "README.md").write_text(dataset_card(manifest))
    _warn_zero_advantages(opts, counts)
    _warn_critic_free_gae(opts.advantage)
    if opts.validate:
        validate_export(out)
    return manifest


def _warn_critic_free_gae(advantage: str) -> None:
    """Say plainly what a ``gae-*`` export is (docs/rl-math.md, "Which trainer takes chain
    GAE"): values 0, and chain GAE across segments reproduced by no trainer's own code."""
    if not advantage.startswith("gae"):
        return
    logger.warning(
        "advantage %s: computed with V = 0 (the log has no critic), so it is the return, not "
        "a critic's GAE; chain GAE across segments is only in agentcompact's loss: verl "
        "recomputes GAE per row (each segment a separate sequence) unless the stored "
        "advantages are used as they are, SkyRL refuses GAE with step_wise_trajectories, "
        "TRL has no critic; use grpo for those trainers, or agentcompact.rl.assign_gae with "
        "your critic's values", advantage)


def _warn_zero_advantages(opts: ExportOptions, counts: _Counts) -> None:
    """Say so when the advantage mode leaves trained tokens of rewarded episodes at 0
    (``gae-truncated`` without a critic does it to every segment but the last; ``gae-chain``
    with ``gamma·lam`` well below 1 decays a reward to nothing over a long chain)."""
    zero = counts.zero_advantage_loss_tokens
    if zero and opts.advantage.startswith("gae"):  # grpo: 0 in a uniform group, by design
        logger.warning(
            "advantage %s (gamma %s, lam %s): %d of %d loss tokens of rewarded episodes get "
            "advantage 0 and will not be trained; without a critic use grpo, or gae-chain "
            "with gamma = lam = 1", opts.advantage, opts.gamma, opts.lam, zero,
            counts.loss_tokens)


def _accept(done: _Done, opts: ExportOptions, counts: _Counts, recompute: Any) -> bool:
    """Length policy, logprob recomputation and counts of one episode: ``False`` when it
    is dropped (not written)."""
    if not _length_policy(done, opts, counts):
        return False
    if recompute is not None:
        done.rows = recompute(done.rows)
    counts.add(done)
    return True


def _length_policy(done: _Done, opts: ExportOptions, counts: _Counts) -> bool:
    """Apply ``max_tokens`` to one episode: ``False`` when it is dropped. A masked episode
    keeps its rows with ``mask_episode`` set and its advantages zeroed (its group's
    statistics were computed with it, as for any masked episode)."""
    limit = opts.max_tokens
    if limit is None or all(len(r["prompt_ids"]) + len(r["response_ids"]) <= limit
                            for r in done.rows):
        return True
    if opts.overlong == "drop":
        counts.episodes_overlong_dropped += 1
        return False
    counts.episodes_overlong_masked += 1
    for r in done.rows:
        r["mask_episode"] = True
        r["advantages"] = np.zeros(len(r["response_ids"]), dtype=np.float32)
        if r.get("returns") is not None:
            r["returns"] = np.zeros(len(r["response_ids"]), dtype=np.float32)
    done.episode = dict(done.episode, mask_episode=True)
    return True


def _recomputer(opts: ExportOptions) -> Any:
    if opts.recompute_logprobs is None:
        return None
    try:
        from ..rl.recompute import LogprobRecomputer
    except ImportError as exc:
        raise ConfigError("--recompute-logprobs needs torch (the `rl` extra)") from exc
    return LogprobRecomputer(opts.recompute_logprobs, device=opts.recompute_device,
                             batch_tokens=opts.recompute_batch_tokens)


def _manifest(index: _Index, tok: ChatTokenizer, opts: ExportOptions, counts: _Counts,
              writer: _Writer) -> dict[str, Any]:
    meta = [r.get("metadata") or {} for r in index.runs]
    return {
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "format": opts.fmt,
        "tokenizer": tok.info(),
        "model": next((m["model"] for m in meta if m.get("model")), None),
        "sampling": next((m["sampling"] for m in meta if m.get("sampling")), None),
        "advantage": {"mode": opts.advantage, "eps": opts.eps, "gamma": opts.gamma,
                      "lam": opts.lam, "values": "zero (no critic)"
                      if opts.advantage.startswith("gae") else None},
        "summary_trained_override": opts.summary_trained,
        "logprobs": {"recomputed_with": opts.recompute_logprobs},
        "mask_stop_reasons": sorted(opts.mask_stop_reasons),
        "length": {"max_tokens": opts.max_tokens, "overlong": opts.overlong},
        "unrewarded": opts.unrewarded,
        "counts": {k: v for k, v in vars(counts).items()},
        "files": {"segments": writer.files,
                  "episodes": {"path": writer.episodes_path.name, "rows": writer.episode_rows}},
        "sources": {"logs": [str(p) for p in index.logs], "runs": index.runs,
                    "torn_tails": index.torn},
    }


def iter_export_rows(out_dir: str | os.PathLike[str]) -> Iterator[list[dict[str, Any]]]:
    """The segment rows of an export, one shard at a time (in manifest order)."""
    from ..rl._schema import read_rows

    out = Path(out_dir)
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["files"]["segments"]:
        yield read_rows(out / entry["path"])


def read_export(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All segment rows of an export, in order (small exports and tests; use
    ``iter_export_rows`` or read ``segments-*.parquet`` directly for large ones)."""
    return [row for shard in iter_export_rows(out_dir) for row in shard]


def validate_export(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Re-read an export and check it; returns the manifest.

    Each shard must pass ``agentcompact.rl._schema.validate_rows`` with the manifest's
    tokenizer and template hashes; no episode or group may span two shards; row, episode and
    token counts must match the manifest; every episode row must agree with its segments.

    :raises SegmentRowError: a row breaks an invariant (names row, episode, field).
    :raises ExportError: the files disagree with the manifest or with each other.
    """
    from ..rl._schema import validate_rows

    out = Path(out_dir)
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ExportError(f"{out}/manifest.json: unreadable: {exc}") from exc
    tok = manifest["tokenizer"]
    seen_groups: set[str] = set()
    episodes: dict[str, tuple[int, float, str]] = {}
    n_rows = n_loss = 0
    for entry, rows in zip(manifest["files"]["segments"], iter_export_rows(out), strict=True):
        if len(rows) != entry["rows"]:
            raise ExportError(f"{entry['path']}: {len(rows)} rows, manifest says "
                                  f"{entry['rows']}")
        validate_rows(rows, tokenizer_sha256=tok["tokenizer_sha256"],
                      chat_template_sha256=tok["chat_template_sha256"])
        groups = {r["group_id"] for r in rows}
        if groups & seen_groups:
            raise ExportError(f"{entry['path']}: groups {sorted(groups & seen_groups)[:3]} "
                                  "also appear in an earlier shard")
        seen_groups |= groups
        for r in rows:
            episodes[r["episode_id"]] = (r["num_segments"], r["episode_reward"], r["group_id"])
            n_loss += sum(r["response_mask"])
        n_rows += len(rows)
    _check_counts(manifest, n_rows, len(episodes), n_loss)
    _check_episode_table(out / manifest["files"]["episodes"]["path"], episodes)
    return manifest  # type: ignore[no-any-return]  # parsed JSON object


def _check_counts(manifest: Mapping[str, Any], rows: int, episodes: int, loss: int) -> None:
    counts = manifest["counts"]
    for name, found in (("segments", rows), ("episodes", episodes), ("loss_tokens", loss)):
        if counts[name] != found:
            raise ExportError(f"manifest counts {counts[name]} {name}, files hold {found}")


def _check_episode_table(path: Path, episodes: Mapping[str, tuple[int, float, str]]) -> None:
    if path.suffix == ".parquet":
        table = pq.read_table(str(path), schema=EPISODE_SCHEMA).to_pylist()
    else:
        table = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    if len(table) != len(episodes):
        raise ExportError(f"{path}: {len(table)} episode rows for {len(episodes)} episodes")
    for row in table:
        want = episodes.get(row["episode_id"])
        got = (row["num_segments"], row["episode_reward"], row["group_id"])
        if want != got:
            raise ExportError(f"{path}: episode {row['episode_id']!r} has (num_segments, "
                                  f"reward, group) {got}, its segments say {want}")
