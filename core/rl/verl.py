"""A verl agent loop that compacts: one ``AgentLoopOutput`` per segment, registered as
``agentcompact`` in verl's agent-loop registry.

:class:`CompactingAgentLoop` is verl's ``ToolAgentLoop`` (its tools, its tool-call parser,
its ``_call_tool``) driven by :class:`~agentcompact.rl.rollout.CompactingRollout`: before
each model call the history is compacted, the prompt ids are built token in / token out,
and verl's server manager (``LLMServerClient.generate``: ids in, ids and logprobs out)
samples. ``run`` returns a *list* of outputs, one per segment (working-context window), in
order. verl 0.9.1 takes several outputs per sample on its v1 trainer only
(``trainer.use_v1=true``, TransferQueue): ``AgentLoopWorkerTQ`` stores them under keys
``{uid}_{session}_{index}``, its reward loop scores the last output and copies the score
to the others, and ``compute_advantage_for_multi_trajectories`` computes GRPO over the
*last* output of each session (one per rollout) and broadcasts it to the session's other
outputs: statistics over episodes, not rows. The legacy trainer takes one output per
sample; this loop refuses to run there.

Each output carries ``extra_fields["loss_weight"]``: 1.0 under ``token-mean`` (splitting
an episode never changes a token mean), ``1/segments`` otherwise (``loss_weight`` option
``session``: every rollout counts once under ``seq-mean-token-mean``, verl PR #7580's
session-equal weighting). verl 0.9.1 does not read a per-row weight: use
``actor_rollout_ref.actor.loss_agg_mode=token-mean`` there (``docs/trainers.md``).

Register it with verl's agent-loop config (``actor_rollout_ref.rollout.agent.
agent_loop_config_path``), whose keys beyond ``name`` / ``_target_`` are this class's
options::

    - name: agentcompact
      _target_: agentcompact.rl.verl.CompactingAgentLoop
      trigger: 24000          # compaction trigger, tokens of the policy's tokenizer
      trigger_low: 0.75       # per GRPO group: trigger x U(low, high), seeded by the uid
      trigger_high: 1.0
      seed: 0
      strategy: cliff
      max_tokens: 2048        # per model call

Importing this module registers it too (``@register("agentcompact")``). Needs ``verl``
(0.9.1) with ``hydra-core``; imported only here.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop

from agentcompact.errors import ConfigError
from agentcompact.rl._loss import effective_mask
from agentcompact.rl.rollout import (
    CompactingRollout,
    RolloutSettings,
    Sample,
    SamplingSettings,
    Step,
    TriggerDraw,
    sampling_from,
)
from agentcompact.rl.torch_data import logprobs_known
from agentcompact.trajectory import EpisodeRows
from agentcompact.trajectory._tokenize import ChatTokenizer

__all__ = ["CompactingAgentLoop", "LOSS_WEIGHTS"]

#: ``loss_weight`` options: ``auto`` (1.0 under token-mean, else ``session``), ``row``
#: (1.0 on every output), ``session`` (1/segments: each rollout counts once)
LOSS_WEIGHTS = ("auto", "row", "session")


_CHAT_TOKENIZERS: weakref.WeakKeyDictionary[Any, ChatTokenizer] = weakref.WeakKeyDictionary()
_CHAT_LOCK = threading.Lock()


def _chat_tokenizer(tokenizer: Any) -> ChatTokenizer:
    """One ``ChatTokenizer`` per Hugging Face tokenizer: verl builds an agent loop per
    sample, and hashing a tokenizer takes a few hundred milliseconds."""
    with _CHAT_LOCK:
        tok = _CHAT_TOKENIZERS.get(tokenizer)
        if tok is None:
            name = str(getattr(tokenizer, "name_or_path", "") or "tokenizer")
            tok = _CHAT_TOKENIZERS[tokenizer] = ChatTokenizer(tokenizer, name)
        return tok


class _ServerSampler:
    """verl's server manager as a rollout sampler; keeps the weight versions it reports."""

    def __init__(self, server: Any, request_id: str, params: dict[str, Any],
                 eos: set[int]) -> None:
        self.server, self.request_id, self.params, self.eos = server, request_id, params, eos
        self.extra: dict[str, Any] = {}

    async def __call__(self, prompt_ids: list[int], settings: SamplingSettings) -> Sample:
        out = await self.server.generate(request_id=self.request_id, prompt_ids=prompt_ids,
                                         sampling_params=self.params)
        steps = dict(out.extra_fields or {})
        self.extra.setdefault("min_global_steps", steps.get("min_global_steps"))
        if steps.get("max_global_steps") is not None:
            self.extra["max_global_steps"] = steps["max_global_steps"]
        ids = list(out.token_ids)
        stop = ("abort" if out.stop_reason == "aborted"
                else "stop" if ids and ids[-1] in self.eos else "length")
        return Sample(ids, out.log_probs, stop)


