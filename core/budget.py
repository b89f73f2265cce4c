"""The token budget: when compaction fires and how far it brings the context down.

Compaction fires when the context about to be sent crosses ``trigger_tokens`` and brings it
down to at most ``target_tokens`` (hysteresis: the cliff). Between cliffs the prefix sent
does not change by a byte, so provider prompt caches keep hitting.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["Budget"]


@dataclass(frozen=True, slots=True)
class Budget:
    """Token budget of an engine.

    :param trigger_tokens: compact when the context to send is larger than this.
    :param target_tokens: size to bring it down to; default a quarter of the trigger (the
        cheapest setting with prompt caching on the sessions in benchmarks/README.md:
        fewer tokens re-read per call outweigh the more frequent cache writes).
    :param min_recent_turns: turns always kept verbatim at the end, whatever it costs.
    :param recent_turns: turns kept verbatim when they fit (escalation goes down to
        ``min_recent_turns``).
    :param limit_tokens: the model's hard context window, if known (strict mode and
        reports use it; defaults to the trigger).
    """

    trigger_tokens: int
    target_tokens: int | None = None
    min_recent_turns: int = 1
    recent_turns: int = 3
    limit_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.trigger_tokens, int) or self.trigger_tokens <= 0:
            raise ConfigError(f"Budget.trigger_tokens must be a positive int, got "
                              f"{self.trigger_tokens!r}")
        if self.target_tokens is not None and not 0 < self.target_tokens <= self.trigger_tokens:
            raise ConfigError(
                f"Budget.target_tokens must be in (0, trigger_tokens={self.trigger_tokens}], "
                f"got {self.target_tokens!r}"
            )
        if self.min_recent_turns < 0 or self.recent_turns < self.min_recent_turns:
            raise ConfigError(
                f"Budget needs 0 <= min_recent_turns <= recent_turns, got "
                f"min_recent_turns={self.min_recent_turns}, recent_turns={self.recent_turns}"
            )
        if self.limit_tokens is not None and self.limit_tokens < self.trigger_tokens:
            raise ConfigError(
                f"Budget.limit_tokens ({self.limit_tokens}) is below trigger_tokens "
                f"({self.trigger_tokens})"
            )

    @property
    def trigger(self) -> int:
        return self.trigger_tokens

    @property
    def target(self) -> int:
        return self.target_tokens if self.target_tokens is not None else self.trigger_tokens // 4

    @property
    def limit(self) -> int:
        return self.limit_tokens if self.limit_tokens is not None else self.trigger_tokens
