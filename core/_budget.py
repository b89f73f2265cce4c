"""The token budget: when compaction fires and how far it brings the context down.

Compaction fires when the context about to be sent crosses ``trigger_tokens`` and brings it
down to at most ``target_tokens`` (hysteresis: the cliff). Between cliffs the prefix sent
does not change by a byte, so provider prompt caches keep hitting.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["DEFAULT_TARGET_FLOOR", "DEFAULT_TARGET_SHARE", "Budget"]

#: The default target keeps the fixed part of a request (system prompt, tool schemas,
#: instruction items: what compaction cannot shrink) plus this share of the rest of the
#: trigger, and at least :data:`DEFAULT_TARGET_FLOOR` tokens of that rest (at most half of
#: it): ``target = fixed + max(0.26 * rest, min(6000, rest // 2))``, ``rest = trigger -
#: fixed``. Tuned with ``benchmarks/fidelity_canaries.py`` on its tuning half and reported on
#: its held-out half (docs/fidelity.md): at a matched real peak every kind of canary
#: survives at least as often as with CliffCompaction, for about its input cost with prompt
#: caching. The target is a goal, not a limit: a large newest turn stays whole and the
#: context goes over it, never over the trigger, until the agent has read it
#: (docs/engine.md, "Room for the strategy", "The fold").
DEFAULT_TARGET_SHARE = 0.26
#: The least room of the default target besides the fixed part (at small triggers a share
#: leaves the compaction message too little for the last cycle's calls and results).
DEFAULT_TARGET_FLOOR = 6_000


@dataclass(frozen=True, slots=True)
class Budget:
    """Token budget of an engine.

    :param trigger_tokens: compact when the context to send is larger than this.
    :param target_tokens: size to bring it down to; default the fixed part of the request
        plus ``DEFAULT_TARGET_SHARE`` (0.26) of what the trigger leaves besides it, at least
        ``DEFAULT_TARGET_FLOOR`` (6,000) tokens of it and at most half (:meth:`target_for`;
        with nothing fixed and a 60k trigger, 15,600 tokens: chosen for fidelity and cost,
        see the constants).
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
        """The target with nothing fixed (``target_for(0)``)."""
        return self.target_for(0)

    def target_for(self, fixed: int) -> int:
        """The target for a request whose fixed part (system prompt, tools, instructions
        the engine keeps) is ``fixed`` tokens: ``target_tokens`` when given, else ``fixed``
        plus the larger of ``DEFAULT_TARGET_SHARE`` of the rest of the trigger and
        ``DEFAULT_TARGET_FLOOR`` (at most half the rest; ``fixed`` when the fixed part
        alone reaches the trigger)."""
        if self.target_tokens is not None:
            return self.target_tokens
        fixed = max(0, fixed)
        rest = max(0, self.trigger_tokens - fixed)
        return fixed + max(int(DEFAULT_TARGET_SHARE * rest), min(DEFAULT_TARGET_FLOOR, rest // 2))

    @property
    def limit(self) -> int:
        return self.limit_tokens if self.limit_tokens is not None else self.trigger_tokens
