"""Message dialects: one module per wire format of messages.

Look a dialect up by name with ``agentcompact.get_dialect(name)`` (plugins may add
their own); the built-in ones are importable here too.
"""

from __future__ import annotations

from ._anthropic import AnthropicDialect
from ._base import Dialect, Part, digest_of, head_tail, truncated
from ._gemini import GeminiDialect
from ._openai_chat import OpenAIChatDialect
from ._openai_responses import OpenAIResponsesDialect

__all__ = [
    "AnthropicDialect",
    "Dialect",
    "GeminiDialect",
    "OpenAIChatDialect",
    "OpenAIResponsesDialect",
    "Part",
    "digest_of",
    "head_tail",
    "truncated",
]
