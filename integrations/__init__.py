"""Adapters between agentcompact and agent frameworks, SDKs and provider wire protocols."""

__all__: list[str] = []
