"""Agent trajectories read from files: Claude Code sessions, SWE-agent, mini-swe-agent,
tau-bench and plain message lists, as :class:`Trajectory` values; and training rows built
in memory from episodes' events (:class:`EpisodeCollector`, :func:`episode_rows`,
:func:`group_advantages`, :func:`rows_from_events`: the ``export`` extra, imported on first
use so that this package loads without it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..wire import SampledTokens
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

if TYPE_CHECKING:
    from ._memory import (
        EpisodeCollector,
        EpisodeEvents,
        EpisodeRows,
        RowBatch,
        episode_rows,
        group_advantages,
        rows_from_events,
    )

#: names of ``_memory`` (numpy, pyarrow: the ``export`` extra), imported when first used
_IN_MEMORY = frozenset({"EpisodeCollector", "EpisodeEvents", "EpisodeRows", "RowBatch",
                        "episode_rows", "group_advantages", "rows_from_events"})


def __getattr__(name: str) -> Any:
    if name in _IN_MEMORY:
        from . import _memory

        return getattr(_memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CompactionMark",
    "DIALECTS",
    "EpisodeCollector",
    "EpisodeEvents",
    "EpisodeRows",
    "RowBatch",
    "FORMATS",
    "SampledTokens",
    "SkipHandler",
    "Trajectory",
    "UNSUPPORTED_FORMATS",
    "detect_format",
    "episode_rows",
    "group_advantages",
    "group_by_task",
    "import_trajectories",
    "iter_trajectories",
    "load",
    "read_events",
    "rows_from_events",
    "tau_bench_groups",
]
