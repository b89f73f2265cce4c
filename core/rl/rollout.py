"""Compaction inside a trainer's rollout loop: one episode, token in and token out.

A trainer generates online, against its own inference engine. :class:`CompactingRollout`
runs one agent episode there: before each model call the episode's engine compacts the
history (the trainer's tokenizer counts it), the prompt ids are built, the trainer's
:class:`Sampler` samples, the :class:`Environment` answers, and every call, compaction and
the episode's end are reported to an :class:`~agentcompact.trajectory.EpisodeCollector`.
The episode's segment rows are then the exporter's own (:func:`~agentcompact.trajectory.
episode_rows`): the same rows ``agentcompact export`` writes for the same events.

Prompt ids are never re-tokenized. While the context sent extends the previous one (no
compaction in between), the next prompt is the previous prompt, the sampled ids as
sampled, and the template's rendering of what follows them (the end of the assistant
turn, the observations, the next generation prompt; an end-of-turn token the policy did
not sample is added there, mask 0). After a compaction the prompt is a fresh render of
the compacted context: a new segment. A template that rewrites earlier turns (Qwen3
dropping old reasoning) also starts a new segment.

Within a GRPO group every rollout compacts at the same trigger: :class:`TriggerDraw`
draws it from a seed and the group id, so rollouts of one task compact alike (as Prime
Intellect's verifiers draw one threshold per group) while groups see different triggers.

The trainers' glue: :mod:`agentcompact.rl.skyrl` (a SkyRL ``GeneratorInterface``),
:mod:`agentcompact.rl.verl` (a verl ``AgentLoopBase``), :mod:`agentcompact.rl.trl`
(a TRL ``rollout_func``). Needs the ``export`` extra (numpy, pyarrow, transformers).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pluggy

from .._budget import Budget
from .._engine import Engine
from .._events import EpisodeEnd, ModelCall, new_id
from .._logging_hooks import log_episode_end, log_model_call
from .._pluginmanager import new_plugin_manager, registry
from .._settings import StrategySettings
from ..dialects._base import Dialect
from ..errors import ConfigError
from ..trajectory._export_writer import ExportWriter as _Writer
from ..trajectory._export_writer import private_files as _private_files
from ..trajectory._memory import (
    EpisodeCollector,
    EpisodeRows,
    RowBatch,
    episode_rows,
    group_advantages,
)
from ..trajectory._tokenize import ChatTokenizer, extend_chat, to_chat_messages
from ..trajectory.export import ExportOptions

__all__ = [
    "CompactingRollout",
    "Environment",
    "RolloutSettings",
    "Sample",
    "Sampler",
    "SamplingSettings",
    "Step",
    "TriggerDraw",
    "sampling_from",
    "write_batch",
]

#: a sampler's stop reasons
STOPS = ("stop", "length", "abort")


@dataclass(frozen=True, slots=True)
class Sample:
    """What the inference engine sampled for one prompt.

    :ivar token_ids: the sampled ids, the stop token included when it was sampled.
    :ivar logprobs: each sampled token's logprob (``None``: the engine reported none).
    :ivar stop_reason: ``stop`` (a stop token or string), ``length`` (the token limit),
        ``abort``.
    :ivar logprobs_mode: what the logprobs are: ``raw`` (the model's distribution before
        temperature, vLLM's default) or ``processed`` (after temperature: what a trainer
        recomputes at the sampling temperature); recorded on the rows.
    """

    token_ids: Sequence[int]
    logprobs: Sequence[float] | None = None
    stop_reason: str = "stop"
    logprobs_mode: str = "raw"


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """The policy's sampling settings (recorded on every row: logprobs pair with them)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 1024

    def request(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_tokens": self.max_tokens}


class Sampler(Protocol):
    """The trainer's inference engine: sample a response for ``prompt_ids``."""

    async def __call__(self, prompt_ids: list[int], settings: SamplingSettings) -> Sample:
        ...


@dataclass(frozen=True, slots=True)
class Step:
    """What the environment made of one response.

    :ivar observations: chat messages that follow the assistant's (tool results, a user
        turn); empty when ``done``.
    :ivar reward: this step's reward (an episode's reward is the sum of its steps';
        ``None`` on every step: the episode is unrewarded and never counts as reward 0).
    :ivar done: the episode is over.
    :ivar assistant: the assistant message as the environment parsed it (tool calls
        included), kept in the history; default ``{"role": "assistant", "content": text}``.
    """

    observations: Sequence[dict[str, Any]] = ()
    reward: float | None = None
    done: bool = False
    assistant: dict[str, Any] | None = None


@runtime_checkable
class Environment(Protocol):
    """One episode's environment: it answers each response of the policy."""

    async def step(self, text: str, sample: Sample) -> Step:
        """``text``: the response decoded (special tokens skipped)."""
        ...


@dataclass(frozen=True, slots=True)
class TriggerDraw:
    """The compaction trigger of a GRPO group: ``base`` times a factor drawn uniformly from
    ``[low, high]`` by a generator seeded with ``seed`` and the group id. Rollouts of one
    group get one trigger; ``low == high == 1`` gives every group ``base``."""

    base: int
    low: float = 1.0
    high: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.base < 1 or not 0 < self.low <= self.high:
            raise ConfigError(f"TriggerDraw needs base >= 1 and 0 < low <= high, got "
                              f"base={self.base} low={self.low} high={self.high}")

    def __call__(self, group_id: str) -> int:
        if self.low == self.high:
            return max(1, round(self.base * self.low))
        digest = hashlib.blake2b(f"{self.seed}\0{group_id}".encode(), digest_size=8)
        factor = random.Random(int.from_bytes(digest.digest(), "big")).uniform(self.low,
                                                                                self.high)
        return max(1, round(self.base * factor))


@dataclass(frozen=True)
class RolloutSettings:
    """How episodes are run and turned into rows.

    :param strategy: the compaction strategy (a name or ``StrategySettings``).
    :param trigger: the trigger in tokens (the trainer's tokenizer), or a
        :class:`TriggerDraw` for a trigger per GRPO group.
    :param max_turns: model calls per episode (then ``stop_reason`` ``max_turns``).
    :param max_context: the longest prompt the model takes; a prompt still longer after
        compaction ends the episode (``context_length``: masked by default).
    :param sampling: the policy's sampling settings.
    :param export: the rows' options (advantage mode, unrewarded policy, length policy).
    :param model: the model name recorded on the calls.
    """

    strategy: str | StrategySettings = "cliff"
    trigger: int | TriggerDraw = 32_000
    max_turns: int = 32
    max_context: int | None = None
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    export: ExportOptions = field(default_factory=ExportOptions)
    model: str | None = None

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {self.max_turns}")
        if isinstance(self.trigger, int) and self.trigger < 1:
            raise ConfigError(f"trigger must be a positive token count, got {self.trigger}")
        self.export.check()

    def trigger_for(self, group_id: str) -> int:
        return self.trigger(group_id) if isinstance(self.trigger, TriggerDraw) else self.trigger


class _TokenizerCounter:
    """The trainer's tokenizer as the engine's token counter."""

    at_most_utf8_bytes = False

    def __init__(self, tok: ChatTokenizer) -> None:
        self._tok = tok
        self.name = f"hf:{tok.name}"

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self._tok.encode_batch(list(texts))] if texts else []


