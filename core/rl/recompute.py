"""Rollout logprobs recomputed with a Hugging Face causal LM (``--recompute-logprobs MODEL``).

When the serving engine did not report logprobs (OpenAI-compatible APIs without
``logprobs``, imported trajectories), the PPO ratio has no denominator. This fills
``rollout_logprobs`` on every sampled (mask-1) token with ``log π(y_t | y_<t)`` of the given
model — the policy that produced the rows, or the one starting training from them — and
sets ``sampling.logprobs_mode`` to ``"recomputed"``; mask-0 tokens keep 0.0.

Rows are packed into batches of at most ``batch_tokens`` prompt+response tokens (a longer
row is a batch of its own), run under ``torch.no_grad`` on ``device``, and the log
probabilities are read at the sampled positions only, in chunks
(:func:`agentcompact.rl.logprobs.chosen_logprobs`): never a ``T × V`` softmax.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from agentcompact.errors import ConfigError
from agentcompact.rl.logprobs import chosen_logprobs, chosen_logprobs_from_logits
from agentcompact.rl.torch_data import Row, collate

__all__ = ["LogprobRecomputer", "RECOMPUTED"]

#: ``sampling.logprobs_mode`` of recomputed rows
RECOMPUTED = "recomputed"


class LogprobRecomputer:
    """Fill rows' ``rollout_logprobs`` with a causal LM's log-probabilities.

    :param model: a Hugging Face causal LM, or a name / local path to load one from
        (``AutoModelForCausalLM``, float32, no hub access needed for a local path).
    :param batch_tokens: tokens per forward pass.
    :param device: where the model runs (``"cpu"``, ``"cuda"``...).
    """

    def __init__(self, model: Any, *, batch_tokens: int = 16384,
                 device: str | torch.device = "cpu") -> None:
        if batch_tokens < 1:
            raise ConfigError(f"batch_tokens must be >= 1, got {batch_tokens}")
        if isinstance(model, (str, os.PathLike)):
            model = _load(str(model))
        self.name = str(getattr(getattr(model, "config", None), "_name_or_path", "") or model)
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.batch_tokens = batch_tokens
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])

    def __call__(self, rows: Sequence[Row]) -> list[dict[str, Any]]:
        """Copies of ``rows`` with recomputed ``rollout_logprobs`` (float32 arrays)."""
        out: list[dict[str, Any]] = [dict(r) for r in rows]
        for batch in self._batches(out):
            self._fill([out[i] for i in batch])
        return out

    def _batches(self, rows: Sequence[Row]) -> list[list[int]]:
        order = sorted(range(len(rows)), key=lambda i: _length(rows[i]))
        batches: list[list[int]] = []
        width = 0
        for i in order:
            n = _length(rows[i])
            if batches and max(width, n) * (len(batches[-1]) + 1) <= self.batch_tokens:
                batches[-1].append(i)
                width = max(width, n)
            else:
                batches.append([i])
                width = n
        return batches

    def _fill(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            top = max([*r["prompt_ids"], *r["response_ids"]], default=0)
            if top >= self.vocab:
                raise ConfigError(f"episode {r['episode_id']!r} segment {r['segment_index']}: "
                                  f"token id {top} >= the model's vocabulary ({self.vocab}): "
                                  "not the model of this tokenizer")
        batch = collate(rows, pad_token_id=0)
        with torch.no_grad():
            logp, owner, _ = self._logprobs(batch)
        values = logp.float().cpu().numpy()
        which = owner.cpu().numpy()
        for b, r in enumerate(rows):
            mask = np.asarray(r["response_mask"], dtype=bool)
            lp = np.zeros(len(mask), dtype=np.float32)
            lp[mask] = np.minimum(values[which == b], 0.0)
            r["rollout_logprobs"] = lp
            r["sampling"] = dict(r["sampling"], logprobs_mode=RECOMPUTED)

    def _logprobs(self, batch: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        inputs = {k: batch[k].to(self.device)
                  for k in ("input_ids", "attention_mask", "position_ids")}
        body = getattr(self.model, "model", None)
        head = self.model.get_output_embeddings()
        if body is not None and getattr(head, "bias", None) is None:
            hidden = body(**inputs).last_hidden_state
            return chosen_logprobs(hidden, head.weight, batch, mask_key="response_mask")
        logits = self.model(**inputs).logits
        return chosen_logprobs_from_logits(logits, batch, mask_key="response_mask")


def _length(row: Row) -> int:
    return len(row["prompt_ids"]) + len(row["response_ids"])


def _load(name: str) -> Any:
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise ConfigError("--recompute-logprobs needs transformers (the `hf` extra)") from exc
    try:
        return AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--recompute-logprobs: cannot load model {name!r}: "
                          f"{type(exc).__name__}") from None
