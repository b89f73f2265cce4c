"""Sampling a Hugging Face causal LM in process, for :mod:`agentcompact.rl.rollout`.

:class:`TransformersSampler` is a rollout ``Sampler`` that runs ``model.generate`` on the
weights the model has now (a trainer's policy between optimizer steps: no weight sync to
do). Each sampled token's logprob is ``log_softmax(logits / temperature)`` at it: what a
trainer recomputes at the sampling temperature (``logprobs_mode`` ``processed``; the same
as ``raw`` at temperature 1). Needs torch and transformers (the ``rl`` extra).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import torch

from agentcompact.errors import ConfigError
from agentcompact.rl.rollout import Sample, SamplingSettings

__all__ = ["TransformersSampler"]


class TransformersSampler:
    """Sample ``model`` with ``generate`` (one prompt at a time, under a lock: the model is
    shared with the trainer).

    :param model: a Hugging Face causal LM.
    :param eos_token_ids: the ids that end a response (the chat template's end-of-turn).
    :param pad_token_id: the padding id ``generate`` needs.
    """

    def __init__(self, model: Any, *, eos_token_ids: Sequence[int], pad_token_id: int) -> None:
        if not eos_token_ids:
            raise ConfigError("TransformersSampler needs at least one eos token id")
        self.model = model
        self.eos = [int(t) for t in eos_token_ids]
        self.pad = int(pad_token_id)
        self._lock = threading.Lock()

    async def __call__(self, prompt_ids: list[int], settings: SamplingSettings) -> Sample:
        return await asyncio.to_thread(self.sample, prompt_ids, settings)

    def sample(self, prompt_ids: list[int], settings: SamplingSettings) -> Sample:
        """The sampled ids, their logprobs and why sampling stopped."""
        from transformers import GenerationConfig

        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        greedy = settings.temperature <= 0
        config = GenerationConfig(  # type: ignore[no-untyped-call]  # transformers' own
            max_new_tokens=settings.max_tokens, do_sample=not greedy,
            temperature=None if greedy else settings.temperature,
            top_p=None if greedy else settings.top_p,
            top_k=None if greedy else (settings.top_k if settings.top_k > 0 else 0),
            eos_token_id=self.eos, pad_token_id=self.pad,
            return_dict_in_generate=True, output_logits=True)
        with self._lock, torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                      generation_config=config)
        new = out.sequences[0, len(prompt_ids):].tolist()
        logits = torch.stack(out.logits, dim=1)[0, : len(new)].float()
        if not greedy:
            logits = logits / settings.temperature
        chosen = torch.log_softmax(logits, dim=-1).gather(
            -1, torch.tensor(new, device=logits.device)[:, None]).squeeze(-1)
        stop = "stop" if new and new[-1] in self.eos else "length"
        return Sample(new, chosen.tolist(), stop, logprobs_mode="processed")
