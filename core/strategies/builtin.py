"""Default plugin registering the built-in strategies (``trylast``: plugins override)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..hookspecs import hookimpl
from .cliff import CliffStrategy
from .parallel import ParallelStrategy
from .summary import SummaryStrategy

__all__ = ["agentcompact_register_strategies"]


@hookimpl(trylast=True)
def agentcompact_register_strategies(register: Callable[..., Any]) -> None:
    register("cliff", CliffStrategy)
    register("summary", SummaryStrategy)
    register("parallel", ParallelStrategy)
