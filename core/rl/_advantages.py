"""Outcome advantages over *episodes* (GRPO, Dr.GRPO, RLOO) and their broadcast to segments.

A compacted episode is split into several segment rows, but the group statistics must be
computed over episodes, never over rows (docs/rl-math.md Example 3)::

    group {E1: R=1, 3 segments; E2: R=0, 1 segment}
    grpo_advantages(...)  ->  {E1: +0.7071, E2: -0.7071}
    broadcast_to_segments(...)  ->  +0.7071 on every mask-1 token of E1's three rows

Every estimator accepts any mappings with ``group_id``, ``episode_id`` and ``episode_reward``:
episode-table rows, or segment rows (deduplicated by ``episode_id``; the reward must agree).
All episodes of a group count in its statistics, masked ones included; ``mask_episode`` only
zeroes their tokens in :func:`broadcast_to_segments`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from agentcompact.errors import ConfigError, ExportError

__all__ = [
    "ESTIMATORS",
    "assign_advantages",
    "broadcast_to_segments",
    "drgrpo_advantages",
    "episode_rewards",
    "grpo_advantages",
    "rloo_advantages",
]

Estimator = Literal["grpo", "drgrpo", "rloo"]
ESTIMATORS: tuple[str, ...] = ("grpo", "drgrpo", "rloo")


def episode_rewards(episodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Group → {episode_id: reward}, one entry per episode, in first-seen order.

    Raises :class:`ExportError` if one episode carries two rewards or two groups.
    """
    groups: dict[str, dict[str, float]] = {}
    group_of: dict[str, str] = {}
    for ep in episodes:
        eid, gid, reward = str(ep["episode_id"]), str(ep["group_id"]), float(ep["episode_reward"])
        if group_of.setdefault(eid, gid) != gid:
            raise ExportError(f"episode {eid!r}: in groups {group_of[eid]!r} and {gid!r}")
        known = groups.setdefault(gid, {}).setdefault(eid, reward)
        if known != reward:
            raise ExportError(f"episode {eid!r}: episode_reward {reward} != {known}")
    return groups


def _mean_std(rewards: Sequence[float]) -> tuple[float, float]:
    """verl's group statistics: a singleton group has mean 0 and std 1; else unbiased std."""
    if len(rewards) == 1:
        return 0.0, 1.0
    values = np.asarray(rewards, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1))


def grpo_advantages(
    episodes: Iterable[Mapping[str, Any]], eps: float = 1e-6, std: bool = True
) -> dict[str, float]:
    """GRPO: ``Â_e = (R_e − mean_g) / (std_g + eps)`` over the episodes of each group.

    :param episodes: mappings with ``group_id``, ``episode_id``, ``episode_reward``.
    :param eps: added to the std (1e-6, as verl).
    :param std: divide by the std; ``False`` is Dr.GRPO (``R_e − mean_g``).
    :returns: ``{episode_id: advantage}``.
    """
    out: dict[str, float] = {}
    for rewards in episode_rewards(episodes).values():
        mean, sd = _mean_std(list(rewards.values()))
        for eid, reward in rewards.items():
            out[eid] = (reward - mean) / (sd + eps) if std else reward - mean
    return out


def drgrpo_advantages(episodes: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Dr.GRPO: ``Â_e = R_e − mean_g`` (no division by the std)."""
    return grpo_advantages(episodes, std=False)


def rloo_advantages(episodes: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """RLOO: ``Â_e = R_e − mean of the other episodes of the group``.

    A singleton group has no baseline and keeps ``Â_e = R_e`` (as verl).
    """
    out: dict[str, float] = {}
    for rewards in episode_rewards(episodes).values():
        n, total = len(rewards), sum(rewards.values())
        for eid, reward in rewards.items():
            out[eid] = reward - (total - reward) / (n - 1) if n > 1 else reward
    return out


def broadcast_to_segments(
    rows: Sequence[Mapping[str, Any]], episode_adv: Mapping[str, float], *,
    arrays: bool = False,
) -> list[dict[str, Any]]:
    """Copy ``rows`` with ``advantages[t] = Â_e · mask[t] · (1 − mask_episode)`` (float32).

    Every mask-1 token of every segment of episode ``e`` gets the same ``Â_e``.
    ``arrays=True`` leaves ``advantages`` a float32 NumPy array instead of a list.
    :raises ExportError: if a row's episode has no advantage in ``episode_adv``.
    """
    out = []
    for row in rows:
        eid = str(row["episode_id"])
        if eid not in episode_adv:
            raise ExportError(f"episode {eid!r}: no advantage computed for it")
        scale = 0.0 if row.get("mask_episode") else episode_adv[eid]
        if not math.isfinite(scale):
            raise ExportError(f"episode {eid!r}: advantage {scale} is not finite")
        mask = np.asarray(row["response_mask"])
        new = dict(row)
        adv = np.where(mask == 1, np.float32(scale), np.float32(0.0))
        new["advantages"] = adv if arrays else adv.tolist()
        out.append(new)
    return out


def assign_advantages(
    rows: Sequence[Mapping[str, Any]], estimator: Estimator = "grpo", eps: float = 1e-6
) -> list[dict[str, Any]]:
    """Compute outcome advantages over the episodes in ``rows`` and broadcast them.

    :param estimator: ``"grpo"``, ``"drgrpo"`` or ``"rloo"``.
    """
    if estimator == "grpo":
        adv = grpo_advantages(rows, eps=eps)
    elif estimator == "drgrpo":
        adv = drgrpo_advantages(rows)
    elif estimator == "rloo":
        adv = rloo_advantages(rows)
    else:
        raise ConfigError(f"estimator {estimator!r}: choose one of {ESTIMATORS}")
    return broadcast_to_segments(rows, adv)
