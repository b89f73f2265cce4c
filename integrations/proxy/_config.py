"""The proxy's configuration: one dataclass, filled from defaults, ``AGENTCOMPACT_*``
environment variables and command-line flags (in increasing precedence).

The engine options are the Engine's own (``budget=Budget(...)``, ``strategy=`` a name or a
:class:`~agentcompact.StrategySettings`, ``counter=``), as for every integration; the flags
and variables ``--trigger``/``AGENTCOMPACT_TRIGGER``, ``--target``, ``--strategy``,
``--strategy-option``/``AGENTCOMPACT_STRATEGY_OPTIONS`` make them (:func:`engine_settings`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from agentcompact import Budget, StrategySettings
from agentcompact.errors import ConfigError

from .._threaded_server import DEFAULT_KEEP_ALIVE

__all__ = ["DEFAULT_ANTHROPIC_UPSTREAM", "DEFAULT_GEMINI_UPSTREAM", "DEFAULT_OPENAI_UPSTREAM",
           "ENV_PREFIX", "ProxyConfig", "engine_settings"]

DEFAULT_ANTHROPIC_UPSTREAM = "https://api.anthropic.com"
DEFAULT_OPENAI_UPSTREAM = "https://api.openai.com"
DEFAULT_GEMINI_UPSTREAM = "https://generativelanguage.googleapis.com"
ENV_PREFIX = "AGENTCOMPACT_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})
_DEFAULT_TRIGGER = 100_000


@dataclass
class ProxyConfig:
    """Settings of one proxy process.

    Every field ``name`` but ``budget`` and ``strategy`` can be set by the environment
    variable ``AGENTCOMPACT_<NAME>`` (``AGENTCOMPACT_ANTHROPIC_UPSTREAM``…; booleans accept
    1/0, true/false, yes/no, on/off); ``AGENTCOMPACT_TRIGGER``, ``_TARGET``, ``_STRATEGY``
    and ``_STRATEGY_OPTIONS`` (a JSON object) make those two (:func:`engine_settings`).
    A keyword that is not a field is a ``ConfigError`` saying where it goes.

    :param host: interface to bind (loopback by default: the proxy forwards credentials).
    :param port: TCP port; 0 picks a free one.
    :param strategy: as ``Engine(strategy=...)``: a strategy name from the plugin registry
        (``cliff``, ``summary``…) or a :class:`~agentcompact.StrategySettings` (a name with
        its factory's options); read back as settings. Each session's engine builds its own.
    :param budget: as ``Engine(budget=...)`` (default ``Budget(trigger_tokens=100_000)``):
        compact when a request (its messages, system prompt, instructions and tool schemas)
        exceeds ``trigger_tokens``, down to ``target_tokens``.
    :param counter: as ``Engine(counter=...)``: a token counter spec (``tiktoken``,
        ``tiktoken:ENC``, ``hf:PATH``, ``chars``).
    :param anthropic_upstream: base URL for Anthropic paths (request path appended).
    :param openai_upstream: base URL for every other path.
    :param gemini_upstream: base URL for Gemini API paths (``/v1beta/…``, ``…:generateContent``).
    :param record: run directory for the trajectory recorder (``--record``).
    :param shadow: compute and log compactions but forward every request unchanged.
    :param strict: refuse (HTTP 400, provider's error shape) a request still over budget.
    :param debug_dir: write each handled request's incoming and outgoing body here.
    :param reactive: on a provider context-length error, compact harder and replay once.
    :param max_sessions: sessions (each with its own engine) kept in memory, LRU.
    :param connect_timeout: seconds to connect to an upstream.
    :param read_timeout: seconds between two bytes of an upstream answer.
    :param log_requests: emit one JSON log line per handled request.
    :param keep_alive: seconds an idle client connection stays open, announced on every
        response as ``Keep-Alive: timeout=N`` (whole seconds, at least 1).
    :param store: where compacted prefixes and the archive of dropped originals live
        (``memory:``, ``sqlite:///PATH``, ``redis://HOST:PORT``); default (``None``): the
        SQLite file ``store.sqlite`` in ``state_dir``, so a restart keeps every session's
        prefix. Replicas given one shared URL send the same compacted prefixes and expand
        what any of them dropped (docs/deploy.md). ``memory:`` keeps both in the process.
    :param state_dir: the folder of the default store (default ``$AGENTCOMPACT_STATE_DIR``,
        else ``~/.agentcompact``; created 0700).
    :param archive: a SQLite file for the archive of dropped originals instead of the
        store's (the strategy's ``archive`` option); ``agentcompact mcp --archive`` serves
        expand from it.
    :param tenancy: how requests are scoped into tenants (``agentcompact._tenants``):
        ``credential`` (by the request's API key), ``single`` (one person's proxy), or
        ``auto`` (the default: ``credential`` once ``store`` or ``archive`` is given —
        a store others may share —, else ``single``).
    :param tenant_header: a header naming the tenant (set by a gateway in front that
        authenticates users); overrides the credential.
    :param tenant_secret: the key of the tenants' keyed hashes (environment only:
        ``AGENTCOMPACT_TENANT_SECRET``; the same on every replica and for
        ``agentcompact mcp``).
    """

    host: str = "127.0.0.1"
    port: int = 8719
    strategy: str | StrategySettings = "cliff"
    budget: Budget = field(default_factory=lambda: Budget(trigger_tokens=_DEFAULT_TRIGGER))
    counter: str = "tiktoken"
    anthropic_upstream: str = DEFAULT_ANTHROPIC_UPSTREAM
    openai_upstream: str = DEFAULT_OPENAI_UPSTREAM
    gemini_upstream: str = DEFAULT_GEMINI_UPSTREAM
    record: str | None = None
    shadow: bool = False
    strict: bool = False
    debug_dir: str | None = None
    reactive: bool = True
    max_sessions: int = 256
    connect_timeout: float = 30.0
    read_timeout: float = 600.0
    log_requests: bool = True
    keep_alive: float = DEFAULT_KEEP_ALIVE
    store: str | None = None
    state_dir: str | None = None
    archive: str | None = None
    tenancy: str = "auto"
    tenant_header: str | None = None
    tenant_secret: str | None = field(default=None, repr=False)

    def __new__(cls, *args: Any, **kwargs: Any) -> ProxyConfig:
        unknown = sorted(set(kwargs) - _FIELDS)
        if unknown:
            raise ConfigError(
                f"ProxyConfig: unknown setting(s) {', '.join(unknown)}; the engine's options "
                "are the Engine's: budget figures go in budget=Budget(trigger_tokens=..., "
                "target_tokens=...), strategy settings in strategy=StrategySettings(name, "
                "options={...})")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if isinstance(self.strategy, str):
            self.strategy = StrategySettings(self.strategy)
        if not isinstance(self.strategy, StrategySettings):
            raise ConfigError(f"ProxyConfig.strategy must be a strategy name or a "
                              f"StrategySettings (each session builds its own), got "
                              f"{type(self.strategy).__name__}")
        if not isinstance(self.budget, Budget):
            raise ConfigError(f"ProxyConfig.budget must be a Budget, got "
                              f"{type(self.budget).__name__}")
        options = self.strategy.options or {}
        if self.archive and "archive" not in options:
            self.strategy = dataclasses.replace(self.strategy,
                                                options={**options, "archive": self.archive})
        _check_numbers(self)
        if not (self.keep_alive >= 1 and math.isfinite(self.keep_alive)):
            raise ConfigError(f"keep_alive must be at least 1 second, got {self.keep_alive}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.store is not None:
            from agentcompact.stores import check_store_url

            check_store_url(self.store)  # its form now; its options when the store is made
        for name in ("anthropic_upstream", "openai_upstream", "gemini_upstream"):
            url = getattr(self, name)
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"{name} must be an http(s) URL, got {url!r}")
            setattr(self, name, url.rstrip("/"))

    @property
    def strategy_settings(self) -> StrategySettings:
        """``strategy`` as settings (what ``__post_init__`` made of a name)."""
        assert isinstance(self.strategy, StrategySettings)  # __post_init__ made it one
        return self.strategy

    def with_strategy_options(self, **options: Any) -> ProxyConfig:
        """A copy whose strategy has ``options`` added to its own."""
        settings = self.strategy_settings
        return self.replace(strategy=dataclasses.replace(
            settings, options={**(settings.options or {}), **options}))

    def shares_store(self) -> bool:
        """Whether a store or archive others may share was given (``tenancy="auto"``
        then scopes by credential)."""
        memory = self.store is not None and self.store.partition(":")[0].lower() == "memory"
        return (self.store is not None and not memory) or self.archive is not None

    def store_url(self) -> str:
        """``store``, or the default SQLite file in ``state_dir``."""
        from agentcompact.stores import default_store_url

        return self.store or default_store_url(self.state_dir)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ProxyConfig:
        """Defaults, then ``AGENTCOMPACT_*`` variables, then ``overrides`` (fields; ``None``
        skipped): the budget and strategy from the variables (:func:`engine_settings`)
        unless given."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = engine_settings(env)
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None and f.name not in _ENGINE_FIELDS:
                values[f.name] = _parse(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> ProxyConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


_FIELDS = frozenset(f.name for f in dataclasses.fields(ProxyConfig))
#: fields made from their own variables and flags (:func:`engine_settings`)
_ENGINE_FIELDS = frozenset({"budget", "strategy"})


def engine_settings(environ: Mapping[str, str], *, trigger: int | None = None,
                    target: int | None = None, strategy: str | None = None,
                    strategy_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``budget`` and ``strategy`` for :class:`ProxyConfig` from the flags ``--trigger``,
    ``--target``, ``--strategy``, ``--strategy-option`` (given here; ``None``: not given),
    else their ``AGENTCOMPACT_*`` variables, else the defaults (100,000 tokens, ``cliff``)."""
    def env(name: str, kind: str) -> Any:
        raw = environ.get(ENV_PREFIX + name.upper())
        return None if raw is None else _parse(name, kind, raw)

    trigger = trigger if trigger is not None else env("trigger", "int | None")
    target = target if target is not None else env("target", "int | None")
    trigger = _DEFAULT_TRIGGER if trigger is None else trigger
    _check_number("trigger", trigger, 1, True, "a token count", int)
    if target is not None and not 0 < target <= trigger:
        raise ConfigError(f"--target ({ENV_PREFIX}TARGET) must be in (0, --trigger={trigger}], "
                          f"got {target!r}")
    name = strategy if strategy is not None else env("strategy", "str")
    options = strategy_options if strategy_options is not None else env(
        "strategy_options", "dict[str, Any]")
    return {"budget": Budget(trigger_tokens=trigger, target_tokens=target),
            "strategy": StrategySettings(name or "cliff", options=options)}


#: numeric settings: name -> (least value, whether the least is allowed, the flag's meaning)
_NUMBERS: dict[str, tuple[float, bool, str]] = {
    "max_sessions": (1, True, "sessions kept in memory"),
    "connect_timeout": (0, False, "seconds"),
    "read_timeout": (0, False, "seconds"),
}


def _check_numbers(config: ProxyConfig) -> None:
    """Refuse at start a numeric setting no request could work with (``--max-sessions
    -1`` would fail every request), naming the flag, its variable and what it takes."""
    for name, (least, inclusive, meaning) in _NUMBERS.items():
        kind = int if isinstance(getattr(ProxyConfig, name, 0), int) else float
        _check_number(name, getattr(config, name), least, inclusive, meaning, kind)


def _check_number(name: str, value: Any, least: float, inclusive: bool, meaning: str,
                  kind: type) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and (kind is float or isinstance(value, int)) and value == value
          and value not in (float("inf"), float("-inf"))
          and (value >= least if inclusive else value > least))
    if not ok:
        bound = f">= {least:g}" if inclusive else f"> {least:g}"
        what = "an integer" if kind is int else "a finite number"
        raise ConfigError(f"--{name.replace('_', '-')} ({ENV_PREFIX}{name.upper()}) must "
                          f"be {what} {bound} ({meaning}), got {value!r}")


def _parse(name: str, kind: Any, raw: str) -> Any:
    kind = str(kind)
    try:
        if kind == "bool":
            low = raw.strip().lower()
            if low not in _TRUE | _FALSE:
                raise ValueError(raw)
            return low in _TRUE
        if kind.startswith("int"):
            return int(raw) if raw.strip() else None
        if kind == "float":
            return float(raw)
        if kind.startswith("dict"):
            value = orjson.loads(raw)
            if not isinstance(value, dict):
                raise ValueError(raw)
            return value
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind}") from None
    return raw or None if kind.endswith("None") else raw
