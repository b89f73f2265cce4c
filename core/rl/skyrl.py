"""A SkyRL generator that compacts: each prompt one skyrl-gym episode, one row per segment.

:class:`CompactingGenerator` is a ``skyrl.train.generators.base.GeneratorInterface``. For
every prompt of the batch it runs the prompt's skyrl-gym environment (``env_classes``,
``env_extras``) through :class:`~agentcompact.rl.rollout.CompactingRollout`: the history
is compacted before each model call, the prompt ids are built token in / token out, and
the trainer's inference engine (``InferenceEngineInterface.generate``, token ids in, token
ids and logprobs out) samples. It returns step-wise trajectories: one entry per segment
(working-context window), the episode's reward on the last mask-1 token of its last
segment, ``is_last_step`` on that segment. SkyRL then computes the advantage of each
episode from its last step (GRPO over the episodes of a group, ``instance_id``) and
broadcasts it to the episode's earlier segments: the objective of
``docs/rl-math.md`` (statistics over episodes, not rows).

Config it needs (``docs/trainers.md``)::

    generator.step_wise_trajectories=true      # one row per segment
    generator.batched=false
    generator.sampling_params.logprobs=0       # rows carry the sampled tokens' logprobs
    trainer.algorithm.advantage_estimator=grpo # or rloo / maxrl: outcome estimators
    trainer.algorithm.loss_reduction=token_mean

``gae`` and ``reinforce++`` are refused by SkyRL with step-wise trajectories (no chain GAE
across segments there). Use it from a ``BasePPOExp`` subclass::

    class Exp(BasePPOExp):
        def get_generator(self, cfg, tokenizer, inference_engine_client):
            return CompactingGenerator(cfg.generator, cfg.environment.skyrl_gym,
                                       inference_engine_client, tokenizer,
                                       rollout=RolloutSettings(trigger=TriggerDraw(24_000,
                                                               0.75, 1.0, seed=cfg.trainer.seed)))

Needs ``skyrl`` (0.3.0) and ``skyrl-gym``; imported only by this module.
"""

from __future__ import annotations

import asyncio
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any
from uuid import uuid4

from agentcompact.errors import ConfigError
from agentcompact.rl.adapters import to_skyrl
from agentcompact.rl.rollout import (
    CompactingRollout,
    RolloutSettings,
    Sample,
    SamplingSettings,
    Step,
    sampling_from,
)
from agentcompact.trajectory import EpisodeRows
from agentcompact.trajectory._tokenize import ChatTokenizer


def _import_skyrl() -> tuple[Any, Any, Any]:
    """skyrl 0.3.0 declares Python >= 3.11, but ``skyrl/tinker/types.py`` hands
    ``typing.TypedDict`` to pydantic, which refuses it before Python 3.12: on 3.11 the
    import runs with ``typing_extensions.TypedDict`` in its place (restored after)."""
    saved = typing.TypedDict
    if sys.version_info < (3, 12):
        import typing_extensions

        typing.TypedDict = typing_extensions.TypedDict  # see the docstring
    try:
        from skyrl.backends.skyrl_train.inference_servers.base import InferenceEngineInput
        from skyrl.train.generators.base import GeneratorInterface, TrajectoryID
    finally:
        typing.TypedDict = saved
    return GeneratorInterface, TrajectoryID, InferenceEngineInput


GeneratorInterface, TrajectoryID, InferenceEngineInput = _import_skyrl()

__all__ = ["CompactingGenerator"]


class _EngineSampler:
    """SkyRL's inference engine as a rollout sampler (token ids in, ids and logprobs out)."""

    def __init__(self, client: Any, params: Mapping[str, Any], session: str,
                 model: str | None) -> None:
        self.client, self.session, self.model = client, session, model
        self.params = dict(params)
        if self.params.get("logprobs") is None:
            self.params["logprobs"] = 0  # vLLM: the sampled token's own logprob only

    async def __call__(self, prompt_ids: list[int], settings: SamplingSettings) -> Sample:
        batch = InferenceEngineInput(prompt_token_ids=[prompt_ids], sampling_params=self.params,
                                     session_ids=[self.session])
        out = await self.client.generate(batch, model=self.model)
        logprobs = out.get("response_logprobs")
        return Sample(list(out["response_ids"][0]), None if logprobs is None else logprobs[0],
                      _stop(out["stop_reasons"][0]))


def _stop(reason: Any) -> str:
    return "length" if reason == "length" else "abort" if reason == "abort" else "stop"


class _GymEnv:
    """A skyrl-gym ``BaseTextEnv`` as a rollout environment (its ``step`` in a thread)."""

    def __init__(self, env: Any) -> None:
        self.env = env

    async def step(self, text: str, sample: Sample) -> Step:
        out = await asyncio.to_thread(self.env.step, text)
        reward = out.get("reward")
        return Step(observations=list(out.get("observations") or []),
                    reward=float(reward) if isinstance(reward, (int, float)) else None,
                    done=bool(out.get("done")))


