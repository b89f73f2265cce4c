"""The plugin manager: hook specs, built-in default plugins, entry-point loading.

``get_plugin_manager()`` returns the process-wide manager, built lazily on first use:
built-in dialects and strategies are registered as ``trylast`` default plugins, then
installed plugins are loaded from the ``agentcompact`` entry-point group. Set
``AGENTCOMPACT_LOAD_PLUGINS=name1,name2`` to load only those entry points (empty string:
none). The built-in rules plugin (``agentcompact.plugins.rules``: pins rule-like user text)
is a default plugin too; ``AGENTCOMPACT_PIN_RULES=0`` leaves it out, and
``pm.unregister(name="agentcompact.plugins.rules")`` removes it from one manager.
``AGENTCOMPACT_TRACE_HOOKS=1`` logs every hook call
(pluggy's hook-call monitoring).

Tests and embedders use ``new_plugin_manager()`` for a fresh, isolated manager.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

from . import _hookspecs as hookspecs
from .errors import ConfigError, PluginError

if TYPE_CHECKING:
    from .dialects._base import Dialect

__all__ = [
    "DEFAULT_PLUGINS",
    "Registry",
    "get_dialect",
    "get_plugin_manager",
    "get_strategy_factory",
    "load_plugins",
    "new_plugin_manager",
    "registry",
]

log = logging.getLogger("agentcompact")

DEFAULT_PLUGINS = (
    "agentcompact.dialects._builtin",
    "agentcompact.strategies._builtin",
    "agentcompact.plugins.rules",
)
#: default plugins a user may turn off, and the environment variable that does it
_OPTIONAL_DEFAULTS = {"agentcompact.plugins.rules": "AGENTCOMPACT_PIN_RULES"}
_OFF = frozenset({"0", "false", "no", "off"})

_pm: pluggy.PluginManager | None = None
_lock = threading.Lock()


def new_plugin_manager(*, load_entry_points: bool = False) -> pluggy.PluginManager:
    """A fresh manager with the hook specs and the built-in default plugins."""
    import importlib

    pm = pluggy.PluginManager("agentcompact")
    pm.add_hookspecs(hookspecs)
    for name in DEFAULT_PLUGINS:
        switch = _OPTIONAL_DEFAULTS.get(name)
        if switch and os.environ.get(switch, "").strip().lower() in _OFF:
            continue
        pm.register(importlib.import_module(name), name=name)
    if load_entry_points:
        load_plugins(pm)
    if os.environ.get("AGENTCOMPACT_TRACE_HOOKS"):
        pm.trace.root.setwriter(lambda msg: log.debug("%s", msg))
        pm.enable_tracing()
    return pm


def load_plugins(pm: pluggy.PluginManager) -> None:
    """Load installed plugins from the ``agentcompact`` entry-point group (idempotent).

    ``AGENTCOMPACT_LOAD_PLUGINS`` restricts loading to the named entry points.
    """
    allow = os.environ.get("AGENTCOMPACT_LOAD_PLUGINS")
    names = None if allow is None else {n.strip() for n in allow.split(",") if n.strip()}
    for ep in metadata.entry_points(group="agentcompact"):
        if (names is not None and ep.name not in names) or pm.has_plugin(ep.name):
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:
            raise PluginError(f"plugin {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
    if names:
        missing = names - {ep.name for ep in metadata.entry_points(group="agentcompact")}
        if missing:
            raise PluginError(
                f"AGENTCOMPACT_LOAD_PLUGINS names plugins that are not installed: "
                f"{', '.join(sorted(missing))}"
            )


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with installed plugins loaded (lazily, once)."""
    global _pm
    if _pm is None:
        with _lock:
            if _pm is None:
                _pm = new_plugin_manager(load_entry_points=True)
    return _pm


class Registry:
    """Strategies and dialects contributed through the registration hooks of one manager.

    Built on demand and rebuilt when the set of registered plugins changes.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self._key: tuple[int, ...] = ()
        self._strategies: dict[str, Callable[..., Any]] = {}
        self._dialects: dict[str, Dialect] = {}

    def _refresh(self) -> None:
        key = tuple(id(p) for p in self.pm.get_plugins())
        if key == self._key:
            return
        strategies: dict[str, Callable[..., Any]] = {}
        dialects: dict[str, Dialect] = {}

        def register_strategy(name: str, factory: Callable[..., Any]) -> None:
            if not callable(factory):
                raise PluginError(f"strategy {name!r}: factory {factory!r} is not callable")
            strategies.setdefault(name, factory)

        def register_dialect(dialect: Dialect) -> None:
            if not getattr(dialect, "name", ""):
                raise PluginError(f"dialect {dialect!r} has no name")
            dialects.setdefault(dialect.name, dialect)

        # Hook results run from the last registered (and tryfirst) plugin to trylast
        # defaults; setdefault keeps the first, so plugins override the built-ins.
        self.pm.hook.agentcompact_register_strategies(register=register_strategy)
        self.pm.hook.agentcompact_register_dialects(register=register_dialect)
        self._strategies, self._dialects, self._key = strategies, dialects, key

    def strategy_factory(self, name: str) -> Callable[..., Any]:
        self._refresh()
        try:
            return self._strategies[name]
        except KeyError:
            raise ConfigError(
                f"unknown strategy {name!r}; registered: {', '.join(sorted(self._strategies))}"
            ) from None

    def dialect(self, name: str) -> Dialect:
        self._refresh()
        try:
            return self._dialects[name]
        except KeyError:
            raise ConfigError(
                f"unknown dialect {name!r}; registered: {', '.join(sorted(self._dialects))}"
            ) from None

    def strategy_names(self) -> list[str]:
        self._refresh()
        return sorted(self._strategies)

    def dialect_names(self) -> list[str]:
        self._refresh()
        return sorted(self._dialects)


_registries: dict[int, Registry] = {}


def registry(pm: pluggy.PluginManager | None = None) -> Registry:
    """The registry of ``pm`` (default: the process-wide manager)."""
    pm = pm or get_plugin_manager()
    reg = _registries.get(id(pm))
    if reg is None or reg.pm is not pm:
        reg = _registries[id(pm)] = Registry(pm)
    return reg


def get_dialect(name: str, pm: pluggy.PluginManager | None = None) -> Dialect:
    """The dialect registered under ``name``."""
    return registry(pm).dialect(name)


def get_strategy_factory(name: str, pm: pluggy.PluginManager | None = None) -> Callable[..., Any]:
    """The strategy factory registered under ``name``."""
    return registry(pm).strategy_factory(name)
