"""Engine construction shared by the integrations: options checked when the integration is
built, with errors that name the option, never at the first model call."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import pluggy

from .._budget import Budget
from .._engine import Engine
from ..dialects._base import Dialect
from ..errors import ConfigError

__all__ = ["engine_from_options", "check_engine"]

#: Budget fields accepted as integration options (``recent_turns=2`` and the like).
_BUDGET_EXTRAS = ("min_recent_turns", "recent_turns", "limit_tokens")
_ENGINE_OPTIONS = frozenset(
    name for name in inspect.signature(Engine.__init__).parameters if name != "self")


def engine_from_options(dialect: str | Dialect, options: Mapping[str, Any], *,
                        plugins: pluggy.PluginManager | None, episode_id: str | None,
                        owner: str, default_strategy: str = "cliff") -> Engine:
    """An :class:`Engine` for ``options`` (``Engine`` keyword arguments, plus the
    :class:`Budget` fields ``recent_turns`` / ``min_recent_turns`` / ``limit_tokens``).

    :param owner: what takes the options, for error messages (``"CompactionMiddleware"``).
    """
    opts = dict(options)
    extras = {k: opts.pop(k) for k in _BUDGET_EXTRAS if k in opts}
    unknown = sorted(set(opts) - _ENGINE_OPTIONS - {"dialect"})
    if unknown:
        raise ConfigError(f"{owner}: unknown option(s) {', '.join(unknown)}; options are the "
                          f"Engine's ({', '.join(sorted(_ENGINE_OPTIONS))}) and "
                          f"{', '.join(_BUDGET_EXTRAS)}")
    opts.pop("dialect", None)
    if extras:
        if opts.get("budget") is not None:
            raise ConfigError(f"{owner}: give budget= or {'/'.join(sorted(extras))}=, not both")
        trigger = opts.pop("trigger_tokens", None)
        if trigger is None:
            raise ConfigError(f"{owner}: {'/'.join(sorted(extras))}= needs trigger_tokens=")
        opts["budget"] = Budget(trigger_tokens=trigger, target_tokens=opts.pop(
            "target_tokens", None), **extras)
    if opts.get("budget") is None and opts.get("trigger_tokens") is None:
        raise ConfigError(f"{owner}: give engine=, budget= or trigger_tokens=")
    for key in ("trigger_tokens", "target_tokens"):
        value = opts.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{owner}: {key} must be a positive int, got "
                              f"{type(value).__name__} {value!r}")
    opts.setdefault("strategy", default_strategy)
    opts.setdefault("plugins", plugins)
    opts.setdefault("episode_id", episode_id)
    return Engine(dialect=dialect, **opts)


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
