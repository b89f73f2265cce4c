"""Default plugin registering the built-in dialects (``trylast``: plugins override)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._hookspecs import hookimpl
from ._anthropic import AnthropicDialect
from ._gemini import GeminiDialect
from ._openai_chat import OpenAIChatDialect
from ._openai_responses import OpenAIResponsesDialect

__all__ = ["agentcompact_register_dialects"]

_BUILTIN = (AnthropicDialect(), OpenAIChatDialect(), OpenAIResponsesDialect(), GeminiDialect())


@hookimpl(trylast=True)
def agentcompact_register_dialects(register: Callable[..., Any]) -> None:
    for dialect in _BUILTIN:
        register(dialect)
