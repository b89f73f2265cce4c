"""Default plugin registering the built-in strategies (``trylast``: plugins override)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._hookspecs import hookimpl
from ._cliff import CliffStrategy
from ._parallel import ParallelStrategy
from ._summary import SummaryStrategy

__all__ = ["agentcompact_register_strategies"]


@hookimpl(trylast=True)
def agentcompact_register_strategies(register: Callable[..., Any]) -> None:
    register("cliff", CliffStrategy)
    register("summary", SummaryStrategy)
    register("parallel", ParallelStrategy)
