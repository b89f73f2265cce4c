"""``agentcompact replay``: see what each strategy does to real sessions.

Every model call of recorded sessions is replayed through every chosen strategy side by
side; :func:`replay` returns a :class:`ReplayReport` with tokens, prompt-cache share, cost,
time, needed-context recall and a record of what each compaction dropped.
"""

from __future__ import annotations

from ._baselines import (
    BASELINES,
    LLM_STRATEGIES,
    CliffCompactionContender,
    Contender,
    ContenderSettings,
    EngineContender,
    FullHistory,
    Sent,
    SlidingWindow,
)
from ._cli import load_sessions
from ._pricing import PRICES, ModelPrice, call_cost, resolve_price
from ._recall import SALIENT_PATTERNS, ItemIndex, RecallCount, extract_items
from ._replay import (
    CompactionRecord,
    ReplayReport,
    SharedCounter,
    StrategyRun,
    TrajectoryReplay,
    count_calls,
    replay,
    replay_trajectory,
)
from ._report import render_html, write_html

__all__ = [
    "BASELINES",
    "CliffCompactionContender",
    "CompactionRecord",
    "Contender",
    "ContenderSettings",
    "EngineContender",
    "FullHistory",
    "ItemIndex",
    "LLM_STRATEGIES",
    "ModelPrice",
    "PRICES",
    "RecallCount",
    "ReplayReport",
    "SALIENT_PATTERNS",
    "Sent",
    "SharedCounter",
    "SlidingWindow",
    "StrategyRun",
    "TrajectoryReplay",
    "call_cost",
    "count_calls",
    "extract_items",
    "load_sessions",
    "render_html",
    "replay",
    "replay_trajectory",
    "resolve_price",
    "write_html",
]
