"""Adapters between agentcompact and agent frameworks, SDKs and provider wire protocols."""
