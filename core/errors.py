"""Exceptions raised by agentcompact.

The hierarchy::

    AgentCompactError
    ├── ConfigError            bad Budget, unknown strategy or dialect name, bad settings
    ├── PluginError            a plugin failed to load, or a hook returned something invalid
    ├── DialectError           a message does not have the shape its dialect requires
    ├── ValidationError        a message list breaks tool pairing or role order
    ├── TokenizerError         a token counter could not be built (e.g. offline tiktoken)
    ├── CompactionError        a strategy failed (the engine falls back, and reports it)
    │   └── SummarizerError    the summarizer endpoint failed, timed out or overflowed
    ├── OverBudgetError        strict mode: the context is still over budget after escalation
    ├── StoreError             a prefix store URL is bad, or an entry cannot be serialized
    ├── TrajectoryError        a trajectory file cannot be read
    │   └── TornLineError      the last line of an event log was cut by a crash
    └── ArchiveError           the archive of dropped originals cannot be opened or written,
                               or a handle is unknown

Foreign errors are re-raised as one of these with ``raise X(...) from exc``.
"""

from __future__ import annotations

__all__ = [
    "AgentCompactError",
    "ArchiveError",
    "CompactionError",
    "ConfigError",
    "DialectError",
    "OverBudgetError",
    "PluginError",
    "StoreError",
    "SummarizerError",
    "TokenizerError",
    "TornLineError",
    "TrajectoryError",
    "ValidationError",
]


class AgentCompactError(Exception):
    """Base class of every error agentcompact raises."""


class ConfigError(AgentCompactError, ValueError):
    """A configuration value is invalid (message names the field and the value)."""


class PluginError(AgentCompactError):
    """A plugin failed to load or a hook implementation misbehaved."""


class DialectError(AgentCompactError, ValueError):
    """A message does not have the shape its dialect requires."""


class ValidationError(AgentCompactError, ValueError):
    """A message list breaks tool pairing or the provider's role order.

    ``index`` is the position of the offending message, when there is one.
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class TokenizerError(AgentCompactError):
    """A token counter could not be built or used."""


class CompactionError(AgentCompactError):
    """A strategy failed to compact."""


class SummarizerError(CompactionError):
    """The summarizer endpoint failed, timed out, or its window overflowed."""


class OverBudgetError(AgentCompactError):
    """Strict mode: the context is still over the budget after every escalation."""

    def __init__(self, message: str, tokens: int, limit: int) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.limit = limit


class StoreError(AgentCompactError, ValueError):
    """A prefix store URL is invalid, or an entry cannot be serialized for a persistent
    store (the message names the type, never the content). An unreachable store is not an
    error: stores are fail-open."""


class TrajectoryError(AgentCompactError, ValueError):
    """A trajectory or event-log file cannot be read (message names file and line)."""


class TornLineError(TrajectoryError):
    """The last line of an event log was cut mid-write (a crash); earlier lines are fine."""


class ArchiveError(AgentCompactError):
    """The archive of dropped originals failed, or an expand named an unknown handle."""
