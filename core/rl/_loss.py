"""Loss aggregation modes as per-token weights: ``loss = Σ_i Σ_t w_{i,t} · ℓ_{i,t}``.

With ``m`` the loss mask and ``n_i = Σ_t m_{i,t}`` (docs/rl-math.md, "Loss aggregation"):

==========================  =====================================  ==============================
mode                        weight ``w_{i,t}``                     used by
==========================  =====================================  ==============================
token-mean                  ``m / Σ_j n_j``                        verl default, TRL dapo/bnpo,
                                                                   SkyRL token_mean
seq-mean-token-sum          ``m / B'``                             verl
seq-mean-token-mean         ``m / (B' · n_i)``                     verl, TRL grpo, SkyRL
                                                                   sequence_mean
constant-norm (Dr.GRPO)     ``m / (B · L_max)``                    TRL dr_grpo
episode-mean-token-mean     ``m / (E' · N_e)``                     restores per-episode weighting
==========================  =====================================  ==============================

``B'`` counts rows with at least one loss token, ``E'`` such episodes, ``N_e`` is the
episode's loss-token count over *all* its segments (``episode_num_loss_tokens``).
Splitting an episode into rows never changes token-mean; episode-mean-token-mean gives the
unsplit seq-mean-token-mean back.

``loss_weight`` (per row) is a *relative* weight: it multiplies the row's tokens and the
mode's normaliser counts tokens / rows / episodes with the same weights (so weight 0 drops a
row entirely, and rows of weight 1/N_seg under seq-mean-token-mean give Example 2's 3.0).
constant-norm keeps its constant ``B · L_max``. In episode mode the rows of an episode must
share one weight. ``normalizer`` overrides the computed denominator (e.g. the global count
across data-parallel ranks). Pure numpy: no torch here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agentcompact.errors import ConfigError, ExportError

__all__ = [
    "LOSS_MODES",
    "LossMode",
    "aggregate",
    "denominator",
    "effective_mask",
    "token_weights",
    "weights_for_rows",
]

LossMode = Literal[
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "constant-norm",
    "episode-mean-token-mean",
]
LOSS_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "constant-norm",
    "episode-mean-token-mean",
)
_ALIASES = {"dr-grpo": "constant-norm", "dr_grpo": "constant-norm"}

FloatArray = NDArray[np.float64]


def token_weights(
    masks: Sequence[ArrayLike],
    mode: str,
    *,
    loss_weights: Sequence[float] | None = None,
    episode_ids: Sequence[str] | None = None,
    episode_num_loss_tokens: Sequence[int] | None = None,
    max_len: int | None = None,
    normalizer: float | None = None,
) -> list[FloatArray]:
    """Per-token weights for ``mode`` (one float64 array per row, like ``masks``).

    :param masks: loss mask per row (0/1; already zeroed for masked episodes).
    :param mode: one of :data:`LOSS_MODES` (``"dr-grpo"`` is an alias of constant-norm).
    :param loss_weights: relative weight per row (default 1.0).
    :param episode_ids: episode of each row (episode-mean-token-mean only).
    :param episode_num_loss_tokens: ``N_e`` per row; default: the episode's tokens in the batch.
    :param max_len: ``L_max`` for constant-norm; default: the longest row.
    :param normalizer: replaces the mode's denominator.
    """
    mode = _ALIASES.get(mode, mode)
    if mode not in LOSS_MODES:
        raise ConfigError(f"loss mode {mode!r}: choose one of {LOSS_MODES}")
    m = [np.asarray(x, dtype=np.float64) for x in masks]
    w = _row_weights(loss_weights, len(m))
    n = np.array([x.sum() for x in m])
    d = normalizer or denominator(m, mode, loss_weights=w, episode_ids=episode_ids,
                                  max_len=max_len)
    if mode in ("token-mean", "seq-mean-token-sum", "constant-norm"):
        return _scaled(m, w, np.ones(len(m)), d)
    if mode == "seq-mean-token-mean":
        return _scaled(m, w, np.maximum(n, 1.0), d)
    return _episode_weights(m, w, n, episode_ids, episode_num_loss_tokens, d)


def _row_weights(loss_weights: Sequence[float] | FloatArray | None, rows: int) -> FloatArray:
    w = np.ones(rows) if loss_weights is None else np.asarray(loss_weights, dtype=np.float64)
    if len(w) != rows:
        raise ExportError(f"{len(w)} loss weights for {rows} rows")
    return w


def denominator(
    masks: Sequence[ArrayLike],
    mode: str,
    *,
    loss_weights: Sequence[float] | FloatArray | None = None,
    episode_ids: Sequence[str] | None = None,
    max_len: int | None = None,
) -> float:
    """The normaliser of ``mode`` over these rows: weighted loss tokens (token-mean), rows
    with a loss token (seq-mean-*), ``B · L_max`` (constant-norm), episodes with a loss
    token (episode-mean-token-mean). Pass it as ``normalizer`` to weigh micro-batches by
    the count over a whole optimizer step."""
    mode = _ALIASES.get(mode, mode)
    m = [np.asarray(x, dtype=np.float64) for x in masks]
    w = _row_weights(loss_weights, len(m))
    n = np.array([x.sum() for x in m])
    if mode == "token-mean":
        return float((w * n).sum())
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return float(w[n > 0].sum())
    if mode == "constant-norm":
        width = max_len if max_len is not None else max((len(x) for x in m), default=0)
        return float(len(m) * width)
    if mode == "episode-mean-token-mean":
        if episode_ids is None or len(episode_ids) != len(m):
            raise ExportError("episode-mean-token-mean needs one episode id per row")
        weight_of: dict[str, float] = {}
        count: dict[str, float] = {}
        for eid, ni, wi in zip(episode_ids, n, w, strict=True):
            weight_of.setdefault(eid, float(wi))
            count[eid] = count.get(eid, 0.0) + float(ni)
        return float(sum(weight_of[e] for e, c in count.items() if c > 0))
    raise ConfigError(f"loss mode {mode!r}: choose one of {LOSS_MODES}")


def _scaled(
    m: list[FloatArray], w: FloatArray, per_row: FloatArray, denominator: float
) -> list[FloatArray]:
    """``w_i · m / (per_row_i · denominator)``; all zeros when there is nothing to weigh."""
    if denominator <= 0:
        return [np.zeros_like(x) for x in m]
    return [x * (wi / (d * denominator)) for x, wi, d in zip(m, w, per_row, strict=True)]


def _episode_weights(
    m: list[FloatArray],
    w: FloatArray,
    n: FloatArray,
    episode_ids: Sequence[str] | None,
    episode_num_loss_tokens: Sequence[int] | None,
    denominator: float,
) -> list[FloatArray]:
    if episode_ids is None or len(episode_ids) != len(m):
        raise ExportError("episode-mean-token-mean needs one episode id per row")
    in_batch: dict[str, float] = {}
    weight_of: dict[str, float] = {}
    for eid, ni, wi in zip(episode_ids, n, w, strict=True):
        in_batch[eid] = in_batch.get(eid, 0.0) + float(ni)
        if weight_of.setdefault(eid, float(wi)) != wi:
            raise ExportError(f"episode {eid!r}: rows have different loss weights")
    n_e = np.array([in_batch[e] for e in episode_ids]) if episode_num_loss_tokens is None \
        else np.asarray(episode_num_loss_tokens, dtype=np.float64)
    return _scaled(m, w, np.maximum(n_e, 1.0), float(denominator))


def effective_mask(row: Mapping[str, Any]) -> NDArray[np.int64]:
    """``response_mask · (1 − mask_episode)`` of a segment row."""
    mask = np.asarray(row["response_mask"], dtype=np.int64)
    return np.zeros_like(mask) if row.get("mask_episode") else mask


def weights_for_rows(
    rows: Sequence[Mapping[str, Any]],
    mode: str,
    *,
    max_len: int | None = None,
    normalizer: float | None = None,
) -> list[FloatArray]:
    """:func:`token_weights` from segment rows (mask, ``mask_episode``, ``loss_weight``,
    ``episode_id``, ``episode_num_loss_tokens``)."""
    return token_weights(
        [effective_mask(r) for r in rows],
        mode,
        loss_weights=[float(r.get("loss_weight", 1.0)) for r in rows],
        episode_ids=[str(r["episode_id"]) for r in rows],
        episode_num_loss_tokens=[int(r["episode_num_loss_tokens"]) for r in rows]
        if all("episode_num_loss_tokens" in r for r in rows) else None,
        max_len=max_len,
        normalizer=normalizer,
    )


def aggregate(losses: Sequence[ArrayLike], weights: Sequence[ArrayLike]) -> float:
    """``Σ_i Σ_t w_{i,t} · ℓ_{i,t}`` over ragged rows (mask-0 tokens have weight 0)."""
    total = 0.0
    for loss, weight in zip(losses, weights, strict=True):
        ell, wt = np.asarray(loss, dtype=np.float64), np.asarray(weight, dtype=np.float64)
        if ell.shape != wt.shape:
            raise ExportError(f"loss shape {ell.shape} != weight shape {wt.shape}")
        total += float((ell * wt).sum())
    return total
