"""Engine construction shared by the integrations: options checked when the integration is
built, with errors that name the option, never at the first model call."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import pluggy

from agentcompact import Budget, Dialect, Engine, StrategySettings

from ..errors import ConfigError

__all__ = ["engine_from_options", "check_engine"]

#: Budget fields accepted as integration options (``recent_turns=2`` and the like).
_BUDGET_EXTRAS = ("min_recent_turns", "recent_turns", "limit_tokens")
#: flat integration options that go into a :class:`StrategySettings` field
_SETTINGS_OPTIONS = {"strategy_settings": "options", "summarizer": "summarizer",
                     "base_url": "base_url", "model": "model", "api_key": "api_key"}
_ENGINE_OPTIONS = frozenset(
    name for name in inspect.signature(Engine.__init__).parameters if name != "self")
_OPTIONS = _ENGINE_OPTIONS | {"trigger_tokens", "target_tokens"} | set(_SETTINGS_OPTIONS)


def engine_from_options(dialect: str | Dialect, options: Mapping[str, Any], *,
                        plugins: pluggy.PluginManager | None, episode_id: str | None,
                        owner: str, default_strategy: str = "cliff") -> Engine:
    """An :class:`Engine` for ``options``: ``Engine`` keyword arguments, or flat, as peers
    take them: the :class:`Budget` fields ``trigger_tokens`` / ``target_tokens`` /
    ``recent_turns`` / ``min_recent_turns`` / ``limit_tokens``, and the
    :class:`StrategySettings` fields ``strategy_settings`` (its ``options``) /
    ``summarizer`` / ``base_url`` / ``model`` / ``api_key`` for a named strategy.

    :param owner: what takes the options, for error messages (``"CompactionMiddleware"``).
    """
    opts = dict(options)
    extras = {k: opts.pop(k) for k in _BUDGET_EXTRAS if k in opts}
    unknown = sorted(set(opts) - _OPTIONS - {"dialect"})
    if unknown:
        raise ConfigError(f"{owner}: unknown option(s) {', '.join(unknown)}; options are the "
                          f"Engine's ({', '.join(sorted(_ENGINE_OPTIONS))}), trigger_tokens, "
                          f"target_tokens, {', '.join(_BUDGET_EXTRAS)}, "
                          f"{', '.join(_SETTINGS_OPTIONS)}")
    opts.pop("dialect", None)
    for key in ("trigger_tokens", "target_tokens"):
        value = opts.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{owner}: {key} must be a positive int, got "
                              f"{type(value).__name__} {value!r}")
    trigger, target = opts.pop("trigger_tokens", None), opts.pop("target_tokens", None)
    if opts.get("budget") is not None:
        if extras or trigger is not None or target is not None:
            given = sorted([*extras, *(["trigger_tokens"] if trigger is not None else []),
                            *(["target_tokens"] if target is not None else [])])
            raise ConfigError(f"{owner}: give budget= or {'/'.join(given)}=, not both")
    elif trigger is None:
        if extras:
            raise ConfigError(f"{owner}: {'/'.join(sorted(extras))}= needs trigger_tokens=")
        raise ConfigError(f"{owner}: give engine=, budget= or trigger_tokens=")
    else:
        opts["budget"] = Budget(trigger_tokens=trigger, target_tokens=target, **extras)
    strategy = opts.pop("strategy", default_strategy)
    fields = {field: opts.pop(key) for key, field in _SETTINGS_OPTIONS.items()
              if opts.get(key) is not None}
    for key in _SETTINGS_OPTIONS:
        opts.pop(key, None)
    if fields:
        if not isinstance(strategy, str):
            raise ConfigError(f"{owner}: {', '.join(sorted(fields))} given with a strategy "
                              "object; configure the object instead")
        strategy = StrategySettings(strategy, **fields)
    opts.setdefault("plugins", plugins)
    opts.setdefault("episode_id", episode_id)
    return Engine(strategy=strategy, dialect=dialect, **opts)


def check_engine(engine: Any, dialect_type: type[Dialect], owner: str,
                 options: Mapping[str, Any]) -> Engine:
    """``engine`` when it is an :class:`Engine` of ``dialect_type`` given without options."""
    if not isinstance(engine, Engine):
        raise ConfigError(f"{owner}: engine must be an agentcompact Engine, got "
                          f"{type(engine).__name__}")
    if options:
        raise ConfigError(f"{owner}: engine= given together with engine options "
                          f"{', '.join(sorted(options))}")
    if not isinstance(engine.dialect, dialect_type):
        raise ConfigError(f"{owner}: engine dialect is {engine.dialect.name!r}; it must be a "
                          f"{dialect_type.__name__}")
    return engine