class CompactingGenerator(GeneratorInterface):  # type: ignore[misc, valid-type]  # SkyRL's ABC
    """SkyRL ``GeneratorInterface`` running compacted skyrl-gym episodes (module docstring).

    :param generator_cfg: SkyRL's ``cfg.generator`` (``step_wise_trajectories`` must be on).
    :param skyrl_gym_cfg: SkyRL's ``cfg.environment.skyrl_gym`` (per-env configs).
    :param inference_engine_client: the trainer's ``InferenceEngineInterface``.
    :param tokenizer: the trainer's Hugging Face tokenizer (fast, with a chat template).
    :param rollout: compaction and row settings; ``max_turns``, ``max_context`` and the
        sampling settings are taken from ``generator_cfg`` (``max_turns``,
        ``max_input_length``, ``sampling_params``).
    :param tokenizer_name: the name recorded on the rows (default ``name_or_path``).
    """

    def __init__(self, generator_cfg: Any, skyrl_gym_cfg: Any, inference_engine_client: Any,
                 tokenizer: Any, *, rollout: RolloutSettings | None = None,
                 policy_model_name: str | None = None, tokenizer_name: str | None = None
                 ) -> None:
        _check(generator_cfg)
        self.cfg, self.gym_cfg = generator_cfg, skyrl_gym_cfg
        self.client, self.model = inference_engine_client, policy_model_name
        name = tokenizer_name or str(getattr(tokenizer, "name_or_path", "") or "tokenizer")
        params = _params(generator_cfg.sampling_params)
        settings = replace(rollout or RolloutSettings(), max_turns=int(generator_cfg.max_turns),
                           max_context=generator_cfg.max_input_length,
                           sampling=sampling_from(params, _max_tokens(params)))
        self.rollout = CompactingRollout(ChatTokenizer(tokenizer, name), settings)

    async def generate(self, input_batch: Mapping[str, Any]) -> dict[str, Any]:
        """Run every prompt's episode; the step-wise ``GeneratorOutput``, in input order."""
        prompts = input_batch["prompts"]
        ids = input_batch.get("trajectory_ids") or [None] * len(prompts)
        extras = input_batch.get("env_extras") or [{} for _ in prompts]
        params = input_batch.get("sampling_params") or _params(self.cfg.sampling_params)
        episodes = await asyncio.gather(*[
            self._episode(prompt, env_class, dict(extra or {}), params, tid, i)
            for i, (prompt, env_class, extra, tid) in enumerate(
                zip(prompts, input_batch["env_classes"], extras, ids, strict=True))])
        rows = [r for e in episodes for r in e.rows]
        out: dict[str, Any] = to_skyrl(rows)
        out["trajectory_ids"] = [TrajectoryID(**t) for t in out["trajectory_ids"]]
        out["rollout_metrics"] = _metrics(episodes)
        return out

    async def _episode(self, prompt: Sequence[dict[str, Any]], env_class: str,
                       extras: dict[str, Any], params: Mapping[str, Any], tid: Any,
                       index: int) -> EpisodeRows:
        import skyrl_gym

        extras["max_turns"] = int(self.cfg.max_turns)
        env = skyrl_gym.make(env_class, env_config=getattr(self.gym_cfg, env_class, {}),
                             extras=extras)
        group = str(tid.instance_id) if tid is not None else f"prompt-{index}"
        sample_index = int(tid.repetition_id) if tid is not None else 0
        session = f"{group}_{sample_index}_{uuid4().hex[:8]}"
        version = getattr(self.client, "weight_version", 0)
        try:
            messages, _ = await asyncio.to_thread(env.init, [dict(m) for m in prompt])
            return await self.rollout.run(
                messages, _GymEnv(env), _EngineSampler(self.client, params, session, self.model),
                group_id=group, sample_index=sample_index, episode_id=session,
                policy_version=version if isinstance(version, int) else 0)
        finally:
            await asyncio.to_thread(env.close)
            await self.client.finish_session(session)


def _check(cfg: Any) -> None:
    if not cfg.step_wise_trajectories:
        raise ConfigError("CompactingGenerator needs generator.step_wise_trajectories=true "
                          "(one row per segment)")
    if cfg.batched:
        raise ConfigError("CompactingGenerator needs generator.batched=false")


def _params(sampling: Any) -> dict[str, Any]:
    """SkyRL's ``SamplingParams`` config (or a dict) as a vLLM sampling dict."""
    if isinstance(sampling, Mapping):
        return dict(sampling)
    values = dict(vars(sampling))
    if "max_generate_length" in values:
        values["max_tokens"] = values.pop("max_generate_length")
    return {k: v for k, v in values.items() if v is not None}


def _max_tokens(params: Mapping[str, Any]) -> int:
    value = params.get("max_tokens", params.get("max_new_tokens"))
    return int(value) if isinstance(value, int) else 1024


def _metrics(episodes: Sequence[EpisodeRows]) -> dict[str, float]:
    n = max(len(episodes), 1)
    return {
        "agentcompact/compactions_per_episode": sum(e.compactions for e in episodes) / n,
        "agentcompact/segments_per_episode": sum(len(e.rows) for e in episodes) / n,
        "agentcompact/episodes_masked": float(sum(bool(e.rows[0]["mask_episode"])
                                                  for e in episodes if e.rows)),
    }
