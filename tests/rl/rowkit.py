"""Builders of valid segment rows for the rl tests (no expected numbers live here)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentcompact.rl import SCHEMA_VERSION

__all__ = ["QWEN_TOKENIZER", "make_episode", "make_row"]

#: Same location as tests/conftest.py: ../shared/data beside the project root.
_SHARED = Path(os.environ.get("AGENTCOMPACT_SHARED_DATA",
                              Path(__file__).resolve().parents[3] / "shared" / "data"))
QWEN_TOKENIZER = _SHARED / "tokenizers" / "qwen2.5-coder-0.5b-instruct"


def make_row(**fields: Any) -> dict[str, Any]:
    """One-segment, valid row; ``fields`` override the defaults (lengths are not re-derived)."""
    row: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "group_id": "g0",
        "episode_id": "e0",
        "sample_index": 0,
        "segment_index": 0,
        "num_segments": 1,
        "is_last_segment": True,
        "prompt_ids": [11, 12, 13],
        "response_ids": [21, 22, 23],
        "response_mask": [1, 0, 1],
        "rollout_logprobs": [-0.5, 0.0, -0.25],
        "summary_span": [],
        "summary_trained": False,
        "compaction_trigger": "none",
        "episode_reward": 1.0,
        "segment_reward": 0.0,
        "stop_reason": "complete",
        "mask_episode": False,
        "loss_weight": 1.0,
        "episode_num_loss_tokens": 2,
        "episode_num_segments": 1,
        "policy_version": 7,
        "tokenizer_name": "toy",
        "tokenizer_sha256": "a" * 64,
        "chat_template_sha256": "b" * 64,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs_mode": "raw"},
        "messages_json": None,
        "prompt_json": None,
        "tools_json": None,
        "segment_break": None,
        "advantages": [0.0, 0.0, 0.0],
    }
    row.update(fields)
    return row


def make_episode(
    episode_id: str,
    masks: Sequence[Sequence[int]],
    *,
    group_id: str = "g0",
    sample_index: int = 0,
    reward: float = 1.0,
    mask_episode: bool = False,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Valid rows of one episode with one segment per entry of ``masks``.

    Token ids and logprobs are random (seeded); logprobs are float32 values, 0.0 on mask 0.
    """
    rng = np.random.default_rng(seed)
    k = len(masks)
    n_loss = sum(sum(m) for m in masks)
    rows = []
    for i, mask in enumerate(masks):
        lp = np.where(np.asarray(mask) == 1, -rng.uniform(0.01, 3.0, len(mask)), 0.0)
        rows.append(make_row(
            group_id=group_id,
            episode_id=episode_id,
            sample_index=sample_index,
            segment_index=i,
            num_segments=k,
            is_last_segment=i == k - 1,
            prompt_ids=rng.integers(0, 1000, int(rng.integers(1, 6))).tolist(),
            response_ids=rng.integers(0, 1000, len(mask)).tolist(),
            response_mask=list(mask),
            rollout_logprobs=lp.astype(np.float32).tolist(),
            compaction_trigger="token_budget" if i < k - 1 else "none",
            stop_reason="compacted" if i < k - 1 else "complete",
            episode_reward=reward,
            mask_episode=mask_episode,
            episode_num_loss_tokens=n_loss,
            episode_num_segments=k,
            advantages=[0.0] * len(mask),
        ))
    return rows
