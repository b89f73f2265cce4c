"""PyTorch pieces: a ``Dataset`` over segment rows and ``collate`` (the loss is in
:mod:`agentcompact.rl.ppo`).

Needs the ``rl`` extra (torch). All per-token tensors of a batch share the coordinates of
``input_ids`` (prompt + response, right-padded to ``T``): the response of row ``b`` occupies
``[response_start[b], response_start[b] + len(response_ids))``. The loss
(:mod:`agentcompact.rl.ppo`) reads the logit predicting token ``t`` at ``t − 1``, so it works
with any causal LM::

    ds = SegmentDataset("segments.parquet")
    loader = DataLoader(ds, batch_size=8, collate_fn=partial(collate, pad_token_id=pad))
    for batch in loader:
        batch = move_to(batch, "cuda")
        hidden = model.model(input_ids=batch["input_ids"],
                             attention_mask=batch["attention_mask"],
                             position_ids=batch["position_ids"]).last_hidden_state
        policy_loss_from_hidden(hidden, model.lm_head.weight, batch).backward()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import Dataset

from agentcompact.errors import ExportError
from agentcompact.rl._loss import effective_mask, token_weights, weights_for_rows
from agentcompact.rl._schema import read_rows, validate_rows

__all__ = [
    "SegmentDataset",
    "batch_token_weights",
    "collate",
    "logprobs_known",
    "move_to",
]

Row = Mapping[str, Any]
#: One row's per-token values: a list or a 1-D numpy array.
TokenValues = Sequence[float] | NDArray[Any]


class SegmentDataset(Dataset[dict[str, Any]]):
    """Segment rows in memory, from a list or a ``.jsonl`` / ``.parquet`` file or shard folder.

    Rows are validated (:func:`agentcompact.rl._schema.validate_rows`) unless
    ``validate=False``; items are the row dicts, ready for :func:`collate`.
    """

    def __init__(self, source: Sequence[Row] | str | Path, validate: bool = True) -> None:
        rows = read_rows(source) if isinstance(source, (str, Path)) else [dict(r) for r in source]
        if validate:
            validate_rows(rows)
        self.rows: list[dict[str, Any]] = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]


def pad_rows(rows: Sequence[TokenValues], starts: Sequence[int], width: int,
         dtype: torch.dtype, fill: float = 0) -> torch.Tensor:
    """Place each row at its start column of a ``[B, width]`` tensor filled with ``fill``."""
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for b, (values, start) in enumerate(zip(rows, starts, strict=True)):
        if len(values):
            out[b, start:start + len(values)] = torch.as_tensor(np.asarray(values), dtype=dtype)
    return out


def collate(
    batch: Sequence[Row],
    pad_token_id: int,
    mode: str = "token-mean",
    max_len: int | None = None,
    normalizer: float | None = None,
) -> dict[str, Any]:
    """Pad segment rows into a training batch.

    :param pad_token_id: fills ``input_ids`` beyond each row.
    :param mode: loss aggregation mode of ``token_weights`` (see :mod:`agentcompact.rl._loss`).
    :param max_len: ``L_max`` for constant-norm (default: the longest response).
    :returns: ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask`` (as
        sampled), ``loss_mask`` (× (1 − mask_episode)), ``advantages``, ``old_logprobs``,
        ``token_weights`` — all ``[B, T]`` — plus ``returns`` when every row has them, and
        per row ``response_start``, ``loss_weight``, ``episode_index``,
        ``episode_num_loss_tokens``, ``logprobs_known`` (bool: the row's
        ``rollout_logprobs`` are real, :func:`logprobs_known`) and ``row_labels`` (a list of
        ``"episode E segment K"`` strings for error messages).
    """
    if not batch:
        raise ExportError("collate: empty batch")
    starts = [len(r["prompt_ids"]) for r in batch]
    if min(starts) == 0:  # token 0 has no logit predicting it
        raise ExportError(f"collate: row {starts.index(0)} has an empty prompt")
    width = max(s + len(r["response_ids"]) for s, r in zip(starts, batch, strict=True))
    ids = [list(r["prompt_ids"]) + list(r["response_ids"]) for r in batch]
    zeros = [0] * len(batch)
    attention = pad_rows([[1] * len(x) for x in ids], zeros, width, torch.long)
    width_r = max_len if max_len is not None else max(len(r["response_ids"]) for r in batch)
    weights = weights_for_rows(batch, mode, max_len=width_r, normalizer=normalizer)

    def resp(values: Sequence[TokenValues], dtype: torch.dtype) -> torch.Tensor:
        return pad_rows(values, starts, width, dtype)

    out = {
        "input_ids": pad_rows(ids, zeros, width, torch.long, fill=pad_token_id),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_mask": resp([r["response_mask"] for r in batch], torch.long),
        "loss_mask": resp([effective_mask(r) for r in batch], torch.float32),
        "advantages": resp([r["advantages"] for r in batch], torch.float32),
        "old_logprobs": resp([r["rollout_logprobs"] for r in batch], torch.float32),
        "token_weights": resp(weights, torch.float32),
        "response_start": torch.tensor(starts, dtype=torch.long),
        **_row_info(batch),
    }
    if all(r.get("returns") is not None for r in batch):
        out["returns"] = resp([r["returns"] for r in batch], torch.float32)
    return out


def logprobs_known(row: Row) -> bool:
    """Whether the row's ``rollout_logprobs`` were recorded (or recomputed): its
    ``sampling.logprobs_mode`` is not ``"none"`` (the exporter writes ``"none"`` when any
    sampled token of the segment has no logprob)."""
    sampling = row.get("sampling") or {}
    return str(sampling.get("logprobs_mode") or "none") != "none"


def _row_info(batch: Sequence[Row]) -> dict[str, Any]:
    episodes: dict[str, int] = {}
    index = [episodes.setdefault(str(r["episode_id"]), len(episodes)) for r in batch]
    return {
        "logprobs_known": torch.tensor([logprobs_known(r) for r in batch], dtype=torch.bool),
        "row_labels": [f"episode {r['episode_id']!r} segment {r['segment_index']}"
                       for r in batch],
        "loss_weight": torch.tensor([float(r.get("loss_weight", 1.0)) for r in batch]),
        "episode_index": torch.tensor(index, dtype=torch.long),
        "episode_num_loss_tokens": torch.tensor(
            [int(r["episode_num_loss_tokens"]) for r in batch], dtype=torch.long
        ),
    }


def batch_token_weights(
    batch: Mapping[str, Any],
    mode: str,
    max_len: int | None = None,
    normalizer: float | None = None,
) -> torch.Tensor:
    """Recompute ``token_weights`` of a collated batch for another loss ``mode``."""
    loss_mask = batch["loss_mask"].detach().cpu()
    starts = batch["response_start"].cpu().tolist()
    ends = batch["attention_mask"].cpu().sum(-1).tolist()
    spans = list(zip(starts, ends, strict=True))
    masks = [loss_mask[b, s:e].numpy() for b, (s, e) in enumerate(spans)]
    weights = token_weights(
        masks,
        mode,
        loss_weights=batch["loss_weight"].cpu().tolist(),
        episode_ids=[str(i) for i in batch["episode_index"].cpu().tolist()],
        episode_num_loss_tokens=batch["episode_num_loss_tokens"].cpu().tolist(),
        max_len=max_len if max_len is not None else max(e - s for s, e in spans),
        normalizer=normalizer,
    )
    out = pad_rows(weights, starts, loss_mask.shape[1], torch.float32)
    return out.to(batch["loss_mask"].device)


def move_to(batch: Mapping[str, Any], device: str | torch.device) -> dict[str, Any]:
    """Copy a collated batch to ``device`` (non-tensor values are kept as they are)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
