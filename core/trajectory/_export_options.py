"""The options of an export (``ExportOptions``) and the values they take."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass

from ..errors import ConfigError
from ..rl._schema import STOP_REASONS

ADVANTAGES = ("grpo", "drgrpo", "rloo", "gae-chain", "gae-truncated", "none")
#: what to do with an episode without a reward (a crashed rollout, a grader that failed):
#: never count it as reward 0 in its group's statistics (that drags its group). ``mask-group``
#: (default, as SkyRL): every episode of its group is written with ``mask_episode`` (zero
#: loss); ``drop-episode``: it is not written and its group's statistics are computed over
#: the rewarded episodes. Counted in the manifest and warned about either way.
UNREWARDED = ("mask-group", "drop-episode")
DEFAULT_MASKED_STOP_REASONS = frozenset({"context_length", "error", "timeout"})


@dataclass
class ExportOptions:
    """How to export. ``advantage``: one of ``ADVANTAGES``; the GAE modes use V = 0 (no
    critic) with ``gamma``/``lam`` and are not whitened (the trainer whitens per batch).
    ``summary_trained`` overrides ``SummaryCall.trained``. Episodes whose stop reason is in
    ``mask_stop_reasons`` get ``mask_episode`` (zero loss).

    ``workers``: processes that read, segment and tokenize episodes (the output is the same
    for any value); ``None``: the available CPUs, at most ``MAX_AUTO_WORKERS``, and fewer
    for a small export (one per 8 episodes when forking, per 64 otherwise); ``1``: all in
    this process. ``start_method``: the ``multiprocessing`` start method of the workers;
    ``None``: ``default_start_method()`` (``fork`` on Linux)."""

    fmt: str = "parquet"
    advantage: str = "grpo"
    rows_per_shard: int = 10_000
    summary_trained: bool | None = None
    mask_stop_reasons: frozenset[str] = DEFAULT_MASKED_STOP_REASONS
    gamma: float = 1.0
    lam: float = 1.0
    eps: float = 1e-6
    keep_messages: bool = False
    keep_prompts: bool = True
    verify_tokens: bool = False
    progress: bool = False
    validate: bool = True
    workers: int | None = None
    start_method: str | None = None
    #: a Hugging Face causal LM (name or path) whose log-probabilities fill
    #: ``rollout_logprobs`` of every sampled token (``agentcompact.rl.recompute``)
    recompute_logprobs: str | None = None
    recompute_device: str = "cpu"
    recompute_batch_tokens: int = 16384
    #: longest row (prompt + response tokens) written as trainable; ``None``: no limit
    max_tokens: int | None = None
    #: an episode with a longer row: ``mask`` (kept, ``mask_episode``: zero loss) or
    #: ``drop`` (not written); counted in the manifest either way, never truncated
    overlong: str = "mask"
    #: an episode without a reward: one of ``UNREWARDED`` (never a silent reward 0)
    unrewarded: str = "mask-group"

    def check(self) -> None:
        if self.fmt not in ("parquet", "jsonl"):
            raise ConfigError(f"format {self.fmt!r}: choose parquet or jsonl")
        if self.advantage not in ADVANTAGES:
            raise ConfigError(f"advantage {self.advantage!r}: choose one of {ADVANTAGES}")
        if self.rows_per_shard < 1:
            raise ConfigError(f"rows_per_shard must be >= 1, got {self.rows_per_shard}")
        unknown = set(self.mask_stop_reasons) - STOP_REASONS
        if unknown:
            raise ConfigError(f"mask_stop_reasons: unknown stop reasons {sorted(unknown)}")
        if self.overlong not in ("mask", "drop"):
            raise ConfigError(f"overlong {self.overlong!r}: choose mask or drop")
        if self.unrewarded not in UNREWARDED:
            raise ConfigError(f"unrewarded {self.unrewarded!r}: choose one of {UNREWARDED}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.recompute_batch_tokens < 1:
            raise ConfigError(f"recompute_batch_tokens must be >= 1, got "
                              f"{self.recompute_batch_tokens}")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers must be >= 1 (or None: automatic), got {self.workers}")
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ConfigError(f"start_method {self.start_method!r}: choose one of {methods}")

