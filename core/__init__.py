"""agentcompact: keep long-running LLM agents inside a bounded context window, and turn
their runs into RL training data.

The tour::

    from agentcompact import Budget, Engine

    engine = Engine(strategy="cliff", dialect="anthropic", budget=Budget(trigger_tokens=60000))
    result = engine.compact(messages)   # the caller's list is never mutated
    client.messages.create(messages=result.messages, ...)
"""

from __future__ import annotations

from ._archive import Archive, ArchivedItem, MemoryArchive, SQLiteArchive, open_archive
from ._background import BackgroundCompactor, BackgroundStats
from ._budget import DEFAULT_TARGET_FLOOR, DEFAULT_TARGET_SHARE, Budget
from ._engine import CompactionResult, Engine
from ._events import CompactionEvent, DroppedItem, EpisodeEnd, ModelCall, SummaryCall
from ._expand import ExpandPage, SearchHit, expand, expand_text, search_dropped
from ._hookspecs import hookimpl, hookspec
from ._logging_hooks import log_episode_end, log_model_call, log_summary_call
from ._pins import PIN_SHARE, pinned_texts, typed_pieces
from ._pluginmanager import get_dialect, get_plugin_manager, new_plugin_manager
from ._redact import redact
from ._settings import StrategySettings
from ._store import InMemoryPrefixStore, PrefixEntry, PrefixStore
from ._summarizer import LocalSummarizer, Summarizer, SummaryOutput
from ._tenants import SINGLE_TENANT, Tenant, tenant_of
from ._tokens import CharEstimateCounter, HFTokenizerCounter, TiktokenCounter, TokenCounter
from ._turns import Turns, split_turns, validate
from .dialects._base import Dialect, Part
from .errors import (
    AgentCompactError,
    ArchiveError,
    CompactionError,
    ConfigError,
    DialectError,
    ExportError,
    OverBudgetError,
    PluginError,
    ProxyError,
    SegmentRowError,
    StoreError,
    SummarizerError,
    SummarizerOverflow,
    TokenizerError,
    TornLineError,
    TrajectoryError,
    UpstreamDropped,
    UpstreamError,
    ValidationError,
)
from .strategies._base import CompactionRequest, Rendered, Strategy

__version__ = "0.1.0"

__all__ = [
    "AgentCompactError",
    "Archive",
    "ArchiveError",
    "ArchivedItem",
    "BackgroundCompactor",
    "BackgroundStats",
    "Budget",
    "CharEstimateCounter",
    "CompactionError",
    "CompactionEvent",
    "CompactionRequest",
    "CompactionResult",
    "ConfigError",
    "DEFAULT_TARGET_FLOOR",
    "DEFAULT_TARGET_SHARE",
    "Dialect",
    "DialectError",
    "DroppedItem",
    "Engine",
    "EpisodeEnd",
    "ExpandPage",
    "ExportError",
    "HFTokenizerCounter",
    "InMemoryPrefixStore",
    "LocalSummarizer",
    "MemoryArchive",
    "ModelCall",
    "OverBudgetError",
    "PIN_SHARE",
    "Part",
    "PluginError",
    "PrefixEntry",
    "PrefixStore",
    "ProxyError",
    "Rendered",
    "SINGLE_TENANT",
    "SQLiteArchive",
    "SearchHit",
    "SegmentRowError",
    "StoreError",
    "Strategy",
    "StrategySettings",
    "Summarizer",
    "SummarizerError",
    "SummarizerOverflow",
    "SummaryCall",
    "SummaryOutput",
    "Tenant",
    "TiktokenCounter",
    "TokenCounter",
    "TokenizerError",
    "TornLineError",
    "TrajectoryError",
    "Turns",
    "UpstreamDropped",
    "UpstreamError",
    "ValidationError",
    "__version__",
    "expand",
    "expand_text",
    "get_dialect",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "log_episode_end",
    "log_model_call",
    "log_summary_call",
    "new_plugin_manager",
    "open_archive",
    "pinned_texts",
    "redact",
    "search_dropped",
    "split_turns",
    "tenant_of",
    "typed_pieces",
    "validate",
]
