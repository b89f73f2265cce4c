"""Convenience functions that fire the RL-logging hooks on a plugin manager."""

from __future__ import annotations

from typing import Any

import pluggy

from ._events import EpisodeEnd, ModelCall, SummaryCall
from ._pluginmanager import get_plugin_manager

__all__ = ["log_episode_end", "log_model_call", "log_summary_call"]


def _pm(pm: pluggy.PluginManager | None) -> pluggy.PluginManager:
    return pm if pm is not None else get_plugin_manager()


def log_model_call(call: ModelCall, pm: pluggy.PluginManager | None = None) -> None:
    """Fire ``agentcompact_log_model_call`` for one model call."""
    _pm(pm).hook.agentcompact_log_model_call(call=call)


def log_summary_call(call: SummaryCall, pm: pluggy.PluginManager | None = None) -> None:
    """Fire ``agentcompact_log_summary_call`` for one summarizer call."""
    _pm(pm).hook.agentcompact_log_summary_call(call=call)


def log_episode_end(
    episode_id: str | EpisodeEnd,
    reward: float | None = None,
    stop_reason: str = "complete",
    *,
    pm: pluggy.PluginManager | None = None,
    **fields: Any,
) -> EpisodeEnd:
    """Fire ``agentcompact_log_episode_end``; accepts an ``EpisodeEnd`` or its fields."""
    episode = (episode_id if isinstance(episode_id, EpisodeEnd)
               else EpisodeEnd(episode_id, reward, stop_reason, **fields))
    _pm(pm).hook.agentcompact_log_episode_end(episode=episode)
    return episode
