"""Agent trajectories read from files: Claude Code sessions, SWE-agent, mini-swe-agent,
tau-bench and plain message lists, as :class:`Trajectory` values."""

from __future__ import annotations

from ._events_log import read_events
from ._importers import import_trajectories
from ._loaders import (
    DIALECTS,
    FORMATS,
    UNSUPPORTED_FORMATS,
    CompactionMark,
    SkipHandler,
    Trajectory,
    detect_format,
    group_by_task,
    iter_trajectories,
    load,
    tau_bench_groups,
)
from ._sampled import SampledTokens

__all__ = [
    "CompactionMark",
    "DIALECTS",
    "FORMATS",
    "SampledTokens",
    "SkipHandler",
    "Trajectory",
    "UNSUPPORTED_FORMATS",
    "detect_format",
    "group_by_task",
    "import_trajectories",
    "iter_trajectories",
    "load",
    "read_events",
    "tau_bench_groups",
]
