"""Engine construction shared by the integrations: options checked when the integration is
built, with errors that name the option, never at the first model call."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import pluggy

from agentcompact import Dialect, Engine

from ..errors import ConfigError

__all__ = ["engine_from_options", "check_engine"]

_ENGINE_OPTIONS = frozenset(
    name for name in inspect.signature(Engine.__init__).parameters if name != "self")


def engine_from_options(dialect: str | Dialect, options: Mapping[str, Any], *,
                        plugins: pluggy.PluginManager | None, episode_id: str | None,
                        owner: str, default_strategy: str = "cliff") -> Engine:
    """An :class:`Engine` for ``options``: the ``Engine``'s own keyword arguments, the one
    vocabulary of every integration (``budget=Budget(trigger_tokens=...)``, ``strategy=``
    a name or a :class:`StrategySettings`, ``counter``, ``store``, ``strict``…); the
    integration supplies the dialect. A budget is required.

    :param owner: what takes the options, for error messages (``"CompactionMiddleware"``).
    """
    opts = dict(options)
    opts.pop("dialect", None)
    unknown = sorted(set(opts) - _ENGINE_OPTIONS)
    if unknown:
        raise ConfigError(f"{owner}: unknown option(s) {', '.join(unknown)}; options are the "
                          f"Engine's ({', '.join(sorted(_ENGINE_OPTIONS))}): budget figures go "
                          "in budget=Budget(trigger_tokens=...), strategy settings in "
                          "strategy=StrategySettings(name, ...)")
    if opts.get("budget") is None:
        raise ConfigError(f"{owner}: give engine= or budget=Budget(trigger_tokens=...)")
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
