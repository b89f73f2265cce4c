"""Segment rows → the layouts verl, TRL and SkyRL consume. No trainer is imported here.

* :func:`to_verl` — a dict of torch tensors (+ numpy object arrays) for
  ``verl.DataProto.from_single_dict``: left-padded ``prompts``, right-padded ``responses``.
* :func:`to_verl_parquet` — a Parquet file with verl's ``RLHFDataset`` columns plus the
  pre-tokenized replay columns.
* :func:`to_trl_rollout` / :func:`to_trl_sft` — TRL ``rollout_func`` output and SFT features.
* :func:`to_skyrl` — a SkyRL ``GeneratorOutput``-shaped dict with step-wise trajectories.

Everywhere, the loss mask is ``response_mask · (1 − mask_episode)``: trainers know nothing of
``mask_episode``. Rewards sit where verl expects them (:func:`agentcompact.rl._gae.token_rewards`):
the episode reward on the last mask-1 token of the episode's last segment. **GRPO caveat:** a
trainer that groups *rows* by ``uid`` and sums their rewards computes the wrong statistics
for split episodes (docs/rl-math.md Example 3) — feed it the rows' precomputed
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

from agentcompact.errors import ExportError
from agentcompact.rl._gae import token_rewards
from agentcompact.rl._loss import effective_mask
from agentcompact.rl.torch_data import Row, TokenValues, logprobs_known, pad_rows

__all__ = [
    "VERL_DATA_SOURCE",
    "require_logprobs",
    "VERL_PARQUET_SCHEMA",
    "to_skyrl",
    "to_trl_rollout",
    "to_trl_sft",
    "to_verl",
    "to_verl_parquet",
]

VERL_DATA_SOURCE = "agentcompact"


def require_logprobs(rows: Sequence[Row], consumer: str) -> None:
    """Refuse rows that have loss tokens but no recorded rollout logprobs (their
    ``rollout_logprobs`` are 0.0 placeholders, ``sampling.logprobs_mode == "none"``).

    :raises ExportError: naming the first rows and what to do about it.
    """
    missing = [r for r in rows if not logprobs_known(r) and effective_mask(r).any()]
    if missing:
        named = ", ".join(f"episode {r['episode_id']!r} segment {r['segment_index']}"
                          for r in missing[:5])
        raise ExportError(
            f"{consumer}: {len(missing)} row(s) have loss tokens but no rollout logprobs "
            f"(sampling.logprobs_mode 'none'): {named}; record them from the server or run "
            "`agentcompact export --recompute-logprobs MODEL`"
        )


# --------------------------------------------------------------------------- verl


def _width(rows: Sequence[Row], field: str, limit: int | None) -> int:
    longest = max(len(r[field]) for r in rows)
    if limit is not None and longest > limit:
        bad = next(r for r in rows if len(r[field]) > limit)
        raise ExportError(
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
    *,
    old_log_probs: bool = True,
) -> dict[str, Any]:
    """verl batch layout (``DataProto.from_single_dict`` splits tensors from arrays).

    Tensors ``[B, P]`` / ``[B, R]`` / ``[B, P+R]``: ``prompts`` (left-padded), ``responses``
    (right-padded), ``response_mask`` (loss mask, multi-turn: 0 on tool/observation
    tokens), ``input_ids``, ``attention_mask``, ``position_ids``, ``old_log_probs`` and
    ``rollout_log_probs`` (the recorded logprobs: what verl's ``ppo_loss`` reads as
    ``old_log_prob``, and what its rollout correction compares against), ``rm_scores``,
    ``token_level_scores`` / ``token_level_rewards`` (= ``rm_scores``), ``advantages``,
    ``returns`` (the rows' GAE returns, else the advantages, as verl's GRPO sets them).
    numpy object arrays: ``uid`` (= group_id), ``episode_id``, ``segment_index``.

    :param old_log_probs: ``False`` leaves ``old_log_probs`` / ``rollout_log_probs`` out
        (verl's actor then computes them with ``compute_log_prob``); with ``True`` (default)
        rows without recorded logprobs are refused (:func:`require_logprobs`).
    :raises ExportError: no rows, missing logprobs, a row longer than a limit (rows
        are never truncated).
    """
    if not rows:
        raise ExportError("to_verl: no rows")
    if old_log_probs:
        require_logprobs(rows, "to_verl")
    p = _width(rows, "prompt_ids", max_prompt_len)
    r = _width(rows, "response_ids", max_response_len)
    prompts = _padded([x["prompt_ids"] for x in rows], p, torch.long, pad_token_id, left=True)
    prompt_attn = _padded([[1] * len(x["prompt_ids"]) for x in rows], p, torch.long, left=True)
    response_attn = _padded([[1] * len(x["response_ids"]) for x in rows], r, torch.long)
    attention = torch.cat([prompt_attn, response_attn], dim=1)
    responses = _padded([x["response_ids"] for x in rows], r, torch.long, pad_token_id)
    scores = _padded([token_rewards(x) for x in rows], r, torch.float32)
    advantages = _padded([x["advantages"] for x in rows], r, torch.float32)
    out: dict[str, Any] = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": _padded([effective_mask(x) for x in rows], r, torch.long),
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "rm_scores": scores,
        "token_level_scores": scores.clone(),
        "token_level_rewards": scores.clone(),
        "advantages": advantages,
        "returns": _padded([x["returns"] for x in rows], r, torch.float32)
        if all(x.get("returns") is not None for x in rows) else advantages.clone(),
        "uid": np.array([str(x["group_id"]) for x in rows], dtype=object),
        "episode_id": np.array([str(x["episode_id"]) for x in rows], dtype=object),
        "segment_index": np.array([int(x["segment_index"]) for x in rows], dtype=object),
    }
    if old_log_probs:
        logprobs = _padded([x["rollout_logprobs"] for x in rows], r, torch.float32)
        out["old_log_probs"] = logprobs
        out["rollout_log_probs"] = logprobs.clone()
    return out


_TOOL_CALL = pa.struct([
    pa.field("id", pa.string()), pa.field("type", pa.string()),
    pa.field("function", pa.struct([pa.field("name", pa.string()),
                                    pa.field("arguments", pa.string())])),
])
_MESSAGE = pa.struct([
    pa.field("role", pa.string()), pa.field("content", pa.string()),
    pa.field("tool_calls", pa.list_(_TOOL_CALL)), pa.field("tool_call_id", pa.string()),
    pa.field("reasoning_content", pa.string()),
    pa.field("extra_json", pa.string()),  # any other key of the message, verbatim (JSON)
])
_MODELLED = frozenset({"role", "content", "tool_calls", "tool_call_id", "reasoning_content"})
VERL_PARQUET_SCHEMA = pa.schema([
    pa.field("data_source", pa.string()),
    pa.field("prompt", pa.list_(_MESSAGE)),
    pa.field("tools", pa.string()),
    pa.field("ability", pa.string()),
    pa.field("reward_model", pa.struct([pa.field("style", pa.string()),
                                        pa.field("ground_truth", pa.string())])),
    pa.field("extra_info", pa.struct([
        pa.field("split", pa.string()), pa.field("index", pa.int64()),
        pa.field("group_id", pa.string()), pa.field("episode_id", pa.string()),
        pa.field("segment_index", pa.int32()), pa.field("prompt_tokens", pa.int32()),
    ])),
    pa.field("uid", pa.string()),
    pa.field("episode_reward", pa.float32()),
    pa.field("prompt_ids", pa.list_(pa.int32())),
    pa.field("response_ids", pa.list_(pa.int32())),
    pa.field("response_mask", pa.list_(pa.int8())),
    pa.field("rollout_log_probs", pa.list_(pa.float32())),
    pa.field("advantages", pa.list_(pa.float32())),
])


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _tool_call(call: Any) -> dict[str, Any]:
    call = call if isinstance(call, dict) else {}
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    return {"id": _text(call.get("id")), "type": str(call.get("type", "function")),
            "function": {"name": _text(fn.get("name")), "arguments": _text(fn.get("arguments"))}}


def _message(m: dict[str, Any]) -> dict[str, Any]:
    extra = {k: v for k, v in m.items() if k not in _MODELLED}
    calls = m.get("tool_calls")
    return {"role": str(m.get("role", "")), "content": _text(m.get("content")),
            "tool_calls": [_tool_call(c) for c in calls] if isinstance(calls, list) else None,
            "tool_call_id": _text(m.get("tool_call_id")),
            "reasoning_content": _text(m.get("reasoning_content")),
            "extra_json": json.dumps(extra, ensure_ascii=False) if extra else None}


def _prompt_messages(row: Row) -> list[dict[str, Any]]:
    """The row's prompt (``prompt_json``: the chat-template messages its ``prompt_ids`` were
    rendered from) in the parquet's message struct."""
    where = f"episode {row['episode_id']!r} segment {row['segment_index']}"
    raw = row.get("prompt_json")
    if not raw:
        raise ExportError(f"to_verl_parquet: {where} has no prompt_json (export it "
                              "without --no-prompts)")
    try:
        messages = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ExportError(f"to_verl_parquet: {where}: prompt_json is not JSON "
                              f"(line {exc.lineno} column {exc.colno})") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ExportError(f"to_verl_parquet: {where}: prompt_json is not a message list")
    return [_message(m) for m in messages]


