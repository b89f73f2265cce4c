"""RL training data: the segment-row schema, advantages, GAE, loss aggregation, adapters.

The numpy parts (private modules ``_schema``, ``_advantages``, ``_gae``, ``_loss``) are
re-exported here::

    from agentcompact.rl import grpo_advantages, broadcast_to_segments, validate_rows

the row schema (``SEGMENT_SCHEMA``, ``EPISODE_SCHEMA``, ``validate_rows``, ``read_rows``,
JSONL / Parquet writers; pyarrow, ``export`` extra), GRPO / Dr.GRPO / RLOO over episodes,
verl GAE, chain and truncated-chain GAE, whitening, and the five aggregation modes as
per-token weights. The torch pieces are public modules of their own, not imported here, so
this package works without torch:

* :mod:`agentcompact.rl.torch_data` — ``SegmentDataset``, ``collate`` (``rl`` extra).
* :mod:`agentcompact.rl.ppo` — ``policy_loss``, ``policy_loss_from_hidden``, ``collate_step``.
* :mod:`agentcompact.rl.logprobs`, :mod:`agentcompact.rl.recompute` — log-probabilities.
* :mod:`agentcompact.rl.adapters` — verl / TRL / SkyRL layouts; :mod:`agentcompact.rl.trl`.
* :mod:`agentcompact.rl.rollout` — compaction inside a trainer's rollout loop (``export``
  extra, no torch); :mod:`agentcompact.rl.generate` (a transformers sampler),
  :mod:`agentcompact.rl.skyrl`, :mod:`agentcompact.rl.verl` — the trainers' loops on it.

The math, with worked numbers, is in ``docs/rl-math.md``.
"""

from __future__ import annotations

from agentcompact.rl._advantages import (
    assign_advantages,
    broadcast_to_segments,
    drgrpo_advantages,
    grpo_advantages,
    rloo_advantages,
)
from agentcompact.rl._gae import assign_gae, chain_gae, gae, masked_whiten, truncated_chain_gae
from agentcompact.rl._loss import LOSS_MODES, aggregate, token_weights, weights_for_rows
from agentcompact.rl._schema import (
    EPISODE_SCHEMA,
    SCHEMA_VERSION,
    SEGMENT_SCHEMA,
    SegmentRowError,
    read_rows,
    validate_rows,
    write_jsonl,
    write_parquet,
)

__all__ = [
    "EPISODE_SCHEMA",
    "LOSS_MODES",
    "SCHEMA_VERSION",
    "SEGMENT_SCHEMA",
    "SegmentRowError",
    "aggregate",
    "assign_advantages",
    "assign_gae",
    "broadcast_to_segments",
    "chain_gae",
    "drgrpo_advantages",
    "gae",
    "grpo_advantages",
    "masked_whiten",
    "read_rows",
    "rloo_advantages",
    "token_weights",
    "truncated_chain_gae",
    "validate_rows",
    "weights_for_rows",
    "write_jsonl",
    "write_parquet",
]
