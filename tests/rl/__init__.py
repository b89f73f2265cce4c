"""Tests of agentcompact.rl (a package so that helpers import relatively)."""
