"""Segment rows → the layouts verl, TRL and SkyRL consume. No trainer is imported here.

* :func:`to_verl` — a dict of torch tensors (+ numpy object arrays) for
  ``verl.DataProto.from_single_dict``: left-padded ``prompts``, right-padded ``responses``.
* :func:`to_verl_parquet` — a Parquet file with verl's ``RLHFDataset`` columns plus the
  pre-tokenized replay columns.
* :func:`to_trl_rollout` / :func:`to_trl_sft` — TRL ``rollout_func`` output and SFT features.
* :func:`to_skyrl` — a SkyRL ``GeneratorOutput``-shaped dict with step-wise trajectories.

Everywhere, the loss mask is ``response_mask · (1 − mask_episode)``: trainers know nothing of
``mask_episode``. Rewards sit where verl expects them (:func:`agentcompact.rl.gae.token_rewards`):
the episode reward on the last mask-1 token of the episode's last segment. **GRPO caveat:** a
trainer that groups *rows* by ``uid`` and sums their rewards computes the wrong statistics
for split episodes (``RL_EXPORT.md`` Example 3) — feed it the rows' precomputed
``advantages`` instead (included in every layout that has a place for them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from agentcompact.errors import ValidationError
from agentcompact.rl.gae import token_rewards
from agentcompact.rl.loss import effective_mask
from agentcompact.rl.torch_data import Row, TokenValues, pad_rows

__all__ = [
    "VERL_DATA_SOURCE",
    "VERL_PARQUET_SCHEMA",
    "to_skyrl",
    "to_trl_rollout",
    "to_trl_sft",
    "to_verl",
    "to_verl_parquet",
]

VERL_DATA_SOURCE = "agentcompact"


# --------------------------------------------------------------------------- verl


def _width(rows: Sequence[Row], field: str, limit: int | None) -> int:
    longest = max(len(r[field]) for r in rows)
    if limit is not None and longest > limit:
        bad = next(r for r in rows if len(r[field]) > limit)
        raise ValidationError(
            f"episode {bad['episode_id']!r} segment {bad['segment_index']}: {field} has "
            f"{len(bad[field])} tokens > limit {limit} (rows are never truncated)"
        )
    return limit if limit is not None else longest


def _padded(values: Sequence[TokenValues], width: int, dtype: torch.dtype,
            fill: float = 0, left: bool = False) -> torch.Tensor:
    """Rows right-padded (or left-padded) into a ``[B, width]`` tensor."""
    starts = [width - len(v) for v in values] if left else [0] * len(values)
    return pad_rows(values, starts, width, dtype, fill)


def to_verl(
    rows: Sequence[Row],
    pad_token_id: int,
    max_prompt_len: int | None = None,
    max_response_len: int | None = None,
) -> dict[str, Any]:
    """verl batch layout (``DataProto.from_single_dict`` splits tensors from arrays).

    Tensors ``[B, P]`` / ``[B, R]`` / ``[B, P+R]``: ``prompts`` (left-padded), ``responses``
    (right-padded), ``response_mask`` (loss mask), ``input_ids``, ``attention_mask``,
    ``position_ids``, ``rollout_log_probs``, ``rm_scores``, ``advantages`` (and ``returns``
    when every row has them). numpy object arrays: ``uid`` (= group_id), ``episode_id``,
    ``segment_index``. Rows longer than the limits raise (never truncated).
    """
    if not rows:
        raise ValidationError("to_verl: no rows")
    p = _width(rows, "prompt_ids", max_prompt_len)
    r = _width(rows, "response_ids", max_response_len)
    prompts = _padded([x["prompt_ids"] for x in rows], p, torch.long, pad_token_id, left=True)
    prompt_attn = _padded([[1] * len(x["prompt_ids"]) for x in rows], p, torch.long, left=True)
    response_attn = _padded([[1] * len(x["response_ids"]) for x in rows], r, torch.long)
    attention = torch.cat([prompt_attn, response_attn], dim=1)
    responses = _padded([x["response_ids"] for x in rows], r, torch.long, pad_token_id)
    out: dict[str, Any] = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": _padded([effective_mask(x) for x in rows], r, torch.long),
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "rollout_log_probs": _padded([x["rollout_logprobs"] for x in rows], r, torch.float32),
        "rm_scores": _padded([token_rewards(x) for x in rows], r, torch.float32),
        "advantages": _padded([x["advantages"] for x in rows], r, torch.float32),
        "uid": np.array([str(x["group_id"]) for x in rows], dtype=object),
        "episode_id": np.array([str(x["episode_id"]) for x in rows], dtype=object),
        "segment_index": np.array([int(x["segment_index"]) for x in rows], dtype=object),
    }
    if all(x.get("returns") is not None for x in rows):
        out["returns"] = _padded([x["returns"] for x in rows], r, torch.float32)
    return out


_MESSAGE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
VERL_PARQUET_SCHEMA = pa.schema([
    pa.field("data_source", pa.string()),
    pa.field("prompt", pa.list_(_MESSAGE)),
    pa.field("ability", pa.string()),
    pa.field("reward_model", pa.struct([pa.field("style", pa.string()),
                                        pa.field("ground_truth", pa.string())])),
    pa.field("extra_info", pa.struct([
        pa.field("split", pa.string()), pa.field("index", pa.int64()),
        pa.field("group_id", pa.string()), pa.field("episode_id", pa.string()),
        pa.field("segment_index", pa.int32()),
    ])),
    pa.field("uid", pa.string()),
    pa.field("episode_reward", pa.float32()),
    pa.field("prompt_ids", pa.list_(pa.int32())),
    pa.field("response_ids", pa.list_(pa.int32())),
    pa.field("response_mask", pa.list_(pa.int8())),
    pa.field("rollout_log_probs", pa.list_(pa.float32())),
    pa.field("advantages", pa.list_(pa.float32())),
])


def _chat_messages(row: Row) -> list[dict[str, str]]:
    """The row's ``messages_json`` as ``[{role, content}]`` (content JSON-encoded if not text)."""
    raw = row.get("messages_json")
    if not raw:
        return []
    try:
        messages = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"episode {row['episode_id']!r} segment {row['segment_index']}: "
            f"messages_json is not JSON: {exc}"
        ) from exc
    if not isinstance(messages, list):
        return []
    return [
        {"role": str(m.get("role", "")),
         "content": m["content"] if isinstance(m.get("content"), str)
         else json.dumps(m.get("content"), ensure_ascii=False)}
        for m in messages if isinstance(m, dict)
    ]


