"""Agent trajectories read from files: Claude Code sessions, SWE-agent, mini-swe-agent,
tau-bench and plain message lists, as :class:`Trajectory` values."""

from __future__ import annotations

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

__all__ = [
    "DIALECTS",
    "FORMATS",
    "UNSUPPORTED_FORMATS",
    "CompactionMark",
    "SkipHandler",
    "Trajectory",
    "detect_format",
    "group_by_task",
    "iter_trajectories",
    "load",
    "tau_bench_groups",
]