def to_verl_parquet(rows: Sequence[Row], path: str | Path, split: str = "train") -> None:
    """Write a Parquet file that verl's ``RLHFDataset`` loads and replay code can train on.

    ``data_source`` / ``prompt`` / ``ability`` / ``reward_model`` / ``extra_info`` follow
    verl's dataset convention. ``prompt`` is the row's prompt — the messages its
    ``prompt_ids`` were rendered from (``prompt_json``), tool calls and tool results
    included (``arguments`` as JSON text; keys not modelled kept in ``extra_json``) —
    and ``tools`` the prompt's tool schemas (JSON text; verl takes tool schemas from its
    tool config, so set them there for fresh rollouts). ``extra_info.prompt_tokens`` is
    ``len(prompt_ids)``: set ``data.max_prompt_length`` at least to its maximum, or
    verl's ``filter_overlong_prompts`` drops the row (default 1024).

    The training payload is the pre-tokenized columns ``prompt_ids``, ``response_ids``,
    ``response_mask`` (loss mask), ``rollout_log_probs``, ``advantages`` with ``uid`` =
    group_id (build tensors with :func:`to_verl`); ``rollout_log_probs`` is null for a row
    without recorded logprobs (never zeros). Re-tokenizing ``prompt`` would drift
    from the sampled tokens. ``reward_model.style`` is ``"replay"``: the reward is known
    (``ground_truth`` = the episode reward as text, also in ``episode_reward``).
    """
    records = [
        {
            "data_source": VERL_DATA_SOURCE,
            "prompt": _prompt_messages(row),
            "tools": row.get("tools_json"),
            "ability": "agent",
            "reward_model": {"style": "replay", "ground_truth": repr(float(row["episode_reward"]))},
            "extra_info": {"split": split, "index": i, "group_id": str(row["group_id"]),
                           "episode_id": str(row["episode_id"]),
                           "segment_index": int(row["segment_index"]),
                           "prompt_tokens": len(row["prompt_ids"])},
            "uid": str(row["group_id"]),
            "episode_reward": float(row["episode_reward"]),
            "prompt_ids": list(row["prompt_ids"]),
            "response_ids": list(row["response_ids"]),
            "response_mask": effective_mask(row).tolist(),
            "rollout_log_probs": list(row["rollout_logprobs"]) if logprobs_known(row) else None,
            "advantages": list(row["advantages"]),
        }
        for i, row in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(records, schema=VERL_PARQUET_SCHEMA), str(path))


# --------------------------------------------------------------------------- TRL


def to_trl_rollout(rows: Sequence[Row]) -> dict[str, list[list[Any]]]:
    """TRL ``GRPOTrainer(rollout_func=...)`` output, one entry per row.

    ``env_mask`` is 1 on policy-sampled tokens and 0 on tool/observation/glue tokens (and
    everywhere in masked episodes). Maps 1:1 to episodes only when each episode is one row;
    for compacted episodes use :class:`agentcompact.rl.trl.SegmentGRPOTrainer`.

    :raises ExportError: rows without rollout logprobs.
    """
    require_logprobs(rows, "to_trl_rollout")
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

    :raises ExportError: rows without rollout logprobs.
    """
    require_logprobs(rows, "to_skyrl")
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
