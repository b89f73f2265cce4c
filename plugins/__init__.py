"""First-party plugins built only on the public hooks (the trajectory recorder, …).

The plugin manager's public functions are re-exported here (and from ``agentcompact``), so
``from agentcompact.plugins import get_plugin_manager`` works.
"""

from __future__ import annotations

from agentcompact import get_dialect, get_plugin_manager, new_plugin_manager
from agentcompact.extending import get_strategy_factory, load_plugins, registry

__all__ = [
    "get_dialect",
    "get_plugin_manager",
    "get_strategy_factory",
    "load_plugins",
    "new_plugin_manager",
    "registry",
]
