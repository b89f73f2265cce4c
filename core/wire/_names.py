"""The names of the four provider protocols, as dialects and the proxy's routes spell them."""

from __future__ import annotations

__all__ = ["ANTHROPIC", "CHAT", "GEMINI", "RESPONSES"]

ANTHROPIC, CHAT, RESPONSES, GEMINI = "anthropic", "openai_chat", "openai_responses", "gemini"