class _Prompts:
    """The prompt ids of one episode's model calls (see the module docstring)."""

    def __init__(self, tok: ChatTokenizer, dialect: Dialect,
                 tools: list[dict[str, Any]] | None) -> None:
        self.tok, self.dialect, self.tools = tok, dialect, tools
        self.eos_id = tok.hf.convert_tokens_to_ids(tok.eos_text) if tok.eos_text else None
        self.ids: list[int] | None = None  # the last prompt + its sampled ids
        self.ext: list[Any] = []  # the last context sent + the assistant's message
        self.chat_ext: list[dict[str, Any]] = []  # ``ext`` as template messages
        self.asked = ""  # render(last context, generation prompt)
        self.sampled_eos = False

    def _render(self, chat: list[dict[str, Any]], gen: bool) -> str:
        return self.tok.render(chat, self.tools, add_generation_prompt=gen)

    def prompt(self, sent: list[Any]) -> tuple[list[int], str]:
        """The prompt ids for the context ``sent`` and its render."""
        n = len(self.ext)
        if self.ids is not None and len(sent) > n and sent[:n] == self.ext:
            chat = extend_chat(self.chat_ext, sent[n:], self.dialect)
            asked = self._render(chat, True)
            glue = self._glue(asked)
            if glue is not None:
                return [*self.ids, *self.tok.encode(glue)], asked
        asked = self._render(to_chat_messages(sent, self.dialect), True)
        return self.tok.encode(asked), asked

    def _glue(self, asked: str) -> str | None:
        """The text after the sampled ids up to the next generation prompt, or ``None``
        when the template does not render the history as a prefix (a new segment)."""
        done = self._render(self.chat_ext, False)
        if not done.startswith(self.asked) or not asked.startswith(done):
            return None
        turn = done[len(self.asked):]
        end = turn.rfind(self.tok.eos_text) if self.tok.eos_text else -1
        if end < 0:
            return None  # a template without an end-of-turn token: start afresh
        after = turn[end + len(self.tok.eos_text):]
        closing = after if self.sampled_eos else self.tok.eos_text + after
        return closing + asked[len(done):]

    def sampled(self, prompt_ids: list[int], asked: str, sent: list[Any],
                assistant: dict[str, Any], sample: Sample) -> None:
        ids = list(sample.token_ids)
        self.ids = [*prompt_ids, *ids]
        self.asked = asked
        self.ext = [*sent, assistant]
        self.chat_ext = to_chat_messages(self.ext, self.dialect)
        self.sampled_eos = bool(ids) and ids[-1] == self.eos_id


