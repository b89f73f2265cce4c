"""The transparent compaction proxy: point a harness's base URL at it.

Anthropic Messages (``/v1/messages``), OpenAI Chat Completions (``…/chat/completions``)
and OpenAI Responses (any path ending in ``/responses``) request bodies are compacted with
the engine; everything else passes through; responses (SSE included) are relayed as they
arrive. Fail-open, reactive retry on context-length errors, shadow and strict modes,
``--record`` for RL export. See ``docs/proxy.md``.

>>> from agentcompact.integrations.proxy import ProxyConfig, create_app   # doctest: +SKIP
>>> app = create_app(ProxyConfig(trigger=120_000))                        # doctest: +SKIP

Needs the ``proxy`` extra (starlette, uvicorn, aiohttp; httptools and uvloop, which
``agentcompact proxy`` serves with when installed).
"""

from __future__ import annotations

from .._threaded_server import ThreadedServer
from ._app import CompactionProxy, EnginePool, ProxyApp, create_app
from ._config import DEFAULT_ANTHROPIC_UPSTREAM, DEFAULT_OPENAI_UPSTREAM, ProxyConfig

__all__ = [
    "DEFAULT_ANTHROPIC_UPSTREAM",
    "DEFAULT_OPENAI_UPSTREAM",
    "CompactionProxy",
    "EnginePool",
    "ProxyApp",
    "ProxyConfig",
    "ThreadedServer",
    "create_app",
]
