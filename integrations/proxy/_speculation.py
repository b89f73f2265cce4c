"""The proxy's speculation about an engine: what it can know before the engine has measured.

The proxy may start a body upstream, held back by its last byte, while the engine measures
it (``app._speculate``), and completes it before the engine is done when the engine is
certain to leave the body unchanged. That certainty is this module's: a token bound for
messages not tokenized yet, the prefix store's version, and the certificate combining them.
It reads the engine through its public attributes (``store``, ``budget``, ``pm``) and the
:class:`~agentcompact._tokens.MessageMeter` the proxy built it with (``watch``); nothing in
the engine serves it.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from agentcompact import Engine
from agentcompact.errors import ConfigError
from agentcompact.extending import MessageMeter

__all__ = ["Speculation"]


class Speculation:
    """The proxy's certainty checks on its engines (one object per proxy)."""

    def __init__(self) -> None:
        self._meters: weakref.WeakKeyDictionary[Engine, MessageMeter] = (
            weakref.WeakKeyDictionary())

    def watch(self, engine: Engine, meter: MessageMeter) -> Engine:
        """Speculate about ``engine``, built with ``meter`` as its counter (its per-message
        cache of counts is what the token bound reads). Returns ``engine``."""
        if engine.counter is not meter.counter or engine.dialect is not meter.dialect:
            raise ConfigError("Speculation.watch: the meter is not the engine's counter")
        self._meters[engine] = meter
        return engine

    @staticmethod
    def store_version(engine: Engine) -> int | None:
        """The engine's prefix-store ``version`` (changes on every ``put``), or ``None`` for
        a store without one. Read it before ``compact``: a put meanwhile makes it stale."""
        version = getattr(engine.store, "version", None)
        return version if isinstance(version, int) and not isinstance(version, bool) else None

    def token_bound(self, engine: Engine, messages: Sequence[Any]) -> int | None:
        """An upper bound on ``engine.count(messages)`` without tokenizing the messages not
        counted yet, or ``None`` when the engine's counter gives no such bound (or the
        engine is not watched). Safe beside a compaction of the same engine in another
        thread: it only looks up the meter's cache (a hit is an exact count, a miss is
        bounded by bytes), it never changes it."""
        meter = self._meters.get(engine)
        return None if meter is None else meter.bound(messages)

    def leaves_unchanged(self, engine: Engine, tokens_at_most: int,
                         since_version: int | None) -> bool:
        """Whether ``engine.compact`` (not forced) is certain to return a history unchanged,
        knowing that it holds at most ``tokens_at_most`` tokens (fixed tokens included),
        and that a history it extends was left unchanged when the prefix store's
        ``version`` was ``since_version``. Then no stored prefix can apply (none did to the
        shorter history, and none was put since) and the trigger is not reached. ``False``
        whenever that cannot be known: a store without a version, or a plugin deciding
        ``agentcompact_should_compact``."""
        return (since_version is not None and since_version == self.store_version(engine)
                and tokens_at_most <= engine.budget.trigger
                and not engine.pm.hook.agentcompact_should_compact.get_hookimpls())
