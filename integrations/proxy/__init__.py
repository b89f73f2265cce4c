"""The transparent compaction proxy: point a harness's base URL at it.

Anthropic Messages (``/v1/messages``), OpenAI Chat Completions (``…/chat/completions``)
and OpenAI Responses (any path ending in ``/responses``) request bodies are compacted with
the engine; everything else passes through; responses (SSE included) are relayed as they
arrive. Fail-open, reactive retry on context-length errors, shadow and strict modes,
``--record`` for RL export; with ``--rl-tokenizer`` an RL rollout gateway (``GatewayConfig``,
``docs/gateway.md``). See ``docs/proxy.md``.

>>> from agentcompact import Budget                                        # doctest: +SKIP
>>> from agentcompact.integrations.proxy import ProxyConfig, create_app   # doctest: +SKIP
>>> app = create_app(ProxyConfig(budget=Budget(trigger_tokens=120_000)))  # doctest: +SKIP

Needs the ``proxy`` extra (starlette, uvicorn, aiohttp; httptools and uvloop, which
``agentcompact proxy`` serves with when installed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._threaded_server import ThreadedServer
from ._app import CompactionProxy, EnginePool, ProxyApp, create_app
from ._config import DEFAULT_ANTHROPIC_UPSTREAM, DEFAULT_OPENAI_UPSTREAM, ProxyConfig

if TYPE_CHECKING:
    from ._gateway import GatewayConfig, RLGateway


def __getattr__(name: str) -> Any:
    """The RL gateway's names, imported on first use (it needs the export extra)."""
    if name in ("GatewayConfig", "RLGateway"):
        from . import _gateway

        return getattr(_gateway, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_ANTHROPIC_UPSTREAM",
    "DEFAULT_OPENAI_UPSTREAM",
    "CompactionProxy",
    "EnginePool",
    "GatewayConfig",
    "ProxyApp",
    "ProxyConfig",
    "RLGateway",
    "ThreadedServer",
    "create_app",
]
