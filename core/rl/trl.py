"""TRL ``GRPOTrainer`` on compacted episodes: one compacted episode = one group member.

TRL's ``rollout_func(prompts, trainer)`` returns one completion per prompt, and GRPO groups
``num_generations`` consecutive completions. A compacted episode has several rows (one per
working-context window), so its rows cannot be one TRL completion. :class:`SegmentGRPOTrainer`
keeps TRL's contract at the prompt level — each prompt of the generation batch is one group
member, its ``rollout_func`` returns the rows of that member's episode — and replaces only
``_generate_and_score_completions``: every segment of every episode becomes one sequence
of the batch, with the rows' stored advantages (GRPO over *episodes*, broadcast to their
segments) and rollout logprobs as ``old_per_token_logps``. TRL's loss, clipping, gradient
accumulation and logging run unchanged (TRL accepts ``[B, T]`` advantages from subclasses).
The batch is padded with zero-mask rows to a multiple of ``steps_per_generation`` (TRL
splits a generation batch into that many equal slices); a padding row has no loss token, so
the loss (``dapo``: normalized by the generation batch's loss tokens) is unchanged.

:func:`compacting_rollout_func` is the ``rollout_func`` that runs the compacting agent
(:class:`~agentcompact.rl.rollout.CompactingRollout`) with the trainer's *current* weights:

* ``use_vllm=True``: TRL syncs the weights into vLLM first (``VLLMGeneration.sync_weights``,
  called by :class:`SegmentGRPOTrainer` whenever the step changed: TRL's own sync code),
  then every model call samples vLLM — colocate mode through the process's own ``LLM``,
  server mode through a ``VLLMClient`` of the process (token ids in, ids and logprobs out);
* otherwise ``model.generate`` on the unwrapped policy (``unwrap_model_for_generation``,
  :class:`~agentcompact.rl.generate.TransformersSampler`).

vLLM is not installable on the machine these modules are tested on: the transformers path
is tested, the vLLM path is not (``docs/trainers.md``). The contract of a ``rollout_func``
written by hand: return :func:`to_trl_episodes` of the segment rows for the prompts, in
prompt order (TRL's required keys ``prompt_ids`` / ``completion_ids`` / ``logprobs`` plus
``env_mask``, ``advantages``, ``episode_id``, ``prompt_index``)::

    trainer = SegmentGRPOTrainer(model=model, reward_funcs=unused_reward, args=GRPOConfig(
        loss_type="dapo", beta=0.0, num_generations=G, ...), train_dataset=prompts_dataset,
        processing_class=tok, rollout_func=compacting_rollout_func(rollout, make_env))

Use ``loss_type="dapo"`` (token-mean over the whole generation batch, gathered across
processes: the global token normalizer of docs/rl-math.md) and ``beta=0.0`` (no reference
model: its logprobs are not computed here). ``reward_funcs`` are not called: the rows carry
their advantages. Needs ``trl`` (``pip install trl``); imported only by this module.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from trl.trainer.grpo_trainer import GRPOTrainer

from agentcompact.errors import ConfigError, ExportError
from agentcompact.rl._loss import effective_mask
from agentcompact.rl.adapters import require_logprobs
from agentcompact.rl.generate import TransformersSampler
from agentcompact.rl.rollout import (
    CompactingRollout,
    Environment,
    Sample,
    Sampler,
    SamplingSettings,
)
from agentcompact.rl.torch_data import Row, pad_rows
from agentcompact.trajectory import EpisodeRows

__all__ = ["SegmentGRPOTrainer", "VLLMSampler", "compacting_rollout_func", "pad_episodes",
           "to_trl_episodes", "trl_batch"]

#: what ``make_env`` returns for one prompt: its task messages, environment and tools
Task = tuple[Sequence[dict[str, Any]], Environment, "list[dict[str, Any]] | None"]


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


def pad_episodes(output: dict[str, list[Any]], multiple: int, pad_token_id: int
                 ) -> dict[str, list[Any]]:
    """``output`` with zero-mask rows appended up to a multiple of ``multiple`` rows (a
    padding row: one pad token of prompt and of completion, mask 0, advantage 0)."""
    missing = -len(output["prompt_ids"]) % multiple
    if not missing:
        return output
    filler = {"prompt_ids": [pad_token_id], "completion_ids": [pad_token_id],
              "logprobs": [0.0], "env_mask": [0], "advantages": [0.0], "episode_id": "",
              "prompt_index": -1}
    return {key: [*values, *([filler[key]] * missing if key in filler else [None] * missing)]
            for key, values in output.items()}


class SegmentGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose ``rollout_func`` returns :func:`to_trl_episodes` rows (see the
    module docstring for the contract)."""

    def _generate_and_score_completions(
        self, inputs: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor | Any]:
        if self.rollout_func is None:
            raise ConfigError("SegmentGRPOTrainer needs rollout_func (to_trl_episodes rows, "
                              "e.g. compacting_rollout_func)")
        if self.beta != 0.0:
            raise ConfigError("SegmentGRPOTrainer: set beta=0.0 (reference logprobs are not "
                              "computed for stored rows)")
        self._sync_vllm()
        prompts = [x["prompt"] for x in inputs]
        output = self.rollout_func(prompts, self)
        members = sorted(set(output.get("prompt_index", [])))
        if members != list(range(len(prompts))):
            raise ExportError(f"rollout_func: rows cover prompts {members[:8]}, expected "
                              f"each of 0..{len(prompts) - 1} (one episode per prompt)")
        pad = getattr(self.processing_class, "pad_token_id", None)
        if pad is None:
            raise ConfigError("SegmentGRPOTrainer: the processing_class has no pad_token_id")
        training = bool(getattr(self.model, "training", True))
        steps = int(getattr(self.args, "steps_per_generation", 1)) if training else 1
        batch: dict[str, Any] = trl_batch(pad_episodes(output, steps, pad), pad,
                                          self.accelerator.device)
        if self.use_vllm and getattr(self, "vllm_importance_sampling_correction", False):
            # the old logprobs are the sampler's own: the PPO ratio already corrects for it
            batch["importance_sampling_ratio"] = torch.ones_like(batch["advantages"])
        loss_tokens = batch["tool_mask"].sum()
        batch["num_items_in_batch"] = self.accelerator.gather(loss_tokens).sum()
        return batch

    def _sync_vllm(self) -> None:
        """TRL's weight sync into vLLM, once per optimizer step (as ``GRPOTrainer._generate``
        does before a ``rollout_func``)."""
        if self.use_vllm and self.state.global_step != self._last_loaded_step:
            self.vllm_generation.sync_weights()  # type: ignore[no-untyped-call]  # TRL's
            self._last_loaded_step = self.state.global_step


