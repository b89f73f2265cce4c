"""Which strategy an :class:`~agentcompact._engine.Engine` builds, and with what settings.

``Engine(strategy="cliff")`` names a registered strategy with its defaults;
``Engine(strategy=StrategySettings("summary", model="qwen", base_url="http://…/v1"))``
names one with settings. The fields are checked when the object is made, each error naming
the field; the strategy factory's own check (a knob it does not take) follows when the
engine builds it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import ConfigError

__all__ = ["StrategySettings", "build_strategy"]

_SUMMARIZER_FIELDS = ("summarizer", "base_url", "model", "api_key")


@dataclass(frozen=True)
class StrategySettings:
    """A registered strategy's name and the keyword arguments its factory gets.

    :param name: a registered strategy name (``"cliff"``, ``"summary"``, ``"parallel"``, a
        plugin's).
    :param options: the factory's keyword arguments (``{"segments": 4}``; ``None``: none).
    :param summarizer: for the LLM strategies: a :class:`~agentcompact._summarizer.Summarizer`,
        or a dict of its settings.
    :param base_url: the summarizer's OpenAI-compatible base URL (with ``/v1``).
    :param model: the summarizer's model name.
    :param api_key: the summarizer's API key (never in ``repr``). Unset summarizer fields fall
        back to the ``AGENTCOMPACT_SUMMARIZER_*`` environment variables.

    A key given both in ``options`` and as a summarizer field is an error, not an override.
    """

    name: str = "cliff"
    options: Mapping[str, Any] | None = field(default_factory=dict)
    summarizer: Any = None
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"StrategySettings.name must be a strategy name, got "
                              f"{type(self.name).__name__}")
        if self.options is None:
            object.__setattr__(self, "options", {})
        if not isinstance(self.options, Mapping):
            raise ConfigError(f"StrategySettings.options must be a mapping of keyword "
                              f"arguments, got {type(self.options).__name__}")
        bad = sorted(repr(k) for k in self._options if not isinstance(k, str))
        if bad:
            raise ConfigError(f"StrategySettings.options keys must be str, got {', '.join(bad)}")
        object.__setattr__(self, "options", MappingProxyType(dict(self._options)))
        for name in ("base_url", "model", "api_key"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"StrategySettings.{name} must be a non-empty str, got "
                                  f"{type(value).__name__}")
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError("StrategySettings.base_url must be an http:// or https:// URL")
        if self.summarizer is not None and isinstance(self.summarizer, (str, bytes, int)):
            raise ConfigError(f"StrategySettings.summarizer must be a Summarizer or a dict of "
                              f"its settings, got {type(self.summarizer).__name__}")
        clash = sorted(set(self._options) & set(self._summarizer_kwargs()))
        if clash:
            raise ConfigError(f"StrategySettings: {', '.join(clash)} given twice (in options "
                              "and as a summarizer field)")

    @property
    def _options(self) -> Mapping[str, Any]:
        return self.options or {}

    def _summarizer_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in _SUMMARIZER_FIELDS[1:]
                               if getattr(self, k) is not None}
        if self.summarizer is not None:
            if isinstance(self.summarizer, Mapping):
                out.update(self.summarizer)
            else:
                out["summarizer"] = self.summarizer
        return out

    def factory_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for the strategy factory: ``options`` and the summarizer
        fields that are set."""
        return {**self._options, **self._summarizer_kwargs()}


def build_strategy(strategy: str | StrategySettings | Any,
                   factory_of: Callable[[str], Callable[..., Any]]
                   ) -> tuple[Any, dict[str, Any]]:
    """The strategy object for an engine's ``strategy=`` (a registered name, settings or an
    object), with the keyword arguments its factory got (``{}`` for an object given).

    :param factory_of: the registry's ``strategy_factory``.
    """
    if isinstance(strategy, str):
        strategy = StrategySettings(strategy)
    settings: dict[str, Any] = {}
    if isinstance(strategy, StrategySettings):
        factory = factory_of(strategy.name)
        settings = strategy.factory_kwargs()
        _check_settings(strategy.name, factory, settings)
        strategy = factory(**settings)
    if not callable(getattr(strategy, "compact", None)):
        raise ConfigError(f"strategy {strategy!r} has no compact(request) method")
    return strategy, settings


def _check_settings(name: str, factory: Callable[..., Any], settings: dict[str, Any]) -> None:
    """A clear error when a strategy does not take the given settings (``summarizer`` or
    ``model`` given to ``cliff``, a misspelt knob), before anything is constructed."""
    if not settings:
        return
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins / C callables: let the call decide
        return
    try:
        sig.bind(**settings)
    except TypeError as exc:
        raise ConfigError(f"strategy {name!r} does not take the settings "
                          f"{', '.join(sorted(settings))}: {exc}") from None
