"""Prompt-caching cost of a sequence of model calls.

Providers bill the part of a request that repeats the previous request's prefix at a
cache-read price, and the rest at the input price or a cache-write price. This module
measures, per call, the longest prefix (in whole messages) shared with the previous call,
and prices it. Prices are multiples of the input price (Anthropic: read 0.1×, 5-minute
write 1.25×; OpenAI: read 0.1–0.5× by model, writes free).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CacheCost", "CachePrices", "CallCost"]


@dataclass(frozen=True)
class CachePrices:
    """Prices as multiples of the uncached input price."""

    read: float = 0.1
    write: float = 1.25


@dataclass(frozen=True)
class CallCost:
    tokens: int
    cached: int
    cost: float


@dataclass
class CacheCost:
    """Accumulates calls; ``add(digests, tokens)`` per call, with per-message values."""

    prices: CachePrices = field(default_factory=CachePrices)
    calls: list[CallCost] = field(default_factory=list)
    _previous: Sequence[str] = ()

    def add(self, digests: Sequence[str], tokens: Sequence[int]) -> CallCost:
        shared = 0
        for a, b in zip(digests, self._previous):
            if a != b:
                break
            shared += 1
        cached = sum(tokens[:shared])
        total = sum(tokens)
        cost = cached * self.prices.read + (total - cached) * self.prices.write
        self._previous = list(digests)
        call = CallCost(total, cached, cost)
        self.calls.append(call)
        return call

    @property
    def total_tokens(self) -> int:
        return sum(c.tokens for c in self.calls)

    @property
    def cached_tokens(self) -> int:
        return sum(c.cached for c in self.calls)

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.total_tokens if self.total_tokens else 0.0

    @property
    def cost(self) -> float:
        return sum(c.cost for c in self.calls)

    @property
    def peak(self) -> int:
        return max((c.tokens for c in self.calls), default=0)
