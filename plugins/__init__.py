"""First-party plugins built only on the public hooks (the trajectory recorder, …).

The plugin manager lives in ``agentcompact._pluginmanager``; its public functions are
re-exported here so ``from agentcompact.plugins import get_plugin_manager`` works too.
"""

from __future__ import annotations

from agentcompact._pluginmanager import (
    get_dialect,
    get_plugin_manager,
    get_strategy_factory,
    load_plugins,
    new_plugin_manager,
    registry,
)

__all__ = [
    "get_dialect",
    "get_plugin_manager",
    "get_strategy_factory",
    "load_plugins",
    "new_plugin_manager",
    "registry",
]
