"""Values the hooks carry: what happened at a compaction, a model call, a summarizer call,
and the end of an episode.

These are the payloads of ``agentcompact_on_compaction``, ``agentcompact_log_model_call``,
``agentcompact_log_summary_call`` and ``agentcompact_log_episode_end``. They are plain
dataclasses of JSON-able values (messages are native dicts of the dialect named beside them),
so a recorder can write them as one JSON line each (``to_dict``) and read them back
(``from_dict``) without losing anything.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CompactionEvent",
    "DroppedItem",
    "EpisodeEnd",
    "ModelCall",
    "SummaryCall",
    "new_id",
]


def new_id() -> str:
    """A fresh random id (hex) for episodes and calls."""
    return uuid.uuid4().hex


@dataclass
class DroppedItem:
    """What a compaction did to one original message it did not keep verbatim.

    ``action`` is ``"dropped"`` (absent from the output), ``"truncated"`` (head and tail
    kept with an elision marker), ``"rendered"`` (represented in the compaction message,
    possibly capped) or ``"summarized"`` (covered by an LLM summary).
    """

    index: int
    role: str
    action: str
    tokens: int
    kind: str = "text"  # text | thinking | tool_call | tool_result | image | other


@dataclass
class CompactionEvent:
    """One compaction (or a failure to compact), reported through ``on_compaction``.

    ``tokens_before`` is the context that would have been sent (after any stored prefix
    substitution); ``tokens_after`` what is sent. ``cut`` is the index in the original
    history from which messages are kept verbatim; ``head_len`` how many leading messages
    stayed verbatim. ``error`` names the failure when a strategy raised and the engine
    fell back (``fallback`` says to what: ``"cliff"`` or ``"none"``). ``errors`` lists
    partial failures the strategy recovered from without a fallback (a parallel block
    rendered verbatim because its summary failed). ``unpinned`` lists the pinned messages
    whose pinned text was past the pin budget (``agentcompact._pins``: the oldest give way)
    and were rendered like any other message.
    """

    strategy: str
    dialect: str
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    head_len: int
    cut: int
    reason: str = "trigger"  # trigger | replay | reactive | forced | fold
    level: int = 0
    recent_turns: int = 0
    over_budget: bool = False
    latency_s: float = 0.0
    error: str | None = None
    fallback: str | None = None
    dropped: list[DroppedItem] = field(default_factory=list)
    episode_id: str | None = None
    timestamp: float = field(default_factory=time.time)
    errors: list[str] = field(default_factory=list)
    unpinned: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompactionEvent:
        values = dict(data)
        values["dropped"] = [DroppedItem(**d) for d in values.get("dropped", [])]
        return cls(**values)


@dataclass
class ModelCall:
    """One call of the agent's model: the exact context sent and what came back.

    ``messages`` are the messages actually sent (after compaction), in ``dialect``;
    ``request`` holds the other request fields that shape the prompt (system, tools,
    sampling parameters) when known. ``response`` is the assistant output as native
    messages of the same dialect (a list: the Responses API returns several items).
    ``prompt_token_ids`` / ``response_token_ids`` / ``response_logprobs`` are filled when
    the serving engine reported them (vLLM, SGLang); otherwise the exporter tokenizes.
    ``response_token_bytes`` are the bytes of each scored token when the server sent
    logprobs without ids (OpenAI): the exporter maps them to its tokenizer's ids.
    """

    episode_id: str
    dialect: str
    messages: list[Any]
    response: list[Any]
    request: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    compacted: bool = False
    call_id: str = field(default_factory=new_id)
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    response_token_bytes: list[list[int]] | None = None
    policy_version: int = 0
    group_id: str | None = None
    timestamp: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelCall:
        return cls(**data)


@dataclass
class SummaryCall:
    """One call of a summarizer model (summary or parallel strategy).

    ``prompt`` is the chat sent to the summarizer (OpenAI chat messages); ``output`` the
    summary text it returned; ``block`` the block index for the parallel strategy.
    ``trained`` says whether the summary is written by the policy itself (so its tokens
    are trained, SUPO-style) or by an external summarizer (masked, ReSum-style).
    ``prompt_token_ids`` / ``response_token_ids`` / ``response_logprobs`` /
    ``response_token_bytes`` are what the summarizer's server reported of its sampled
    tokens, as for :class:`ModelCall` (``Summarizer(logprobs=...)`` asks for them).
    ``request`` holds the sampling settings the summary was sent with (``temperature``,
    ``top_p``, ``top_k``: the exporter writes them as the summary row's ``sampling``);
    ``policy_version`` the version of the weights that wrote it.
    """

    episode_id: str | None
    strategy: str
    prompt: list[dict[str, Any]]
    output: str
    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    block: int | None = None
    latency_s: float = 0.0
    error: str | None = None
    trained: bool = False
    call_id: str = field(default_factory=new_id)
    timestamp: float = field(default_factory=time.time)
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    response_token_bytes: list[list[int]] | None = None
    request: dict[str, Any] = field(default_factory=dict)
    policy_version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SummaryCall:
        return cls(**data)


@dataclass
class EpisodeEnd:
    """The end of one rollout: outcome reward and why it stopped.

    ``stop_reason`` is one of ``complete``, ``context_length``, ``max_turns``, ``timeout``,
    ``error``. ``group_id`` names the task (the GRPO group); ``sample_index`` the
    repetition within it.
    """

    episode_id: str
    reward: float | None = None
    stop_reason: str = "complete"
    group_id: str | None = None
    sample_index: int = 0
    rewards: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeEnd:
        return cls(**data)