class _ToolData(AgentData):  # type: ignore[misc, unused-ignore]  # Any without verl
    """``AgentData`` with the per-sample tool selection ToolAgentLoop sets on it."""

    _active_tools: dict[str, Any]
    _active_tool_schemas: list[dict[str, Any]]


class _ToolEnv:
    """ToolAgentLoop's tool calls as a rollout environment: the response is parsed with the
    loop's tool parser; no tool call ends the episode, else each call's result is a tool
    message. The episode's reward is verl's (its reward loop scores the last output): the
    rows carry 0.0, never handed to verl."""

    def __init__(self, loop: CompactingAgentLoop, data: _ToolData) -> None:
        self.loop, self.data = loop, data
        self.tool_rewards: list[float] = []

    async def step(self, text: str, sample: Sample) -> Step:
        loop, data = self.loop, self.data
        schemas = [t.tool_schema for t in data._active_tools.values()]
        content, data.tool_calls = await loop.tool_parser.extract_tool_calls(
            list(sample.token_ids), schemas)
        assistant = loop._build_assistant_message(content, data)
        if not data.tool_calls:
            return Step(done=True, reward=0.0, assistant=assistant)
        observations = []
        for call in data.tool_calls[: loop.max_parallel_calls]:
            response, reward, _ = await loop._call_tool(call, data.tools_kwargs, data)
            if reward is not None:
                self.tool_rewards.append(float(reward))
            message: dict[str, Any] = {"role": "tool", "content": response.text or ""}
            if call.tool_call_id is not None:
                message["tool_call_id"] = call.tool_call_id
            observations.append(message)
        return Step(observations=observations, assistant=assistant)


