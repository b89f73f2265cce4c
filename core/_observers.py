"""Reporting compaction events to the ``agentcompact_on_compaction`` observers."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pluggy

from ._check import describe_error
from ._events import CompactionEvent

__all__ = ["Observers"]

log = logging.getLogger("agentcompact")


class Observers:
    """Each event to every ``on_compaction`` observer, each observer on its own.

    The compaction was checked and stored before any observer runs, and it is what the
    caller sends: an observer that raises cannot undo it. So it does not stop the call
    (the result, the store, the caller's counters and the other observers — a recorder —
    all see the same compaction); it is warned about once per engine and plugin, by type
    only (its message may quote the history). A compaction that fell back to a lower rung
    is warned about once per engine (later ones go to the observers only)."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm
        self._failed: set[str] = set()
        self._warned = False

    def report(self, events: Sequence[CompactionEvent]) -> None:
        self._notify(events)
        failed = next((e for e in events if e.error), None)
        if failed is not None and not self._warned:
            self._warned = True
            log.warning("agentcompact: a %s compaction fell back to %s (%s); later fallbacks "
                        "of this engine go to on_compaction only", failed.strategy,
                        failed.fallback, failed.error)

    def _notify(self, events: Sequence[CompactionEvent]) -> None:
        hook = self._pm.hook.agentcompact_on_compaction
        impls = hook.get_hookimpls()
        if not impls:
            return
        plugins = list(dict.fromkeys(impl.plugin for impl in reversed(impls)))  # call order
        callers = [(plugin, hook if len(plugins) == 1 else self._pm.subset_hook_caller(
            "agentcompact_on_compaction", [p for p in plugins if p is not plugin]))
            for plugin in plugins]
        for event in events:
            for plugin, caller in callers:
                try:
                    caller(event=event)
                except Exception as exc:
                    self._failed_once(plugin, exc)

    def _failed_once(self, plugin: object, exc: Exception) -> None:
        name = self._pm.get_name(plugin)
        if not name or name == str(id(plugin)):  # registered without a name
            name = type(plugin).__qualname__
        if name in self._failed:
            return
        self._failed.add(name)
        log.warning("agentcompact: plugin %s failed in agentcompact_on_compaction (%s); the "
                    "compaction stands (validated, stored and sent) and the other observers "
                    "got it; later failures of this plugin in this engine are not logged",
                    name, describe_error(exc))
