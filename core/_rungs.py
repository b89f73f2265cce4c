"""The fallback chain, and driving the pipeline through it.

The engine's pipeline is a generator: it yields ``(rung, CompactionRequest)`` whenever a
rung must render and is sent back ``(Rendered | None, error | None)``. :class:`Rungs`
renders for each rung (the configured strategy, then the default cliff, then the safe cut
the pipeline renders itself) and drives a pipeline to its outcome, synchronously
(:meth:`Rungs.run`) or awaiting strategies that define ``acompact``
(:meth:`Rungs.arun`): the only difference between the sync and async APIs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ._archive import handles_keyed
from ._check import describe_error
from .errors import ConfigError, DialectError
from .strategies._base import CompactionRequest, Rendered
from .strategies._cliff import CliffStrategy

if TYPE_CHECKING:
    from .dialects._base import Dialect

__all__ = ["Rungs"]

_T = TypeVar("_T")
Answer = tuple[Rendered | None, str | None]
Pipeline = Generator[tuple[str, CompactionRequest], Answer, _T]


class Rungs:
    """The rungs a compaction tries in order, and how each renders (fail-open: a rung
    that raises or returns something else than a :class:`Rendered` yields an error and
    the next rung renders)."""

    def __init__(self, strategy: Any, name: str) -> None:
        self.strategy = strategy
        self.name = name
        self.fallback = CliffStrategy()

    @property
    def names(self) -> tuple[str, ...]:
        if isinstance(self.strategy, CliffStrategy) and self.strategy == self.fallback:
            return ("strategy", "safe")  # the strategy is the default cliff: no second try
        return ("strategy", "cliff", "safe")

    def label(self, rung: str) -> str:
        """The rung's name in events and entries: the strategy's own for ``"strategy"``."""
        return self.name if rung == "strategy" else rung

    def trusted(self, rung: str) -> bool:
        """Whether the rung's token count is taken as given (the engine's own renderers);
        a third-party strategy's message is counted again."""
        return rung == "safe" or isinstance(self._of(rung), CliffStrategy)

    def handles(self) -> contextlib.AbstractContextManager[None]:
        """Handles made during a call (skim lines, truncation markers) keyed by the tenant
        of the strategy's archive, if it has one (``agentcompact._archive``)."""
        key = getattr(getattr(self.strategy, "archive", None), "handle_key", None)
        return handles_keyed(key) if key is not None else contextlib.nullcontext()

    # A DialectError names the message it is about by index and type (found again on
    # this error path only, so the hot path pays nothing for it).
    def run(self, gen: Pipeline[_T], dialect: Dialect, messages: Sequence[Any]) -> _T:
        """Drive ``gen`` to its outcome, rendering each rung synchronously."""
        try:
            step = next(gen)
            while True:
                step = gen.send(self._render(*step))
        except StopIteration as stop:
            outcome: _T = stop.value
        except DialectError:
            _name_bad_message(dialect, messages)
            raise
        return outcome

    async def arun(self, gen: Pipeline[_T], dialect: Dialect, messages: Sequence[Any]) -> _T:
        """Drive ``gen`` to its outcome, awaiting strategies that define ``acompact``."""
        try:
            step = next(gen)
            while True:
                step = gen.send(await self._arender(*step))
        except StopIteration as stop:
            outcome: _T = stop.value
        except DialectError:
            _name_bad_message(dialect, messages)
            raise
        return outcome

    def _of(self, rung: str) -> Any:
        return self.strategy if rung == "strategy" else self.fallback

    def _render(self, rung: str, request: CompactionRequest) -> Answer:
        try:
            rendered = self._of(rung).compact(request)
            if inspect.isawaitable(rendered):
                close = getattr(rendered, "close", None)
                if close is not None:
                    close()
                raise ConfigError(f"strategy {self.name!r} is async-only: use acompact")
            return _rendered_or_error(rendered)
        except Exception as exc:  # fail-open: the next rung renders
            return None, describe_error(exc)

    async def _arender(self, rung: str, request: CompactionRequest) -> Answer:
        strategy = self._of(rung)
        try:
            acompact = getattr(strategy, "acompact", None)
            if acompact is not None:
                return _rendered_or_error(await acompact(request))
            rendered = strategy.compact(request)
            if inspect.isawaitable(rendered):
                rendered = await rendered
            return _rendered_or_error(rendered)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return None, describe_error(exc)


def _rendered_or_error(rendered: Any) -> Answer:
    if not isinstance(getattr(rendered, "tokens", None), int) or not hasattr(rendered,
                                                                              "message"):
        return None, (f"PluginError: the strategy returned a {type(rendered).__name__}, not "
                      "a Rendered")
    return rendered, None


def _name_bad_message(dialect: Dialect, msgs: Sequence[Any]) -> None:
    """On the error path only: raise the dialect's error again naming the index and type
    of the first message it cannot read (never its content)."""
    for i, message in enumerate(msgs):
        try:
            dialect.role(message)
            dialect.parts(message)
        except DialectError as exc:
            raise DialectError(f"message {i} ({type(message).__name__}): {exc}") from None
