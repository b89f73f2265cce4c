"""agentcompact: keep long-running LLM agents inside a bounded context window, and turn
their runs into RL training data.

The tour::

    from agentcompact import Budget, Engine

    engine = Engine(strategy="cliff", dialect="anthropic", budget=Budget(trigger_tokens=60000))
    result = engine.compact(messages)   # the caller's list is never mutated
    client.messages.create(messages=result.messages, ...)
"""

from __future__ import annotations

from ._budget import Budget
from ._engine import CompactionResult, Engine
from ._events import CompactionEvent, DroppedItem, EpisodeEnd, ModelCall, SummaryCall
from ._hookspecs import hookimpl, hookspec
from ._logging_hooks import log_episode_end, log_model_call, log_summary_call
from ._pluginmanager import get_dialect, get_plugin_manager, new_plugin_manager
from ._store import InMemoryPrefixStore, PrefixEntry, PrefixStore
from ._tokens import CharEstimateCounter, HFTokenizerCounter, TiktokenCounter, TokenCounter
from ._turns import Turns, split_turns, validate
from .dialects._base import Dialect, Part
from .errors import (
    AgentCompactError,
    CompactionError,
    ConfigError,
    DialectError,
    OverBudgetError,
    PluginError,
    SummarizerError,
    TokenizerError,
    TrajectoryError,
    ValidationError,
)
from .strategies._base import CompactionRequest, Rendered, Strategy

__version__ = "0.1.0"

__all__ = [
    "AgentCompactError",
    "Budget",
    "CharEstimateCounter",
    "CompactionError",
    "CompactionEvent",
    "CompactionRequest",
    "CompactionResult",
    "ConfigError",
    "Dialect",
    "DialectError",
    "DroppedItem",
    "Engine",
    "EpisodeEnd",
    "HFTokenizerCounter",
    "InMemoryPrefixStore",
    "ModelCall",
    "OverBudgetError",
    "Part",
    "PluginError",
    "PrefixEntry",
    "PrefixStore",
    "Rendered",
    "Strategy",
    "SummarizerError",
    "SummaryCall",
    "TiktokenCounter",
    "TokenCounter",
    "TokenizerError",
    "TrajectoryError",
    "Turns",
    "ValidationError",
    "__version__",
    "get_dialect",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "log_episode_end",
    "log_model_call",
    "log_summary_call",
    "new_plugin_manager",
    "split_turns",
    "validate",
]
