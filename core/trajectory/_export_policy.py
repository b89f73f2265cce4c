"""What the exporting process does with each episode's rows before they are written: the
length policy (``max_tokens`` / ``overlong``), log-probability recomputation and the
manifest's counts; and the warnings about an export's advantages.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ._export_options import ExportOptions
from ._export_rows import EpisodeResult

logger = logging.getLogger("agentcompact.trajectory.export")  # the export's own

@dataclass
class ExportCounts:
    """The manifest's ``counts``: what was exported, masked, dropped and cut, added episode
    by episode (``add``) in the exporting process, or counted per episode where it was
    made and merged in export order (``merge``: ``ray_export``)."""

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

    def add(self, done: EpisodeResult) -> None:
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

    def merge(self, other: ExportCounts) -> None:
        """Add the counts of ``other`` (one episode's, counted by a worker): in episode
        order, the same counts as ``add`` in this process (``breaks`` in the same order)."""
        for name, value in vars(other).items():
            if name == "breaks":
                for reason, n in value.items():
                    self.breaks[reason] = self.breaks.get(reason, 0) + n
            else:
                setattr(self, name, getattr(self, name) + value)



def warn_critic_free_gae(advantage: str) -> None:
    """Say plainly what a ``gae-*`` export is (docs/rl-loop.md, "Which trainer takes chain
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


def warn_zero_advantages(opts: ExportOptions, counts: ExportCounts) -> None:
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


def accept_episode(done: EpisodeResult, opts: ExportOptions, counts: ExportCounts,
                   recompute: Any) -> bool:
    """Length policy, logprob recomputation and counts of one episode: ``False`` when it
    is dropped (not written)."""
    if not _length_policy(done, opts, counts):
        return False
    if recompute is not None:
        done.rows = recompute(done.rows)
    counts.add(done)
    return True


def _length_policy(done: EpisodeResult, opts: ExportOptions, counts: ExportCounts) -> bool:
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


def logprob_recomputer(opts: ExportOptions) -> Any:
    if opts.recompute_logprobs is None:
        return None
    try:
        from ..rl.recompute import LogprobRecomputer
    except ImportError as exc:
        raise ConfigError("--recompute-logprobs needs torch (the `rl` extra)") from exc
    return LogprobRecomputer(opts.recompute_logprobs, device=opts.recompute_device,
                             batch_tokens=opts.recompute_batch_tokens)

