"""TRL ``GRPOTrainer`` on exported segment rows: one compacted episode = one group member.

TRL's ``rollout_func(prompts, trainer)`` returns one completion per prompt, and GRPO groups
``num_generations`` consecutive completions. A compacted episode has several rows (one per
working-context window), so its rows cannot be one TRL completion. :class:`SegmentGRPOTrainer`
keeps TRL's contract at the prompt level — each prompt of the generation batch is one group
member, its ``rollout_func`` returns the rows of that member's episode — and replaces only
``_generate_and_score_completions``: every segment of every episode becomes one sequence
of the batch, so an episode's segments are trained in the same optimizer step, with the
rows' stored advantages (GRPO over *episodes*, broadcast to their segments) and rollout
logprobs as ``old_per_token_logps``. TRL's loss, clipping, gradient accumulation and
logging run unchanged (TRL accepts ``[B, T]`` advantages from subclasses).

The ``rollout_func`` contract: return :func:`to_trl_episodes` of the segment rows for the
prompts, in prompt order (TRL's required keys ``prompt_ids`` / ``completion_ids`` /
``logprobs`` plus ``env_mask``, ``advantages``, ``episode_id``, ``prompt_index``)::

    def rollout_func(prompts, trainer):
        rows = [r for i, p in enumerate(prompts) for r in rows_of_member(p, i)]
        return to_trl_episodes(rows, prompt_index=...)   # or simply to_trl_episodes(rows)

    trainer = SegmentGRPOTrainer(model=model, reward_funcs=unused_reward, args=GRPOConfig(
        loss_type="dapo", beta=0.0, num_generations=G, steps_per_generation=1, ...),
        train_dataset=prompts_dataset, processing_class=tok, rollout_func=rollout_func)

Use ``loss_type="dapo"`` (token-mean over the whole generation batch, gathered across
processes: the global token normalizer of docs/rl-math.md) and ``beta=0.0`` (no reference
model: its logprobs are not computed here). ``reward_funcs`` are not called: the rows carry
their advantages. Needs ``trl`` (``pip install trl``); imported only by this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from trl.trainer.grpo_trainer import GRPOTrainer

from agentcompact.errors import ConfigError, ExportError
from agentcompact.rl._loss import effective_mask
from agentcompact.rl.adapters import require_logprobs
from agentcompact.rl.torch_data import Row, pad_rows

__all__ = ["SegmentGRPOTrainer", "to_trl_episodes", "trl_batch"]


def to_trl_episodes(rows: Sequence[Row], prompt_index: Sequence[int] | None = None
                    ) -> dict[str, list[Any]]:
    """The ``rollout_func`` output for :class:`SegmentGRPOTrainer`: one entry per segment row.

    :param prompt_index: the prompt (group member) of each row; default: one member per
        episode, numbered in row order.
    :raises ExportError: rows without rollout logprobs.
    """
    require_logprobs(rows, "to_trl_episodes")
    if prompt_index is None:
        order: dict[str, int] = {}
        prompt_index = [order.setdefault(str(r["episode_id"]), len(order)) for r in rows]
    return {
        "prompt_ids": [list(r["prompt_ids"]) for r in rows],
        "completion_ids": [list(r["response_ids"]) for r in rows],
        "logprobs": [list(r["rollout_logprobs"]) for r in rows],
        "env_mask": [effective_mask(r).tolist() for r in rows],
        "advantages": [list(r["advantages"]) for r in rows],
        "episode_id": [str(r["episode_id"]) for r in rows],
        "prompt_index": list(prompt_index),
    }


def trl_batch(output: dict[str, list[Any]], pad_token_id: int,
              device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """TRL's training-batch tensors from a :func:`to_trl_episodes` dict: left-padded
    ``prompt_ids`` / ``prompt_mask``, right-padded ``completion_ids`` / ``completion_mask``,
    ``tool_mask`` (the loss mask), ``[B, T]`` ``advantages``, ``old_per_token_logps``."""
    prompts, completions = output["prompt_ids"], output["completion_ids"]
    if not prompts:
        raise ExportError("trl_batch: no rows")
    p = max(len(x) for x in prompts)
    r = max(len(x) for x in completions)
    left = [p - len(x) for x in prompts]
    zeros = [0] * len(completions)

    def resp(values: Sequence[Sequence[float]], dtype: torch.dtype) -> torch.Tensor:
        return pad_rows(values, zeros, r, dtype).to(device)

    return {
        "prompt_ids": pad_rows(prompts, left, p, torch.long, pad_token_id).to(device),
        "prompt_mask": pad_rows([[1] * len(x) for x in prompts], left, p, torch.long).to(device),
        "completion_ids": pad_rows(completions, zeros, r, torch.long, pad_token_id).to(device),
        "completion_mask": resp([[1] * len(x) for x in completions], torch.long),
        "tool_mask": resp(output["env_mask"], torch.long),
        "advantages": resp(output["advantages"], torch.float32),
        "old_per_token_logps": resp(output["logprobs"], torch.float32),
    }


class SegmentGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose ``rollout_func`` returns :func:`to_trl_episodes` rows (see the
    module docstring for the contract)."""

    def _generate_and_score_completions(
        self, inputs: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor | Any]:
        if self.rollout_func is None:
            raise ConfigError("SegmentGRPOTrainer needs rollout_func (to_trl_episodes rows)")
        if self.beta != 0.0 or self.use_vllm:
            raise ConfigError("SegmentGRPOTrainer: set beta=0.0 and use_vllm=False (reference "
                              "and vLLM logprobs are not computed for stored rows)")
        prompts = [x["prompt"] for x in inputs]
        output = self.rollout_func(prompts, self)
        members = sorted(set(output.get("prompt_index", [])))
        if members != list(range(len(prompts))):
            raise ExportError(f"rollout_func: rows cover prompts {members[:8]}, expected "
                                  f"each of 0..{len(prompts) - 1} (one episode per prompt)")
        training = bool(getattr(self.model, "training", True))
        steps = int(getattr(self.args, "steps_per_generation", 1)) if training else 1
        if len(output["prompt_ids"]) % steps:
            raise ConfigError(f"{len(output['prompt_ids'])} segment rows do not split into "
                              f"steps_per_generation={steps} equal parts (set it to 1)")
        pad = getattr(self.processing_class, "pad_token_id", None)
        if pad is None:
            raise ConfigError("SegmentGRPOTrainer: the processing_class has no pad_token_id")
        batch: dict[str, Any] = trl_batch(output, pad, self.accelerator.device)
        loss_tokens = batch["tool_mask"].sum()
        batch["num_items_in_batch"] = self.accelerator.gather(loss_tokens).sum()
        return batch