@dataclass
class _State:
    """One running episode."""

    episode_id: str
    group_id: str
    sample_index: int
    policy_version: int
    engine: Engine
    prompts: _Prompts
    history: list[Any]
    sampling: SamplingSettings
    rewards: list[float] = field(default_factory=list)
    stop_reason: str = "max_turns"


class CompactingRollout:
    """Runs episodes with compaction against a trainer's sampler and collects their rows.

    :param tokenizer: the trainer's tokenizer (a ``ChatTokenizer``, or a name or folder).
    :param settings: how episodes run (:class:`RolloutSettings`).
    :param plugins: the plugin manager the engines and calls report to (default: a fresh
        one with the built-in plugins); an ``EpisodeCollector`` is registered on it. Register
        a ``Recorder`` there too to keep the events on disk.
    """

    def __init__(self, tokenizer: ChatTokenizer | str, settings: RolloutSettings | None = None,
                 *, plugins: pluggy.PluginManager | None = None) -> None:
        self.tok = (tokenizer if isinstance(tokenizer, ChatTokenizer)
                    else ChatTokenizer.from_pretrained(tokenizer))
        self.settings = settings or RolloutSettings()
        self.pm = plugins if plugins is not None else new_plugin_manager()
        self.collector = EpisodeCollector()
        self.pm.register(self.collector, name=f"agentcompact-rollout-{id(self.collector)}")
        self.dialect = registry(self.pm).dialect("openai_chat")
        self.counter = _TokenizerCounter(self.tok)

    async def run(self, messages: Sequence[dict[str, Any]], env: Environment,
                  sampler: Sampler, *, group_id: str, sample_index: int = 0,
                  episode_id: str | None = None, policy_version: int = 0,
                  tools: list[dict[str, Any]] | None = None,
                  sampling: SamplingSettings | None = None) -> EpisodeRows:
        """Run one episode from the task ``messages`` (OpenAI chat messages) to its end and
        return its segment rows (zero advantages: :meth:`rows` gives the group's).

        :param tools: the tool schemas (OpenAI function shape) the prompt renders.
        :param sampling: this episode's sampling settings (default: the settings').
        :raises ConfigError: the task alone is longer than ``max_context``.
        """
        state = self._start(messages, group_id, sample_index, episode_id, policy_version,
                            tools, sampling or self.settings.sampling)
        for _ in range(self.settings.max_turns):
            if await self._turn(state, env, sampler, tools):
                break
        reward = sum(state.rewards) if state.rewards else None
        log_episode_end(EpisodeEnd(state.episode_id, reward, state.stop_reason,
                                   group_id=group_id, sample_index=sample_index), pm=self.pm)
        return episode_rows(self.collector.take(state.episode_id), self.tok,
                            self.settings.export)

    def rows(self, episodes: Sequence[EpisodeRows]) -> RowBatch:
        """The rows of a batch of episodes with their groups' advantages."""
        return group_advantages(episodes, self.settings.export, tokenizer=self.tok)

    def _start(self, messages: Sequence[dict[str, Any]], group_id: str, sample_index: int,
               episode_id: str | None, policy_version: int,
               tools: list[dict[str, Any]] | None, sampling: SamplingSettings) -> _State:
        eid = episode_id or new_id()
        budget = Budget(trigger_tokens=self.settings.trigger_for(group_id))
        engine = Engine(strategy=self.settings.strategy, dialect=self.dialect, budget=budget,
                        counter=self.counter, plugins=self.pm, episode_id=eid)
        return _State(eid, group_id, sample_index, policy_version, engine,
                      _Prompts(self.tok, self.dialect, tools),
                      [dict(m) for m in messages], sampling)

    async def _turn(self, state: _State, env: Environment, sampler: Sampler,
                    tools: list[dict[str, Any]] | None) -> bool:
        """One model call and the environment's answer; ``True`` when the episode ends."""
        fixed = state.engine.fixed_tokens({"tools": tools}) if tools else 0
        sent = list((await state.engine.acompact(state.history, fixed_tokens=fixed)).messages)
        prompt_ids, asked = state.prompts.prompt(sent)
        limit = self.settings.max_context
        if limit is not None and len(prompt_ids) > limit:
            if state.prompts.ids is None:
                raise ConfigError(f"episode {state.episode_id!r}: the task's prompt is "
                                  f"{len(prompt_ids)} tokens > max_context {limit}")
            state.stop_reason = "context_length"
            return True
        sample = await sampler(prompt_ids, state.sampling)
        text = self.tok.hf.decode(list(sample.token_ids), skip_special_tokens=True)
        step = await env.step(text, sample)
        assistant = step.assistant or {"role": "assistant", "content": text}
        self._record(state, sent, assistant, prompt_ids, sample, tools)
        state.prompts.sampled(prompt_ids, asked, sent, assistant, sample)
        if step.reward is not None:
            state.rewards.append(float(step.reward))
        state.history = [*state.history, assistant, *step.observations]
        if step.done:
            state.stop_reason = "complete"
        return step.done

    def _record(self, state: _State, sent: list[Any], assistant: dict[str, Any],
                prompt_ids: list[int], sample: Sample,
                tools: list[dict[str, Any]] | None) -> None:
        request: dict[str, Any] = {**state.sampling.request(),
                                   "logprobs_mode": sample.logprobs_mode}
        if tools:
            request["tools"] = tools
        log_model_call(ModelCall(
            episode_id=state.episode_id, dialect=self.dialect.name, messages=sent,
            response=[assistant], request=request, model=self.settings.model,
            prompt_token_ids=list(prompt_ids), response_token_ids=list(sample.token_ids),
            response_logprobs=None if sample.logprobs is None else list(sample.logprobs),
            policy_version=state.policy_version, group_id=state.group_id,
        ), self.pm)