def to_verl_parquet(rows: Sequence[Row], path: str | Path, split: str = "train") -> None:
    """Write a Parquet file that verl's ``RLHFDataset`` loads and replay code can train on.

    ``data_source`` / ``prompt`` / ``ability`` / ``reward_model`` / ``extra_info`` follow
    verl's dataset convention; ``prompt`` holds the row's recorded chat messages
    (``messages_json``, empty if absent) for inspection only — re-tokenizing them would
    drift from the sampled tokens. The training payload is the pre-tokenized columns
    ``prompt_ids``, ``response_ids``, ``response_mask`` (loss mask), ``rollout_log_probs``,
    ``advantages`` with ``uid`` = group_id (build tensors with :func:`to_verl`).
    ``reward_model.style`` is ``"replay"``: the reward is already known
    (``ground_truth`` = the episode reward as text, also in ``episode_reward``).
    """
    records = [
        {
            "data_source": VERL_DATA_SOURCE,
            "prompt": _chat_messages(row),
            "ability": "agent",
            "reward_model": {"style": "replay", "ground_truth": repr(float(row["episode_reward"]))},
            "extra_info": {"split": split, "index": i, "group_id": str(row["group_id"]),
                           "episode_id": str(row["episode_id"]),
                           "segment_index": int(row["segment_index"])},
            "uid": str(row["group_id"]),
            "episode_reward": float(row["episode_reward"]),
            "prompt_ids": list(row["prompt_ids"]),
            "response_ids": list(row["response_ids"]),
            "response_mask": effective_mask(row).tolist(),
            "rollout_log_probs": list(row["rollout_logprobs"]),
            "advantages": list(row["advantages"]),
        }
        for i, row in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(records, schema=VERL_PARQUET_SCHEMA), str(path))


# --------------------------------------------------------------------------- TRL


def to_trl_rollout(rows: Sequence[Row]) -> dict[str, list[list[Any]]]:
    """TRL ``GRPOTrainer(rollout_func=...)`` output, one entry per row.

    ``env_mask`` is 1 on policy-sampled tokens and 0 on tool/observation/glue tokens (and
    everywhere in masked episodes). Maps 1:1 to episodes only when each episode is one row.
    """
    return {
        "prompt_ids": [list(r["prompt_ids"]) for r in rows],
        "completion_ids": [list(r["response_ids"]) for r in rows],
        "logprobs": [list(r["rollout_logprobs"]) for r in rows],
        "env_mask": [effective_mask(r).tolist() for r in rows],
    }


def to_trl_sft(rows: Sequence[Row]) -> dict[str, list[list[int]]]:
    """SFT / rejection-sampling features: ``input_ids = prompt + response``,
    ``completion_mask = [0]*P + loss mask``, ``labels`` = ids with −100 where the mask is 0."""
    out: dict[str, list[list[int]]] = {"input_ids": [], "completion_mask": [], "labels": []}
    for r in rows:
        ids = list(r["prompt_ids"]) + list(r["response_ids"])
        mask = [0] * len(r["prompt_ids"]) + effective_mask(r).tolist()
        out["input_ids"].append(ids)
        out["completion_mask"].append(mask)
        out["labels"].append([t if m else -100 for t, m in zip(ids, mask, strict=True)])
    return out


# --------------------------------------------------------------------------- SkyRL


def to_skyrl(rows: Sequence[Row]) -> dict[str, Any]:
    """SkyRL ``GeneratorOutput``-shaped dict, step-wise (one step per segment row).

    ``rewards`` are per token (the episode reward on the last mask-1 token of the episode's
    last step, ``segment_reward`` on each step's last mask-1 token); ``trajectory_ids`` are
    ``{"instance_id": group_id, "repetition_id": sample_index}`` (pass them to
    ``TrajectoryID(**d)``); ``is_last_step`` marks each episode's last segment, whose
    advantage SkyRL broadcasts to the earlier steps.
    """
    return {
        "prompt_token_ids": [list(r["prompt_ids"]) for r in rows],
        "response_ids": [list(r["response_ids"]) for r in rows],
        "rewards": [token_rewards(r).tolist() for r in rows],
        "loss_masks": [effective_mask(r).tolist() for r in rows],
        "rollout_logprobs": [list(r["rollout_logprobs"]) for r in rows],
        "trajectory_ids": [
            {"instance_id": str(r["group_id"]), "repetition_id": int(r["sample_index"])}
            for r in rows
        ],
        "is_last_step": [bool(r["is_last_segment"]) for r in rows],
        "stop_reasons": [str(r["stop_reason"]) for r in rows],
        "rollout_metrics": None,
    }
