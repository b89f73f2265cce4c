"""Pass 1 of an export: the index of the event logs, each episode's outcome, the
``unrewarded`` policy and the group statistics (outcome advantages per episode).

Every line is read once; per episode, the byte spans of its events, its group, its
``episode_end`` (reward, stop reason, trial). Group statistics for GRPO / Dr.GRPO / RLOO
are computed here, over episodes (``agentcompact.rl._advantages``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..rl._advantages import drgrpo_advantages, grpo_advantages, rloo_advantages
from ..rl._schema import STOP_REASONS
from ._events_log import EventReader
from ._export_options import ExportOptions

logger = logging.getLogger("agentcompact.trajectory.export")  # the export's own

@dataclass
class IndexedEpisode:
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
class LogIndex:
    logs: list[Path]
    episodes: dict[str, IndexedEpisode] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)

    def groups(self) -> dict[str, list[IndexedEpisode]]:
        out: dict[str, list[IndexedEpisode]] = {}
        for ep in self.episodes.values():
            if ep.calls:
                out.setdefault(ep.group_id, []).append(ep)
        return out


def index_logs(paths: Sequence[str | os.PathLike[str]]) -> LogIndex:
    readers = [EventReader(p) for p in paths]
    index = LogIndex([r.path for r in readers])
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
            ep = index.episodes.setdefault(str(eid), IndexedEpisode(str(eid)))
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
class Outcome:
    reward: float
    stop_reason: str
    sample_index: int
    incomplete: bool
    #: the episode_end carried a numeric reward
    rewarded: bool = True
    #: masked because an episode of its group has no reward (``unrewarded=mask-group``)
    group_masked: bool = False


def read_outcomes(groups: Mapping[str, list[IndexedEpisode]]) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
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
            out[ep.episode_id] = Outcome(
                reward=float(reward) if isinstance(reward, (int, float)) else 0.0,
                stop_reason=stop if ep.end is not None else "error",
                sample_index=pos if renumber else trial,
                incomplete=ep.end is None or not isinstance(reward, (int, float)),
                rewarded=isinstance(reward, (int, float)) and not isinstance(reward, bool),
            )
    return out


@dataclass
class UnrewardedCounts:
    """What the ``unrewarded`` policy did (manifest counts)."""

    episodes_unrewarded: int = 0
    groups_unrewarded_masked: int = 0
    episodes_unrewarded_dropped: int = 0


def apply_unrewarded(
    groups: Mapping[str, list[IndexedEpisode]], outcomes: dict[str, Outcome], opts: ExportOptions
) -> tuple[dict[str, list[IndexedEpisode]], UnrewardedCounts]:
    """Apply ``opts.unrewarded`` to the groups holding an episode without a reward: the
    groups to write (``drop-episode``: those episodes left out) and what was done;
    ``mask-group`` marks every outcome of such a group (``outcomes`` is updated)."""
    done = UnrewardedCounts()
    kept: dict[str, list[IndexedEpisode]] = {}
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


def episode_advantages(
    groups: Mapping[str, list[IndexedEpisode]], outcomes: Mapping[str, Outcome], opts: ExportOptions
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