@register("agentcompact")
class CompactingAgentLoop(ToolAgentLoop):  # type: ignore[misc, unused-ignore]  # Any without verl
    """verl agent loop with compaction, one output per segment (module docstring).

    :param strategy: the compaction strategy name.
    :param trigger: the compaction trigger in tokens of the policy's tokenizer.
    :param trigger_low: per GRPO group (``uid``) the trigger is ``trigger`` times a factor
        drawn from ``[trigger_low, trigger_high]`` with ``seed`` (one per group).
    :param max_tokens: tokens per model call (default ``rollout.response_length``).
    :param max_context: the longest prompt (default ``rollout.prompt_length`` +
        ``rollout.response_length``).
    :param loss_weight: one of ``LOSS_WEIGHTS``.
    """

    def __init__(self, *args: Any, strategy: str = "cliff", trigger: int = 32_000,
                 trigger_low: float = 1.0, trigger_high: float = 1.0, seed: int = 0,
                 max_tokens: int | None = None, max_context: int | None = None,
                 loss_weight: str = "auto", **kwargs: Any) -> None:
        kwargs.pop("name", None)  # the config entry's own name, passed on by hydra
        super().__init__(*args, **kwargs)
        if not self.config.trainer.get("use_v1", False):
            raise ConfigError("CompactingAgentLoop returns one output per segment, which verl "
                              "0.9.1 takes on its v1 trainer only: set trainer.use_v1=true")
        if loss_weight not in LOSS_WEIGHTS:
            raise ConfigError(f"loss_weight {loss_weight!r}: choose one of {LOSS_WEIGHTS}")
        rollout = self.rollout_config
        self.max_tokens = int(max_tokens or rollout.response_length)
        self.max_context = int(max_context or rollout.prompt_length + rollout.response_length)
        self.session_weighted = loss_weight == "session" or (
            loss_weight == "auto" and self._agg_mode() != "token-mean")
        self.rollout = CompactingRollout(_chat_tokenizer(self.tokenizer), RolloutSettings(
            strategy=strategy, trigger=TriggerDraw(int(trigger), float(trigger_low),
                                                   float(trigger_high), int(seed)),
            max_turns=int(self.max_assistant_turns or 32), max_context=self.max_context))

    def _agg_mode(self) -> str:
        actor = self.config.actor_rollout_ref.get("actor", {}) or {}
        return str(actor.get("loss_agg_mode", "token-mean"))

    async def run(  # type: ignore[override, unused-ignore]  # v1 takes a list (agent_loop_tq)
            self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any
    ) -> list[AgentLoopOutput]:
        """One episode of the sample (``raw_prompt``); its outputs, one per segment."""
        if "session_id" not in kwargs:
            raise ConfigError("CompactingAgentLoop runs on verl's v1 trainer (it passes "
                              "session_id): set trainer.use_v1=true")
        data = self._agent_data(kwargs)
        request = self._make_request_id(priority, self.rollout_config.full_determinism)
        params = {**sampling_params, "max_tokens": self.max_tokens}
        sampler = _ServerSampler(self.server_manager, request, params,
                                 {int(t) for t in self._eos_ids()})
        env = _ToolEnv(self, data)
        group = str(kwargs.get("uid", kwargs.get("index", "0")))
        episode = await self.rollout.run(
            data.messages, env, sampler, group_id=group,
            sample_index=int(kwargs["session_id"]), episode_id=f"{group}_{kwargs['session_id']}_"
            f"{uuid4().hex[:8]}", policy_version=int(kwargs.get("global_steps", 0) or 0),
            tools=data._active_tool_schemas or None,
            sampling=sampling_from(sampling_params, self.max_tokens))
        return self._outputs(episode, sampler.extra, env.tool_rewards)

    def _agent_data(self, kwargs: dict[str, Any]) -> _ToolData:
        fields: dict[str, Any] = {  # no media: text rollouts only
            "messages": list(kwargs["raw_prompt"]), "image_data": None, "video_data": None,
            "audio_data": None, "mm_processor_kwargs": None, "metrics": {},
            "request_id": uuid4().hex, "tools_kwargs": kwargs.get("tools_kwargs", {}) or {}}
        data = _ToolData(**fields)
        selection = (kwargs.get("extra_info") or {}).get("tool_selection")
        tools = ({n: self.tools[n] for n in selection if n in self.tools} if selection
                 else self.tools)
        data._active_tools = tools
        data._active_tool_schemas = [
            t.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
            for t in tools.values()]
        return data

    def _eos_ids(self) -> list[int]:
        tok: Any = self.tokenizer
        ids = tok.convert_tokens_to_ids([str(tok.eos_token)])
        return [int(i) for i in ids if i is not None]

    def _outputs(self, episode: EpisodeRows, extra: dict[str, Any],
                 tool_rewards: Sequence[float]) -> list[AgentLoopOutput]:
        k = len(episode.rows)
        weight = 1.0 / k if self.session_weighted else 1.0
        outputs = []
        for row, segment in zip(episode.rows, episode.segments, strict=True):
            fields = {**extra, "loss_weight": weight, "episode_id": episode.episode_id,
                      "segment_index": int(row["segment_index"]), "num_segments": k,
                      "compaction_trigger": str(row["compaction_trigger"]),
                      "mask_episode": bool(row["mask_episode"]), "turn_scores": [],
                      "tool_rewards": list(tool_rewards)}
            outputs.append(AgentLoopOutput(
                prompt_ids=[int(t) for t in row["prompt_ids"]],
                response_ids=[int(t) for t in row["response_ids"]],
                response_mask=[int(m) for m in effective_mask(row)],
                response_logprobs=[float(x) for x in row["rollout_logprobs"]]
                if logprobs_known(row) else None,
                num_turns=2 * segment.num_calls + 1, metrics=AgentLoopMetrics(),
                extra_fields=fields))
        return outputs

