"""The dataset card written next to an export's shards (``README.md``): what each field is.

:data:`SEGMENT_FIELDS` and :data:`EPISODE_FIELDS` describe every column of
``SEGMENT_SCHEMA`` / ``EPISODE_SCHEMA`` (a test checks none is missing);
:func:`dataset_card` renders them with the export's manifest as a Hugging Face style card
(YAML header with the data files, then the field tables and the counts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentcompact.rl._schema import EPISODE_SCHEMA, SCHEMA_VERSION, SEGMENT_SCHEMA

__all__ = ["EPISODE_FIELDS", "SEGMENT_FIELDS", "dataset_card"]

SEGMENT_FIELDS: dict[str, str] = {
    "schema_version": f"`{SCHEMA_VERSION}`",
    "group_id": "the task: GRPO group (verl `uid`, SkyRL `instance_id`)",
    "episode_id": "one rollout (all its segments share it)",
    "sample_index": "repetition of the task within the group (SkyRL `repetition_id`)",
    "segment_index": "0-based position of the segment in its episode, no gaps",
    "num_segments": "segments of the episode",
    "is_last_segment": "true on the episode's last segment only",
    "prompt_ids": "token ids at the segment start: system, task, previous summary, kept turns",
    "response_ids": "everything after the prompt: sampled tokens, tool results, template "
                    "glue, a trained summary request and summary",
    "response_mask": "1 where the policy sampled the token (stop token included), else 0",
    "rollout_logprobs": "log-probability of each sampled token under the sampling policy; "
                        "0.0 where the mask is 0; placeholders (all 0.0) when "
                        "`sampling.logprobs_mode` is `none` — the loss and adapters refuse "
                        "those rows",
    "summary_span": "`[start, end)` of a policy-written summary in `response_ids` (empty: none)",
    "summary_trained": "the summary tokens have mask 1 (written by the policy, SUPO-style)",
    "compaction_trigger": "why the segment was compacted: token_budget / turn_limit / "
                          "model_initiated; `none` when it was not",
    "episode_reward": "outcome reward of the episode, on every segment",
    "segment_reward": "process reward of the segment (0 unless given)",
    "stop_reason": "compacted (a compaction ended it) / prefix_break (the next context did "
                   "not extend it, see `segment_break`) on earlier segments; complete / "
                   "context_length / max_turns / timeout / error on the last",
    "mask_episode": "the whole episode has zero loss (failed, overlong, incomplete)",
    "loss_weight": "relative weight of the row in the loss (default 1)",
    "episode_num_loss_tokens": "mask-1 tokens over all segments of the episode",
    "episode_num_segments": "segments of the episode (= num_segments)",
    "policy_version": "version of the weights that sampled it",
    "tokenizer_name": "the trainer tokenizer the ids are for",
    "tokenizer_sha256": "hash of that tokenizer: reject the rows on a mismatch",
    "chat_template_sha256": "hash of its chat template: reject the rows on a mismatch",
    "sampling": "temperature, top_p, top_k and logprobs_mode (raw / recomputed / none)",
    "messages_json": "the segment's chat messages (`--messages`, debugging only)",
    "prompt_json": "the chat-template messages `prompt_ids` were rendered from (JSON)",
    "tools_json": "the tool schemas of the prompt (JSON), null without tools",
    "segment_break": "why the segment ended: compaction / tokens / template / context / "
                     "source; null on the last segment",
    "advantages": "per response token; 0.0 where the mask is 0 or the episode is masked",
    "returns": "GAE returns (gae-* modes), else null",
}

EPISODE_FIELDS: dict[str, str] = {
    "schema_version": f"`{SCHEMA_VERSION}`",
    "group_id": "the task",
    "episode_id": "the rollout",
    "sample_index": "repetition within the group",
    "episode_reward": "outcome reward",
    "stop_reason": "how the episode ended",
    "mask_episode": "zero loss on all its segments",
    "num_segments": "rows of the episode in the segment shards",
    "num_compactions": "compactions during the episode",
    "num_loss_tokens": "mask-1 tokens over its segments",
    "num_response_tokens": "response tokens over its segments",
    "max_working_context": "longest prompt + response of its segments",
    "policy_version": "weights that sampled it",
}


def _table(schema: Any, docs: Mapping[str, str]) -> list[str]:
    lines = ["| field | type | meaning |", "|---|---|---|"]
    for f in schema:
        null = " (nullable)" if f.nullable else ""
        lines.append(f"| `{f.name}` | `{f.type}`{null} | {docs[f.name]} |")
    return lines


def dataset_card(manifest: Mapping[str, Any]) -> str:
    """The card's markdown for an export whose manifest is ``manifest``."""
    ext = manifest.get("format", "parquet")
    counts = manifest.get("counts", {})
    lines = [
        "---",
        "configs:",
        "- config_name: segments",
        f"  data_files: segments-*.{ext}",
        "- config_name: episodes",
        f"  data_files: episodes.{ext}",
        "tags: [reinforcement-learning, agents, agentcompact]",
        "---",
        "",
        f"# RL segment rows (`{SCHEMA_VERSION}`)",
        "",
        "One row per working-context window (segment) of an agent episode, written by "
        "`agentcompact export`. Rows of an episode are contiguous and in order, episodes of a "
        "group are contiguous, a shard never splits a group. Format, math and trainer "
        "recipes: agentcompact's docs/rl-export.md and docs/rl-math.md.",
        "",
        f"- tokenizer: `{manifest.get('tokenizer', {}).get('tokenizer_name')}`",
        f"- advantage: `{json.dumps(manifest.get('advantage'))}`",
        f"- logprobs: `{json.dumps(manifest.get('logprobs'))}`",
        f"- counts: `{json.dumps(counts)}`",
        "",
        "## Segment rows (`segments-*`)",
        "",
        *_table(SEGMENT_SCHEMA, SEGMENT_FIELDS),
        "",
        f"## Episodes (`episodes.{ext}`)",
        "",
        *_table(EPISODE_SCHEMA, EPISODE_FIELDS),
        "",
    ]
    return "\n".join(lines)
