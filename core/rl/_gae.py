"""GAE with verl semantics, within one row and chained across the segments of an episode.

Within a row (verl ``compute_gae_advantage_return``): ``δ_t = r_t + γ·V_next(t) − V_t``,
``A_t = δ_t + γλ·A_next(t)``, where ``next(t)`` is the next mask-1 token: mask-0 tokens
(tool output, template glue) are *transparent* — they neither bootstrap nor carry the trace,
and a reward placed on one is lost (docs/rl-math.md Example 4b). ``returns = A + V``.

Chain ("cross-trajectory") GAE runs the same recursion over the segments of an episode in
reverse, so the last action token of segment k bootstraps from the first action token of
segment k+1 (the post-summary state) and carries its λ-trace; the *truncated* variant keeps
the bootstrap but restarts the λ-trace at each boundary. Treating segments as independent
episodes (terminal V = 0 at each boundary) is wrong.

Like verl, the advantage on a mask-0 token is the carried trace of the next action token;
:func:`assign_gae` zeroes it when writing rows (the row schema wants 0.0 where mask = 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agentcompact.errors import ExportError
from agentcompact.rl._schema import episodes_of

__all__ = [
    "GAESegment",
    "assign_gae",
    "chain_gae",
    "gae",
    "masked_whiten",
    "token_rewards",
    "truncated_chain_gae",
]

FloatArray = NDArray[np.float64]


class GAESegment(NamedTuple):
    """Per-token rewards, values and response mask of one segment (equal lengths)."""

    rewards: ArrayLike
    values: ArrayLike
    mask: ArrayLike


def chain_gae(
    segments: Sequence[GAESegment | tuple[ArrayLike, ArrayLike, ArrayLike]],
    gamma: float,
    lam: float,
    truncated: bool = False,
) -> list[tuple[FloatArray, FloatArray]]:
    """Chain GAE over the segments of one episode (the pseudo-code of docs/rl-math.md).

    :param segments: ``(rewards, values, mask)`` per segment, in episode order.
    :param truncated: restart the λ-trace at each segment boundary (keep the bootstrap).
    :returns: ``(advantages, returns)`` per segment, float64, not whitened.
    """
    parts = [_as_arrays(*seg) for seg in segments]
    result: list[tuple[FloatArray, FloatArray]] = []
    nextv, lastgae = 0.0, 0.0
    for r, v, m in reversed(parts):
        adv = np.zeros_like(r)
        for t in reversed(range(len(r))):
            delta = r[t] + gamma * nextv - v[t]
            g = delta + gamma * lam * lastgae
            if m[t]:
                nextv, lastgae = float(v[t]), float(g)
            adv[t] = lastgae
        result.append((adv, adv + v))
        if truncated:
            lastgae = 0.0
    return result[::-1]


def truncated_chain_gae(
    segments: Sequence[GAESegment | tuple[ArrayLike, ArrayLike, ArrayLike]],
    gamma: float,
    lam: float,
) -> list[tuple[FloatArray, FloatArray]]:
    """Chain GAE with the λ-trace restarted at every segment boundary."""
    return chain_gae(segments, gamma, lam, truncated=True)


def gae(
    rewards: ArrayLike, values: ArrayLike, mask: ArrayLike, gamma: float, lam: float
) -> tuple[FloatArray, FloatArray]:
    """verl GAE within one row: ``(advantages, returns)``; mask-0 tokens are transparent."""
    return chain_gae([GAESegment(rewards, values, mask)], gamma, lam)[0]


def masked_whiten(
    advantages: Sequence[ArrayLike], masks: Sequence[ArrayLike], shift_mean: bool = True
) -> list[FloatArray]:
    """Whiten advantages over all mask-1 tokens of a batch of rows (verl ``masked_whiten``).

    ``(A − mean) / sqrt(var + 1e-8)`` with the unbiased variance of the mask-1 tokens;
    ``shift_mean=False`` adds the mean back. Mask-0 tokens come back as 0.0.
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in advantages]
    keep = [np.asarray(m) == 1 for m in masks]
    chosen = np.concatenate([a[k] for a, k in zip(arrays, keep, strict=True)] or [np.zeros(0)])
    if chosen.size < 2:
        raise ExportError(f"whitening needs at least 2 mask-1 tokens, got {chosen.size}")
    mean, var = chosen.mean(), chosen.var(ddof=1)
    scale = 1.0 / np.sqrt(var + 1e-8)
    out = []
    for a, k in zip(arrays, keep, strict=True):
        w = (a - mean) * scale + (0.0 if shift_mean else mean)
        out.append(np.where(k, w, 0.0))
    return out


