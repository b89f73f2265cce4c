"""The proxy's configuration: one dataclass, filled from defaults, ``AGENTCOMPACT_*``
environment variables and command-line flags (in increasing precedence)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from agentcompact.errors import ConfigError

from .._threaded_server import DEFAULT_KEEP_ALIVE

__all__ = ["DEFAULT_ANTHROPIC_UPSTREAM", "DEFAULT_GEMINI_UPSTREAM", "DEFAULT_OPENAI_UPSTREAM",
           "ENV_PREFIX", "ProxyConfig"]

DEFAULT_ANTHROPIC_UPSTREAM = "https://api.anthropic.com"
DEFAULT_OPENAI_UPSTREAM = "https://api.openai.com"
DEFAULT_GEMINI_UPSTREAM = "https://generativelanguage.googleapis.com"
ENV_PREFIX = "AGENTCOMPACT_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass
class ProxyConfig:
    """Settings of one proxy process.

    Every field ``name`` can be set by the environment variable ``AGENTCOMPACT_<NAME>``
    (``AGENTCOMPACT_TRIGGER``, ``AGENTCOMPACT_ANTHROPIC_UPSTREAM``…; booleans accept
    1/0, true/false, yes/no, on/off; ``strategy_options`` is a JSON object).

    :param host: interface to bind (loopback by default: the proxy forwards credentials).
    :param port: TCP port; 0 picks a free one.
    :param strategy: a strategy name from the plugin registry (``cliff``, ``summary``…).
    :param strategy_options: keyword arguments for the strategy's factory.
    :param trigger: compact when a request (its messages, system prompt, instructions and
        tool schemas) exceeds this many tokens.
    :param target: bring it down to at most this many (default: the request's fixed part
        plus ``DEFAULT_TARGET_SHARE`` (0.26) of what the trigger leaves besides it, at
        least 6,000 tokens of it and at most half; ``Budget.target_for``).
    :param counter: token counter spec (``tiktoken``, ``tiktoken:ENC``, ``hf:PATH``, ``chars``).
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
        store's (``strategy_options["archive"]``); ``agentcompact mcp --archive`` serves
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
    strategy: str = "cliff"
    strategy_options: dict[str, Any] = field(default_factory=dict)
    trigger: int = 100_000
    target: int | None = None
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

    def __post_init__(self) -> None:
        if self.archive and "archive" not in self.strategy_options:
            self.strategy_options = {**self.strategy_options, "archive": self.archive}
        _check_numbers(self)
        if self.target is not None and not 0 < self.target <= self.trigger:
            raise ConfigError(f"target must be in (0, trigger={self.trigger}], got {self.target}")
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
        """Defaults, then ``AGENTCOMPACT_*`` variables, then ``overrides`` (``None`` skipped)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> ProxyConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


#: numeric settings: name -> (least value, whether the least is allowed, the flag's meaning)
_NUMBERS: dict[str, tuple[float, bool, str]] = {
    "trigger": (1, True, "a token count"),
    "max_sessions": (1, True, "sessions kept in memory"),
    "connect_timeout": (0, False, "seconds"),
    "read_timeout": (0, False, "seconds"),
}


def _check_numbers(config: ProxyConfig) -> None:
    """Refuse at start a numeric setting no request could work with (``--max-sessions
    -1`` would fail every request), naming the flag, its variable and what it takes."""
    for name, (least, inclusive, meaning) in _NUMBERS.items():
        value = getattr(config, name)
        kind = int if isinstance(getattr(ProxyConfig, name, 0), int) else float
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
