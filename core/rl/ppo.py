"""The PPO / GRPO policy loss on collated segment rows (torch; ``rl`` extra).

``loss = Σ_{(b,t) : m=1} w_{b,t} · ℓ_{b,t}`` with verl's per-token surrogate
(``compute_policy_loss_vanilla``; docs/rl-math.md, "Policy loss")::

    ρ  = exp(clamp(logπ − logπ_old, −20, 20))
    ℓ1 = max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high))        # PPO clip
    ℓ  = min(ℓ1, −A·c)  where A < 0, else ℓ1               # dual-clip, c = 3 by default

Log-probabilities are computed at loss positions only (:mod:`agentcompact.rl.logprobs`):
:func:`policy_loss_from_hidden` never materialises more than one ``token_chunk ×
vocab_chunk`` block of logits; :func:`policy_loss` takes logits the caller already has.

``logπ_old`` is the row's ``rollout_logprobs``. A row that has loss tokens but no recorded
logprobs (``sampling.logprobs_mode == "none"``) is refused with an error naming it: a zero
``logπ_old`` makes ``ρ`` the token probability (~1e-5) and the loss does not train. Pass
``old_logprobs="detached"`` for strictly on-policy data (``ρ = 1`` in value, the gradient
of ``A·logπ``), or recompute them (``agentcompact export --recompute-logprobs MODEL``).

The token weights ``w`` come from :func:`agentcompact.rl.torch_data.collate`; for an
optimizer step made of several micro-batches use :func:`collate_step`, which normalises
every micro-batch by the step's global count (and across ranks when ``torch.distributed``
is initialised).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from agentcompact.errors import ConfigError, ExportError
from agentcompact.rl._loss import denominator, effective_mask
from agentcompact.rl.logprobs import (
    DEFAULT_TOKEN_CHUNK,
    DEFAULT_VOCAB_CHUNK,
    chosen_logprobs,
    chosen_logprobs_from_logits,
)
from agentcompact.rl.torch_data import Row, batch_token_weights, collate

__all__ = [
    "DUAL_CLIP_C",
    "OldLogprobs",
    "collate_step",
    "policy_loss",
    "policy_loss_from_hidden",
    "require_rollout_logprobs",
    "step_normalizer",
    "surrogate",
]

#: verl's default ``clip_ratio_c`` (dual-clip PPO, Ye et al. 2019)
DUAL_CLIP_C = 3.0
#: verl clamps the log-ratio before ``exp``
_LOG_RATIO_CLAMP = 20.0

OldLogprobs = Literal["rollout", "detached"]


def surrogate(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    clip_ratio_c: float | None = DUAL_CLIP_C,
) -> torch.Tensor:
    """Per-token PPO loss ``ℓ`` (verl's ``compute_policy_loss_vanilla``, elementwise).

    :param clip_ratio_c: dual-clip bound for negative advantages (> 1), ``None`` to disable.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ConfigError(f"clip_ratio_c must be > 1 (or None), got {clip_ratio_c}")
    log_ratio = torch.clamp(logp - old, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)
    loss = torch.maximum(-adv * ratio, -adv * clipped)
    if clip_ratio_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_ratio_c), loss)
    return loss


def require_rollout_logprobs(batch: Mapping[str, Any]) -> None:
    """Raise ``ExportError`` naming every row with loss tokens but no rollout logprobs."""
    known = batch["logprobs_known"].cpu()
    has_loss = (batch["loss_mask"].cpu() > 0).any(dim=1)
    missing = (has_loss & ~known).nonzero().flatten().tolist()
    if missing:
        labels = batch.get("row_labels") or [f"row {b}" for b in range(len(known))]
        named = ", ".join(labels[b] for b in missing[:5])
        raise ExportError(
            f"{len(missing)} row(s) have loss tokens but no rollout logprobs "
            f"(sampling.logprobs_mode 'none'): {named}; record them from the server, run "
            "`agentcompact export --recompute-logprobs MODEL`, or use old_logprobs='detached' "
            "for on-policy data"
        )


def _loss(logp: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
          batch: Mapping[str, Any], weights: torch.Tensor, old_logprobs: OldLogprobs,
          **clip: Any) -> torch.Tensor:
    device = logp.device
    if old_logprobs == "rollout":
        old = batch["old_logprobs"].to(device)[rows, positions]
    elif old_logprobs == "detached":
        old = logp.detach()
    else:
        raise ConfigError(f"old_logprobs {old_logprobs!r}: choose 'rollout' or 'detached'")
    adv = batch["advantages"].to(device)[rows, positions]
    w = weights.to(device)[rows, positions]
    return (w * surrogate(logp, old, adv, **clip)).sum()


def _check_old(batch: Mapping[str, Any], old_logprobs: str) -> None:
    """Before any compute: the rows have what ``old_logprobs`` asks for."""
    if old_logprobs not in ("rollout", "detached"):
        raise ConfigError(f"old_logprobs {old_logprobs!r}: choose 'rollout' or 'detached'")
    if old_logprobs == "rollout":
        require_rollout_logprobs(batch)


