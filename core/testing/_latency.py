"""How long the simulated provider takes: prefill, decode, time to first token, concurrency."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

__all__ = ["DecodePacer", "LatencyModel", "Slots"]


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Timings of a provider; the default answers instantly.

    A request waits ``ttft_s + input_tokens / prefill_tokens_per_s`` before its first token,
    then ``output_tokens / decode_tokens_per_s`` while generating (streams are paced token by
    token). Waits are ``asyncio.sleep``, so concurrent requests overlap as on a real provider,
    up to ``max_concurrency`` at once (None: unlimited); the rest queue.
    """

    ttft_s: float = 0.0
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    max_concurrency: int | None = None

    def prefill_s(self, input_tokens: int) -> float:
        rate = self.prefill_tokens_per_s
        return self.ttft_s + (input_tokens / rate if rate else 0.0)

    def decode_s(self, output_tokens: int) -> float:
        rate = self.decode_tokens_per_s
        return output_tokens / rate if rate else 0.0


class Slots:
    """The provider's concurrency limit, bound lazily to whichever event loop serves."""

    def __init__(self) -> None:
        self._semaphore: asyncio.Semaphore | None = None
        self._key: tuple[asyncio.AbstractEventLoop, int] | None = None

    @asynccontextmanager
    async def hold(self, limit: int | None) -> AsyncIterator[None]:
        """Occupy one of ``limit`` slots (None: no limit) while the block runs."""
        if limit is None:
            yield
            return
        key = (asyncio.get_running_loop(), limit)
        if self._semaphore is None or self._key != key:
            # a semaphore belongs to one loop, and the latency model may have been swapped
            self._semaphore, self._key = asyncio.Semaphore(limit), key
        async with self._semaphore:
            yield


class DecodePacer:
    """Sleeps so that token ``n`` leaves no earlier than ``n / rate`` after the first."""

    def __init__(self, tokens_per_s: float | None) -> None:
        self._rate = tokens_per_s
        self._start = time.monotonic()
        self._sent = 0

    async def advance(self, tokens: int) -> None:
        if not self._rate or tokens <= 0:
            return
        self._sent += tokens
        lag = self._start + self._sent / self._rate - time.monotonic()
        if lag > 0:
            await asyncio.sleep(lag)
