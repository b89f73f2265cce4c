"""Default plugin registering the built-in dialects (``trylast``: plugins override)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..hookspecs import hookimpl
from .anthropic import AnthropicDialect
from .openai_chat import OpenAIChatDialect
from .openai_responses import OpenAIResponsesDialect

__all__ = ["agentcompact_register_dialects"]

_BUILTIN = (AnthropicDialect(), OpenAIChatDialect(), OpenAIResponsesDialect())


@hookimpl(trylast=True)
def agentcompact_register_dialects(register: Callable[..., Any]) -> None:
    for dialect in _BUILTIN:
        register(dialect)