def _weights(batch: Mapping[str, Any], mode: str | None) -> torch.Tensor:
    return batch["token_weights"] if mode is None else batch_token_weights(batch, mode)


def policy_loss(
    logits: torch.Tensor,
    batch: Mapping[str, Any],
    mode: str | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    clip_ratio_c: float | None = DUAL_CLIP_C,
    old_logprobs: OldLogprobs = "rollout",
    token_chunk: int = DEFAULT_TOKEN_CHUNK,
) -> torch.Tensor:
    """The loss from ``[B, T, V]`` logits on ``batch["input_ids"]`` (any device).

    Only the loss positions are read from ``logits``. ``mode`` recomputes the weights for
    another aggregation (default: the one chosen in ``collate``).

    :returns: a float32 scalar, differentiable w.r.t. ``logits``.
    """
    _check_old(batch, old_logprobs)
    logp, rows, positions = chosen_logprobs_from_logits(logits, batch, token_chunk=token_chunk)
    return _loss(logp, rows, positions, batch, _weights(batch, mode), old_logprobs,
                 clip_eps=clip_eps, clip_eps_high=clip_eps_high, clip_ratio_c=clip_ratio_c)


def policy_loss_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    batch: Mapping[str, Any],
    mode: str | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    clip_ratio_c: float | None = DUAL_CLIP_C,
    old_logprobs: OldLogprobs = "rollout",
    token_chunk: int = DEFAULT_TOKEN_CHUNK,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
) -> torch.Tensor:
    """The loss from final hidden states ``[B, T, H]`` and the ``lm_head`` weight ``[V, H]``:
    memory ``O(token_chunk × vocab_chunk)`` for the logits, however long the rows::

        hidden = model.model(input_ids=..., attention_mask=..., position_ids=...)
        loss = policy_loss_from_hidden(hidden.last_hidden_state, model.lm_head.weight, batch)
    """
    _check_old(batch, old_logprobs)
    logp, rows, positions = chosen_logprobs(hidden, lm_head_weight, batch,
                                            token_chunk=token_chunk, vocab_chunk=vocab_chunk)
    return _loss(logp, rows, positions, batch, _weights(batch, mode), old_logprobs,
                 clip_eps=clip_eps, clip_eps_high=clip_eps_high, clip_ratio_c=clip_ratio_c)


# --------------------------------------------------------------------------- one step


def _world() -> tuple[int, bool]:
    dist = torch.distributed
    on = dist.is_available() and dist.is_initialized()
    return (dist.get_world_size() if on else 1), on


def step_normalizer(rows: Sequence[Row], mode: str, *, max_len: int | None = None) -> float:
    """The denominator of ``mode`` over every row of one optimizer step, on every rank.

    With ``torch.distributed`` initialised the local counts are summed over ranks
    (``L_max`` for constant-norm: the maximum) and the result is divided by the world
    size, because data-parallel training averages gradients over ranks: each rank's loss is
    then ``Σ_local w·ℓ · W / D_global`` and the averaged gradient is that of
    ``Σ_global w·ℓ / D_global`` (verl scales by ``dp_size`` the same way).
    """
    masks = [effective_mask(r) for r in rows]
    width = max_len if max_len is not None else max((len(m) for m in masks), default=0)
    local = denominator(
        masks, mode, loss_weights=[float(r.get("loss_weight", 1.0)) for r in rows],
        episode_ids=[str(r["episode_id"]) for r in rows], max_len=width,
    )
    world, on = _world()
    if not on:
        return local
    values = torch.tensor([local, float(len(rows)), float(width)], dtype=torch.float64)
    if torch.distributed.get_backend() == "nccl":
        values = values.cuda()
    total = values.clone()
    torch.distributed.all_reduce(total)
    peak = values[2:].clone()
    torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
    if mode in ("constant-norm", "dr-grpo", "dr_grpo"):
        return float(total[1] * peak[0]) / world
    return float(total[0]) / world


def collate_step(
    rows: Sequence[Row],
    pad_token_id: int,
    micro_batch_size: int,
    mode: str = "token-mean",
    max_len: int | None = None,
) -> list[dict[str, Any]]:
    """The micro-batches of one optimizer step, each weighted by the step's global
    denominator (:func:`step_normalizer`): summing their losses (gradient accumulation)
    gives exactly the loss of the whole step as one batch. (episode-mean-token-mean reads
    ``N_e`` from the rows' ``episode_num_loss_tokens``, so an episode may straddle two
    micro-batches.)"""
    if micro_batch_size < 1:
        raise ConfigError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if not rows:
        raise ExportError("collate_step: no rows")
    width = max_len if max_len is not None else max(len(r["response_ids"]) for r in rows)
    norm = step_normalizer(rows, mode, max_len=width)
    return [collate(rows[a:a + micro_batch_size], pad_token_id, mode, max_len=width,
                    normalizer=norm) for a in range(0, len(rows), micro_batch_size)]
