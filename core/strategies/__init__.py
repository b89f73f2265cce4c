"""Compaction strategies, one per module; registered as default plugins."""

from __future__ import annotations

from ._base import CompactionRequest, Rendered, Strategy
from ._cliff import DEFAULT_LEVELS, CliffLevel, CliffStrategy
from ._parallel import ParallelStrategy
from ._summary import DEFAULT_PROMPT, SummaryStrategy

__all__ = [
    "CliffLevel",
    "CliffStrategy",
    "CompactionRequest",
    "DEFAULT_LEVELS",
    "DEFAULT_PROMPT",
    "ParallelStrategy",
    "Rendered",
    "Strategy",
    "SummaryStrategy",
]