class VLLMSampler:
    """TRL's vLLM as a rollout sampler: colocate mode samples the process's own ``LLM``,
    server mode the server through a ``VLLMClient`` of this process (no collective: the
    processes' episodes take different numbers of turns). Untested here (no vLLM)."""

    def __init__(self, trainer: Any) -> None:
        self.generation = trainer.vllm_generation
        self.eos = {int(t) for t in _eos_ids(trainer.processing_class)}
        self._client: Any = None
        if self.generation.mode == "colocate" and self.generation.tensor_parallel_size > 1:
            raise ConfigError("compacting_rollout_func: vLLM colocate mode with "
                              "tensor_parallel_size > 1 samples collectively; use 1, or server")

    async def __call__(self, prompt_ids: list[int], settings: SamplingSettings) -> Sample:
        return await asyncio.to_thread(self.sample, prompt_ids, settings)

    def sample(self, prompt_ids: list[int], settings: SamplingSettings) -> Sample:
        if self.generation.mode == "colocate":
            ids, logprobs = self._colocate(prompt_ids, settings)
        else:
            ids, logprobs = self._server(prompt_ids, settings)
        return Sample(ids, logprobs, "stop" if ids and ids[-1] in self.eos else "length")

    def _colocate(self, prompt_ids: list[int], settings: SamplingSettings
                  ) -> tuple[list[int], list[float]]:
        from vllm import SamplingParams

        params = SamplingParams(n=1, temperature=settings.temperature, top_p=settings.top_p,
                                top_k=settings.top_k, max_tokens=settings.max_tokens,
                                logprobs=0)
        out = self.generation.llm.generate([{"prompt_token_ids": prompt_ids}], params,
                                           use_tqdm=False)[0].outputs[0]
        ids = list(out.token_ids)
        return ids, [float(step[token].logprob) for step, token in zip(out.logprobs, ids,
                                                                        strict=True)]

    def _server(self, prompt_ids: list[int], settings: SamplingSettings
                ) -> tuple[list[int], list[float]]:
        if self._client is None:
            from trl.generation.vllm_client import VLLMClient

            g = self.generation
            base = g.server_base_url or f"http://{g.server_host}:{g.server_port}"
            self._client = VLLMClient(base_url=base, connection_timeout=g.server_timeout)
        out = self._client.generate(prompts=[prompt_ids], n=1, temperature=settings.temperature,
                                    top_p=settings.top_p, top_k=max(settings.top_k, 0),
                                    max_tokens=settings.max_tokens, logprobs=0)
        return list(out["completion_ids"][0]), [float(lp[0]) for lp in out["logprobs"][0]]