def token_rewards(row: Mapping[str, Any]) -> FloatArray:
    """Per-token rewards of a segment row, placed as verl expects.

    ``segment_reward`` goes on the row's last mask-1 token; on the last segment,
    ``episode_reward`` is added there too. A row with no mask-1 token gets the rewards on
    its last token (they are then dropped by GAE, as in verl; only masked episodes may
    have such a last segment).
    """
    mask = np.asarray(row["response_mask"])
    out = np.zeros(len(mask), dtype=np.float64)
    if len(mask) == 0:
        return out
    ones = np.flatnonzero(mask == 1)
    last = int(ones[-1]) if ones.size else len(mask) - 1
    out[last] += float(row.get("segment_reward", 0.0))
    if row["is_last_segment"]:
        out[last] += float(row["episode_reward"])
    return out


def assign_gae(
    rows: Sequence[Mapping[str, Any]],
    values: Sequence[ArrayLike],
    gamma: float = 1.0,
    lam: float = 1.0,
    truncated: bool = False,
    whiten: bool = True,
) -> list[dict[str, Any]]:
    """Chain GAE per episode over ``rows`` (critic ``values`` per row); fill ``advantages``
    (whitened over the batch unless ``whiten=False``) and ``returns``, as float32.

    Rows may come in any order (trainers shuffle): the chain of an episode runs over its
    rows sorted by ``segment_index``, which must be ``0..K-1`` exactly once each (a
    duplicate or a gap raises ``ExportError``: the chain would bootstrap from the wrong
    state). Results are returned in the order of ``rows``. Masked episodes get zero
    advantages.
    """
    if len(values) != len(rows):
        raise ExportError(f"{len(values)} value arrays for {len(rows)} rows")
    adv: list[FloatArray] = [np.zeros(0)] * len(rows)
    ret: list[FloatArray] = [np.zeros(0)] * len(rows)
    for eid, found in episodes_of(rows).items():
        positions = _chain_order(eid, rows, found)
        segs = [GAESegment(token_rewards(rows[p]), values[p], rows[p]["response_mask"])
                for p in positions]
        for p, (a, r) in zip(positions, chain_gae(segs, gamma, lam, truncated), strict=True):
            adv[p], ret[p] = a, r
    masks = [_loss_mask(row) for row in rows]
    adv = masked_whiten(adv, masks) if whiten else [np.where(m == 1, a, 0.0)
                                                    for a, m in zip(adv, masks, strict=True)]
    return [dict(row, advantages=a.astype(np.float32).tolist(),
                 returns=r.astype(np.float32).tolist())
            for row, a, r in zip(rows, adv, ret, strict=True)]


def _chain_order(eid: str, rows: Sequence[Mapping[str, Any]], positions: list[int]) -> list[int]:
    """``positions`` (the rows of episode ``eid``) sorted by ``segment_index``; the
    indices must be ``0..K-1``, each once."""
    order = sorted(positions, key=lambda p: int(rows[p]["segment_index"]))
    indices = [int(rows[p]["segment_index"]) for p in order]
    if indices != list(range(len(order))):
        dup = sorted({i for i in indices if indices.count(i) > 1})
        what = f"duplicate segment_index {dup}" if dup else (
            f"segment indices {indices} are not 0..{len(order) - 1}")
        raise ExportError(f"episode {eid!r}: {what}; chain GAE needs each segment of the "
                          "episode exactly once (pass all its rows, deduplicated)")
    return order


def _loss_mask(row: Mapping[str, Any]) -> NDArray[np.int64]:
    mask = np.asarray(row["response_mask"], dtype=np.int64)
    return mask * 0 if row.get("mask_episode") else mask


def _as_arrays(
    rewards: ArrayLike, values: ArrayLike, mask: ArrayLike
) -> tuple[FloatArray, FloatArray, NDArray[np.int64]]:
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    m = np.asarray(mask, dtype=np.int64)
    if not r.shape == v.shape == m.shape or r.ndim != 1:
        raise ExportError(
            f"rewards/values/mask must be 1-D of one length, got {r.shape}, {v.shape}, {m.shape}"
        )
    return r, v, m
