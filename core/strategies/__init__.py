"""Compaction strategies, one per module; registered as default plugins."""

from __future__ import annotations

from ._base import CompactionRequest, Rendered, Strategy
from ._cliff import CliffLevel, CliffStrategy

__all__ = ["CliffLevel", "CliffStrategy", "CompactionRequest", "Rendered", "Strategy"]