def _eos_ids(tok: Any) -> list[int]:
    return [int(i) for i in tok.convert_tokens_to_ids([str(tok.eos_token)]) if i is not None]


def _sampler(trainer: Any) -> tuple[Sampler, Any]:
    """The sampler of the trainer's current weights, and the context it samples in."""
    if trainer.use_vllm:
        import contextlib

        return VLLMSampler(trainer), contextlib.nullcontext(None)
    from trl.models.utils import unwrap_model_for_generation

    context = unwrap_model_for_generation(
        trainer.model_wrapped, trainer.accelerator,
        gather_deepspeed3_params=trainer.args.ds3_gather_for_generation)
    return _LazySampler(trainer.processing_class), context


class _LazySampler:
    """A ``TransformersSampler`` of the model the unwrap context yields."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.inner: TransformersSampler | None = None

    def bind(self, model: Any) -> None:
        self.inner = TransformersSampler(model, eos_token_ids=_eos_ids(self.tok),
                                         pad_token_id=int(self.tok.pad_token_id))

    async def __call__(self, prompt_ids: list[int], settings: SamplingSettings) -> Sample:
        assert self.inner is not None, "bind() the unwrapped model first"
        return await self.inner(prompt_ids, settings)


def _group_id(prompt: Any, step: int) -> str:
    digest = hashlib.blake2b(repr(prompt).encode(), digest_size=8).hexdigest()
    return f"{digest}@{step}"


def compacting_rollout_func(rollout: CompactingRollout,
                            make_env: Callable[[Any], Task]) -> Callable[..., dict[str, Any]]:
    """A ``rollout_func`` for :class:`SegmentGRPOTrainer` running ``rollout`` (compaction,
    token in / token out) on each prompt with the trainer's current weights.

    :param make_env: for one prompt of the dataset, ``(messages, environment, tools)``: the
        task's chat messages, a fresh :class:`~agentcompact.rl.rollout.Environment`, the
        tool schemas (or ``None``).
    :returns: ``rollout_func(prompts, trainer)``; its episodes' rows carry GRPO advantages
        over the members of each prompt (``rollout.settings.export``).
    :raises ConfigError: a prompt's group is split across processes (make
        ``per_device_train_batch_size * steps_per_generation`` a multiple of
        ``num_generations``).
    """

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        step = int(trainer.state.global_step)
        groups = [_group_id(p, step) for p in prompts]
        _check_groups(groups, int(trainer.num_generations))
        sampler, context = _sampler(trainer)
        with context as model:
            if isinstance(sampler, _LazySampler):
                sampler.bind(model)
            episodes = asyncio.run(_episodes(rollout, make_env, prompts, groups, sampler, step))
        batch = rollout.rows(episodes)
        order = {e.episode_id: i for i, e in enumerate(episodes)}
        return to_trl_episodes(batch.rows, [order[str(r["episode_id"])] for r in batch.rows])

    return rollout_func


def _check_groups(groups: Sequence[str], size: int) -> None:
    counts: dict[str, int] = {}
    for g in groups:
        counts[g] = counts.get(g, 0) + 1
    if any(n % size for n in counts.values()):
        raise ConfigError(f"compacting_rollout_func: a prompt's {size} generations are split "
                          "across processes; make per_device_train_batch_size * "
                          "steps_per_generation a multiple of num_generations")


async def _episodes(rollout: CompactingRollout, make_env: Callable[[Any], Task],
                    prompts: Sequence[Any], groups: Sequence[str], sampler: Sampler,
                    step: int) -> list[EpisodeRows]:
    seen: dict[str, int] = {}
    runs = []
    for prompt, group in zip(prompts, groups, strict=True):
        index = seen[group] = seen.get(group, -1) + 1
        messages, env, tools = make_env(prompt)
        runs.append(rollout.run(messages, env, sampler, group_id=group, sample_index=index,
                                policy_version=step, tools=tools))
    return list(await asyncio.gather(*runs))
