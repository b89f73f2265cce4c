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
    │       └── SummarizerOverflow  the endpoint refused the prompt as over its window
    ├── OverBudgetError        strict mode: the context is still over budget after escalation
    ├── StoreError             a prefix store URL is bad, or an entry cannot be serialized
    ├── TrajectoryError        a trajectory file cannot be read
    │   └── TornLineError      the last line of an event log was cut by a crash
    ├── ExportError            an RL export cannot be written as asked
    │   └── SegmentRowError    segment rows break the agentcompact-traj/1 invariants
    ├── ProxyError             the proxy's hop to the provider failed
    │   ├── UpstreamError      the upstream could not be reached, or failed before its headers
    │   └── UpstreamDropped    the upstream connection failed mid-response
    └── ArchiveError           the archive of dropped originals cannot be opened or written,
                               or a handle is unknown

Foreign errors are re-raised as one of these with ``raise X(...) from exc``. Every public
exception of the package is defined here (``tests/core/test_exported_members.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "AgentCompactError",
    "ArchiveError",
    "CompactionError",
    "ConfigError",
    "DialectError",
    "ExportError",
    "OverBudgetError",
    "PluginError",
    "ProxyError",
    "SegmentRowError",
    "StoreError",
    "SummarizerError",
    "SummarizerOverflow",
    "TokenizerError",
    "TornLineError",
    "TrajectoryError",
    "UpstreamDropped",
    "UpstreamError",
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


class SummarizerOverflow(SummarizerError):
    """The summarizer endpoint refused the prompt as longer than its context window."""


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


class ExportError(AgentCompactError, ValueError):
    """An RL export cannot be written as asked (its own class: catching the engine's
    tool-pairing ``ValidationError`` never catches an export error)."""


class SegmentRowError(ExportError):
    """Segment rows break the ``agentcompact-traj/1`` invariants.

    ``problems`` lists every ``agentcompact.rl._schema.RowProblem`` found; ``index`` is the
    first bad row.
    """

    def __init__(self, problems: Sequence[Any]) -> None:
        shown = "\n  ".join(str(p) for p in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} invalid segment row field(s):\n  {shown}{more}")
        self.index: int | None = problems[0].row if problems else None
        self.problems = list(problems)


class ProxyError(AgentCompactError):
    """The proxy's hop to the provider failed."""


class UpstreamError(ProxyError):
    """The upstream could not be reached, or failed before its response headers."""


class UpstreamDropped(ProxyError):
    """The upstream connection failed mid-response."""
