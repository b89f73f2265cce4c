"""What the integrations into agent hosts share (LiteLLM, the OpenAI Agents SDK, PydanticAI,
Google ADK): one engine per conversation when a single hook object serves many, and the id
of the conversation a request belongs to. No framework is imported here.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import pluggy

from agentcompact import ConfigError, Dialect, Engine, InMemoryPrefixStore
from agentcompact.dialects import digest_of

from ._options import engine_from_options

__all__ = ["Conversations", "conversation_key"]

#: conversations whose engine is kept (LRU); a forgotten one starts with a cold engine
DEFAULT_MAX_CONVERSATIONS = 256


def conversation_key(dialect: Dialect, messages: Sequence[Any], *, scope: str = "",
                     client_id: str | None = None, fixed: Any = None) -> str:
    """A short stable id for the conversation ``messages`` belong to, within ``scope`` (a
    tenant: one API key's conversations never share an engine with another's).

    ``client_id`` (a session id the client sent) wins; otherwise the digest of the
    conversation's root: ``fixed`` (the system prompt or instructions) and the messages up to
    and including the first user message, which every later request of the conversation
    repeats. Hashed: nothing the client sent appears in the id.
    """
    if client_id:
        source = f"client\0{scope}\0{client_id}"
    else:
        parts = [scope, digest_of(fixed)]
        for message in messages:
            parts.append(dialect.digest(message))
            if dialect.role(message) == "user":
                break
        source = "root\0" + "\0".join(parts)
    return hashlib.blake2b(source.encode(), digest_size=8).hexdigest()


class Conversations:
    """One :class:`Engine` per conversation key, LRU-bounded, built from ``options`` (the
    ``Engine`` keyword arguments of :func:`engine_from_options`, checked at once) or copied from
    ``engine``'s settings. Engines share one prefix store (keys are scoped by episode: the
    conversation key is each engine's ``episode_id``)."""

    def __init__(self, dialect: Dialect, options: Mapping[str, Any], *,
                 engine: Engine | None = None, plugins: pluggy.PluginManager | None = None,
                 owner: str, max_conversations: int = DEFAULT_MAX_CONVERSATIONS) -> None:
        if not isinstance(max_conversations, int) or max_conversations < 1:
            raise ConfigError(f"{owner}: max_conversations must be a positive int, got "
                              f"{max_conversations!r}")
        if engine is not None and options:
            raise ConfigError(f"{owner}: give engine= or engine options, not both")
        if engine is not None and not isinstance(engine, Engine):
            raise ConfigError(f"{owner}: engine must be an agentcompact Engine, got "
                              f"{type(engine).__name__}")
        self.dialect, self.owner, self.max = dialect, owner, max_conversations
        self._options = dict(options)
        self._template = engine
        if engine is None:
            self._options.setdefault("store", InMemoryPrefixStore())
            # options are checked now, at construction, never at the first model call
            self._template = engine_from_options(dialect, self._options, plugins=plugins,
                                                 episode_id=None, owner=owner)
        self.plugins = self._template.pm if self._template is not None else plugins
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def template(self) -> Engine:
        """The engine whose settings every conversation's engine copies."""
        assert self._template is not None
        return self._template

    def get(self, key: str) -> Engine:
        """The engine of conversation ``key`` (built on first use)."""
        with self._lock:
            engine = self._engines.pop(key, None)
            if engine is None:
                engine = self._new(key)
            self._engines[key] = engine
            while len(self._engines) > self.max:
                self._engines.popitem(last=False)
            return engine

    def __len__(self) -> int:
        return len(self._engines)

    def _new(self, key: str) -> Engine:
        t = self.template
        return Engine(strategy=t.strategy, dialect=self.dialect, budget=t.budget,
                      counter=t.counter, store=t.store, plugins=t.pm, strict=t.strict,
                      episode_id=key)
