"""Log-probabilities of chosen tokens at response positions only, in chunks (torch).

A causal LM's logits over a whole row cost ``T × V`` floats: 32k tokens with Qwen's 152k
vocabulary is 19.9 GB in float32, for one row. A policy loss needs ``log π(y_t | y_<t)``
only where the loss mask is 1, so everything here starts by selecting those positions:

* :func:`chosen_logprobs` — from the model's final hidden states and the ``lm_head``
  weight: ``log softmax(h W^T)[y]`` computed in blocks of ``token_chunk`` positions ×
  ``vocab_chunk`` vocabulary rows, forward and backward (a custom autograd function
  recomputes each block's logits in backward instead of keeping them). Memory:
  ``O(token_chunk × vocab_chunk)`` on top of the selected hidden states and the weight's
  gradient; never ``T × V``.
* :func:`chosen_logprobs_from_logits` — when the caller already holds ``[B, T, V]`` logits:
  only the response positions are gathered (``N × V``, N response tokens) and
  log-softmaxed in blocks of ``token_chunk`` positions.
* :func:`response_positions` — the ``(row, position)`` pairs of the loss tokens of a
  collated batch (``agentcompact.rl.torch_data.collate``), and the logit row predicting
  each (``position − 1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from agentcompact.errors import ExportError

__all__ = [
    "DEFAULT_TOKEN_CHUNK",
    "DEFAULT_VOCAB_CHUNK",
    "chosen_logprobs",
    "chosen_logprobs_from_logits",
    "response_positions",
]

#: positions per block (both entry points)
DEFAULT_TOKEN_CHUNK = 2048
#: vocabulary rows per block (:func:`chosen_logprobs`)
DEFAULT_VOCAB_CHUNK = 16384


def response_positions(
    batch: Mapping[str, Any], *, mask_key: str = "loss_mask"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, positions)`` of the tokens the loss reads, as 1-D long tensors.

    :param batch: a collated batch (``agentcompact.rl.torch_data.collate``).
    :param mask_key: the batch mask selecting them: ``loss_mask`` (default), or
        ``response_mask`` (every sampled token, masked episodes included: what
        ``--recompute-logprobs`` fills).
    """
    rows, positions = (batch[mask_key] > 0).nonzero(as_tuple=True)
    if positions.numel() and int(positions.min()) == 0:
        raise ExportError("a loss token at position 0 has no logit predicting it")
    return rows, positions


class _ChunkedChosenLogprob(torch.autograd.Function):
    """``log softmax(h W^T)[target]`` for ``h`` [N, H], ``W`` [V, H], in blocks."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                token_chunk: int, vocab_chunk: int) -> torch.Tensor:
        lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for a in range(0, hidden.shape[0], token_chunk):
            h = hidden[a:a + token_chunk]
            running = torch.full((h.shape[0],), float("-inf"), device=h.device)
            for v in range(0, weight.shape[0], vocab_chunk):
                block = (h @ weight[v:v + vocab_chunk].T).float()
                running = torch.logaddexp(running, torch.logsumexp(block, dim=-1))
            lse[a:a + token_chunk] = running
        chosen = (hidden.float() * weight[targets].float()).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunks = (token_chunk, vocab_chunk)
        return chosen - lse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors
        token_chunk, vocab_chunk = ctx.chunks
        grad = grad.float()
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gh = torch.zeros_like(hidden, dtype=torch.float32) if need_h else None
        gw = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        for a in range(0, hidden.shape[0], token_chunk):
            h, g, z = hidden[a:a + token_chunk], grad[a:a + token_chunk], lse[a:a + token_chunk]
            for v in range(0, weight.shape[0], vocab_chunk):
                w = weight[v:v + vocab_chunk]
                # d(−lse)/d logits = −softmax: the block's logits recomputed, not stored
                d_logits = torch.exp((h @ w.T).float() - z[:, None]) * -g[:, None]
                if gh is not None:
                    gh[a:a + token_chunk] += d_logits @ w.float()
                if gw is not None:
                    gw[v:v + vocab_chunk] += d_logits.T @ h.float()
        if gh is not None:
            gh += grad[:, None] * weight[targets].float()
        if gw is not None:
            gw.index_add_(0, targets, grad[:, None] * hidden.float())
        return (None if gh is None else gh.to(hidden.dtype),
                None if gw is None else gw.to(weight.dtype), None, None, None)


def chosen_logprobs(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    batch: Mapping[str, Any],
    *,
    token_chunk: int = DEFAULT_TOKEN_CHUNK,
    vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
    mask_key: str = "loss_mask",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities of the batch's tokens at its loss positions, from hidden states.

    :param hidden: ``[B, T, H]`` final hidden states (after the last norm) on
        ``batch["input_ids"]``; ``model.model(...).last_hidden_state`` for Hugging Face
        causal LMs (``lm_head`` without bias).
    :param lm_head_weight: ``[V, H]`` (``model.lm_head.weight``; tied embeddings work too).
    :returns: ``(logprobs [N], rows [N], positions [N])`` — differentiable w.r.t. both
        ``hidden`` and ``lm_head_weight``.
    """
    rows, positions = response_positions(batch, mask_key=mask_key)
    device = hidden.device
    rows, positions = rows.to(device), positions.to(device)
    targets = batch["input_ids"].to(device)[rows, positions]
    selected = hidden[rows, positions - 1]
    out: torch.Tensor = _ChunkedChosenLogprob.apply(  # type: ignore[no-untyped-call]  # torch
        selected, lm_head_weight, targets, token_chunk, vocab_chunk)
    return out, rows, positions


def chosen_logprobs_from_logits(
    logits: torch.Tensor,
    batch: Mapping[str, Any],
    *,
    token_chunk: int = DEFAULT_TOKEN_CHUNK,
    mask_key: str = "loss_mask",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like :func:`chosen_logprobs` from ``[B, T, V]`` logits: only response positions are
    gathered and log-softmaxed (``N × V`` more memory, never ``T × V``)."""
    rows, positions = response_positions(batch, mask_key=mask_key)
    device = logits.device
    rows, positions = rows.to(device), positions.to(device)
    targets = batch["input_ids"].to(device)[rows, positions]
    parts = []
    for a in range(0, rows.numel(), token_chunk):
        r, p, y = rows[a:a + token_chunk], positions[a:a + token_chunk], targets[a:a + token_chunk]
        block = logits[r, p - 1].float()
        parts.append(block.gather(-1, y[:, None]).squeeze(-1) - torch.logsumexp(block, dim=-1))
    out = torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float32)
    return out, rows, positions
