"""Pass 2 of an export, one episode: its events read back by offset, cut into segments
(``segments.build_segments``), turned into rows with advantages, and its episode-table
row. The same functions build the in-memory rows (``_memory``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from .._events import CompactionEvent, ModelCall, SummaryCall
from ..errors import TrajectoryError
from ..rl._advantages import broadcast_to_segments
from ..rl._gae import assign_gae
from ..rl._schema import SCHEMA_VERSION
from ._events_log import read_event_at
from ._export_index import Outcome
from ._export_options import ExportOptions
from ._segments import Segment, build_segments
from ._tokenize import ChatTokenizer

if TYPE_CHECKING:
    from ._export_policy import ExportCounts



_DECODERS = {"model_call": ModelCall, "compaction": CompactionEvent, "summary_call": SummaryCall}


def _episode_items(
    ctx: ExportContext, spans: Sequence[tuple[int, int, int, int]]
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
class EpisodeJob:
    """What one episode's work needs besides the logs, tokenizer and options: small, so it
    is cheap to send to a worker process."""

    episode_id: str
    group_id: str
    spans: list[tuple[int, int, int, int]]  # (log, offset, length, line) of its events
    outcome: Outcome
    advantage: float | None  # the episode's advantage (grpo / drgrpo / rloo), else None


@dataclass
class EpisodeResult:
    """One episode's rows (token fields as NumPy arrays), its episode-table row, what the
    manifest counts of it, and the log records a worker process emitted for it."""

    rows: list[dict[str, Any]]
    episode: dict[str, Any]
    calls: int
    compactions: int
    breaks: list[str]
    incomplete: bool
    records: list[logging.LogRecord] = field(default_factory=list)
    #: counted where it was made (``accept_episode``): its counts, and whether it is written —
    #: a runner whose workers write the shards sends these, not the rows (``ray_export``)
    counted: ExportCounts | None = None
    kept: bool = True


class ExportContext:
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


def export_episode(ctx: ExportContext, job: EpisodeJob) -> EpisodeResult:
    """Read one episode's events back, cut them into segments and build its rows."""
    items = list(_episode_items(ctx, job.spans))
    first, last = job.spans[0], job.spans[-1]
    segs = episode_segments(items, ctx.tok, ctx.opts, job.episode_id,
                     f"{ctx.logs[first[0]]}:{first[3]}-{last[3]}: ")
    return finish_episode(job, segs, count_compactions(items), ctx.tok, ctx.opts)


def episode_segments(items: Sequence[tuple[str, Any]], tok: ChatTokenizer, opts: ExportOptions,
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


def count_compactions(items: Sequence[tuple[str, Any]]) -> int:
    return sum(1 for kind, _ in items if kind == "compaction")


def finish_episode(job: EpisodeJob, segs: list[Segment], compactions: int, tok: ChatTokenizer,
            opts: ExportOptions) -> EpisodeResult:
    """One episode's rows, advantages and episode-table row from its segments."""
    adv = {} if job.advantage is None else {job.episode_id: job.advantage}
    rows = _with_advantages(_rows(job, segs, tok, opts), adv, opts)
    return EpisodeResult(rows, _episode_row(rows, segs, compactions),
                 calls=sum(s.num_calls for s in segs), compactions=compactions,
                 breaks=[s.break_reason for s in segs if s.break_reason],
                 incomplete=job.outcome.incomplete)


def _rows(
    job: EpisodeJob, segs: list[Segment], tok: ChatTokenizer, opts: ExportOptions
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

