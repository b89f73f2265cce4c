"""The prefix store's scope: which stored compactions an engine may reuse.

Chain digests key the prefix store; they are seeded with the engine's settings fingerprint
(:func:`settings_fingerprint`: everything that changes its output for a history) and its
episode, so engines of other settings or episodes sharing a store never reuse each other's
compactions. :class:`StoreScope` keeps the seed current (a plugin that pins or renders
registered later changes it), extends the history of each call under it and finds the stored
prefix of a history.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pluggy
import xxhash

from ._history import History, HistoryCache
from ._pins import PinLookup
from ._store import PrefixEntry, PrefixScan, PrefixStore
from ._tokens import MessageMeter
from .dialects._base import Dialect

__all__ = ["FINGERPRINT_HOOKS", "StoreScope", "settings_fingerprint"]

#: the hooks whose plugins shape the output (their set is part of the fingerprint)
FINGERPRINT_HOOKS = ("agentcompact_pin", "agentcompact_render_message",
                     "agentcompact_summary_prompt")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable_repr(value: Any, depth: int = 0) -> str:
    """A repr without memory addresses (the same in every process)."""
    if depth < 3 and hasattr(value, "__dict__") and not isinstance(value, type):
        items = sorted((str(k), _stable_repr(v, depth + 1)) for k, v in vars(value).items())
        return f"{type(value).__qualname__}{items}"
    if depth < 3 and isinstance(value, dict):
        return "{" + ",".join(sorted(f"{k!r}:{_stable_repr(v, depth + 1)}"
                                     for k, v in value.items())) + "}"
    return _ADDRESS.sub("", repr(value))


def settings_fingerprint(strategy: Any, strategy_name: str, settings: dict[str, Any],
                         budget: Any, dialect: Dialect, counter: Any,
                         pm: pluggy.PluginManager) -> str:
    """A digest of everything that changes an engine's output for a given history: the
    strategy (its own ``fingerprint()``, else its factory ``settings``, else its repr), the
    budget, the dialect, the counter, the plugins that pin or render."""
    own = getattr(strategy, "fingerprint", None)
    if callable(own):
        own = own()
    text = own if isinstance(own, str) else _stable_repr(settings if settings else strategy)
    plugins = sorted(
        f"{name}:{pm.get_name(impl.plugin)}:{impl.function.__qualname__}"
        for name in FINGERPRINT_HOOKS
        for impl in getattr(pm.hook, name).get_hookimpls())
    # classes by qualified name, never by module path: moving a module must not start
    # every persistent store cold (a class of another name still keys apart)
    parts = ["agentcompact-store-3", strategy_name, type(strategy).__qualname__,
             text, repr(budget), dialect.name, type(dialect).__qualname__,
             str(getattr(counter, "name", type(counter).__qualname__)), *plugins]
    return xxhash.xxh3_128_hexdigest("\x00".join(parts).encode("utf-8", "surrogatepass"))


class StoreScope:
    """The seed of an engine's chain digests (its fingerprint and episode), the histories
    extended under it and the lookups of stored prefixes, under the engine's lock.

    :param fingerprint: the engine's settings fingerprint, computed when the seed changes.
    :param pins: the engine's pin memo, forgotten with the plugin set it belongs to.
    """

    def __init__(self, meter: MessageMeter, store: PrefixStore, pm: pluggy.PluginManager,
                 pins: PinLookup, fingerprint: Callable[[], str], episode_id: str | None,
                 lock: threading.RLock) -> None:
        self.episode_id = episode_id
        self.lock = lock
        self._histories = HistoryCache(meter)
        self._scan = PrefixScan(store)
        self._pins = pins
        self._fingerprint = fingerprint
        self._shaping_hooks = tuple(getattr(pm.hook, name) for name in FINGERPRINT_HOOKS)
        self._plugins_key: tuple[Any, ...] | None = None

    def refresh(self, force: bool = False) -> None:
        """Recompute the seed when the plugins that shape the output changed (``force``:
        the episode did)."""
        key = tuple(impl.function for caller in self._shaping_hooks
                    for impl in caller.get_hookimpls())
        if not force and key == self._plugins_key:
            return
        self._plugins_key = key
        self._pins.forget()
        seed = xxhash.xxh3_128_hexdigest(
            f"{self._fingerprint()}\x00{self.episode_id or ''}".encode("utf-8", "surrogatepass"))
        if seed != self._histories.seed:
            self._histories.forget(seed)
            self._scan.forget()

    def history(self, messages: Sequence[Any] | History, resolve: bool = False) -> History:
        """The :class:`History` of ``messages`` (extended from the last call's); with
        ``resolve``, its messages all counted. Given a history, that history resolved."""
        with self.lock:
            if isinstance(messages, History):
                return self._histories.resolve(messages)
            self.refresh()
            history = self._histories.extend(messages)
            return self._histories.resolve(history) if resolve else history

    def lookup(self, history: History, n: int) -> PrefixEntry | None:
        """The stored entry replacing the longest prefix of ``history.messages[:n]``."""
        with self.lock:
            return self._scan.find(history.chain, n)
