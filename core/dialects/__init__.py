"""Message dialects: one module per wire format of messages.

Look a dialect up by name with ``agentcompact.get_dialect(name)`` (plugins may add
their own); the built-in ones are importable here too.
"""

from __future__ import annotations

from .anthropic import AnthropicDialect
from .base import Dialect, Part, digest_of, head_tail
from .openai_chat import OpenAIChatDialect
from .openai_responses import OpenAIResponsesDialect

__all__ = [
    "AnthropicDialect",
    "Dialect",
    "OpenAIChatDialect",
    "OpenAIResponsesDialect",
    "Part",
    "digest_of",
    "head_tail",
]