def sampling_from(values: Mapping[str, Any], max_tokens: int) -> SamplingSettings:
    """:class:`SamplingSettings` from a trainer's sampling dict (``temperature``,
    ``top_p``, ``top_k``; a missing key: the default)."""
    def num(key: str, default: float) -> float:
        value = values.get(key)
        return float(value) if isinstance(value, (int, float)) else default

    top_k = values.get("top_k")
    return SamplingSettings(temperature=num("temperature", 1.0), top_p=num("top_p", 1.0),
                            top_k=int(top_k) if isinstance(top_k, int) else -1,
                            max_tokens=max_tokens)


def write_batch(batch: RowBatch, out_dir: str | os.PathLike[str],
                options: ExportOptions | None = None) -> dict[str, Any]:
    """Write a batch of rows as ``agentcompact export`` writes its folder: segment shards
    (``segments-00000.parquet``…, groups never split), ``episodes.parquet`` and a
    ``manifest.json`` (format, tokenizer, advantage mode, counts, files), with the export's
    own writer: the segment and episode files are byte for byte those ``agentcompact
    export`` writes for the same episodes.

    :raises ConfigError: ``out_dir`` holds an export already.
    """
    opts = options or ExportOptions()
    out = Path(out_dir)
    with _private_files():
        out.mkdir(parents=True, exist_ok=True)
        if any(out.glob("segments-*")) or (out / "manifest.json").exists():
            raise ConfigError(f"{out}: already holds an export; choose an empty folder")
        writer = _Writer(out, opts)
        try:
            _write_rows(writer, batch)
        finally:
            writer.close()
        manifest = {
            "schema_version": batch.rows[0]["schema_version"] if batch.rows else None,
            "format": opts.fmt,
            "tokenizer": {k: batch.rows[0][k] for k in ("tokenizer_name", "tokenizer_sha256",
                                                        "chat_template_sha256")}
            if batch.rows else None,
            "advantage": {"mode": opts.advantage, "eps": opts.eps},
            "counts": batch.counts,
            "files": {"segments": writer.files, "episodes": {
                "path": writer.episodes_path.name, "rows": writer.episode_rows}},
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _write_rows(writer: _Writer, batch: RowBatch) -> None:
    """The rows episode by episode (each with its table row), a group end between groups."""
    episodes = {str(e["episode_id"]): e for e in batch.episodes}
    start, group = 0, None
    rows = batch.rows
    for i in range(1, len(rows) + 1):
        if i < len(rows) and rows[i]["episode_id"] == rows[start]["episode_id"]:
            continue
        first = rows[start]
        if group is not None and first["group_id"] != group:
            writer.end_group()
        group = first["group_id"]
        writer.add(rows[start:i], episodes[str(first["episode_id"])])
        start = i
    if rows:
        writer.end_group()
