"""Input prices with prompt caching, per model, and the cost of one model call.

Prices are US dollars per million input tokens (list prices, standard tier, prompts up to
200k tokens; long-context surcharges and batch discounts are not modelled). How a call is
billed:

* **Anthropic** (automatic caching at the end of every request, as Claude Code does, 5-minute
  cache): the prefix shared with the previous request is a cache read (0.1× input); the rest
  is written to the cache (1.25× input).
* **OpenAI** (automatic prefix caching): the shared prefix is a cache read (0.1× input for
  gpt-5.x, 0.25× for gpt-4.1, 0.5× for gpt-4o); the rest is plain input (writes are free).

Both providers cache only prefixes above ~1,024 tokens and evict idle caches after minutes;
the replay assumes every call hits what the previous call wrote (agents call back-to-back).

Built-in table (``PRICES``; $/MTok — input / cache read / cache write):

=======================  =========  ======  ======  ======
model                    provider   input   read    write
=======================  =========  ======  ======  ======
claude-opus-4-6          anthropic  5.00    0.50    6.25
claude-opus-4-5          anthropic  5.00    0.50    6.25
claude-opus-4-1          anthropic  15.00   1.50    18.75
claude-opus-4            anthropic  15.00   1.50    18.75
claude-sonnet-4-6        anthropic  3.00    0.30    3.75
claude-sonnet-4-5        anthropic  3.00    0.30    3.75
claude-sonnet-4          anthropic  3.00    0.30    3.75
claude-haiku-4-5         anthropic  1.00    0.10    1.25
gpt-5.2                  openai     1.75    0.175   1.75
gpt-5.1                  openai     1.25    0.125   1.25
gpt-5                    openai     1.25    0.125   1.25
gpt-5-mini               openai     0.25    0.025   0.25
gpt-5-nano               openai     0.05    0.005   0.05
gpt-4.1                  openai     2.00    0.50    2.00
gpt-4.1-mini             openai     0.40    0.10    0.40
gpt-4.1-nano             openai     0.10    0.025   0.10
gpt-4o                   openai     2.50    1.25    2.50
gpt-4o-mini              openai     0.15    0.075   0.15
=======================  =========  ======  ======  ======

``--price anthropic`` uses ``claude-sonnet-4-5`` and ``--price openai`` uses ``gpt-5`` unless
``--model`` names another. Override or extend the table with a JSON or TOML file::

    {"default": "my-model",
     "models": {"my-model": {"provider": "openai", "input": 0.8, "cache_read": 0.2}}}

``cache_write`` defaults to 1.25× input for ``anthropic`` and 1× for any other provider.
Prices change: check the providers' pricing pages and pass a file when they do.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = [
    "DEFAULT_MODELS",
    "PRICES",
    "ModelPrice",
    "call_cost",
    "load_price_file",
    "resolve_price",
]


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """$/MTok of one model: uncached input, cache reads, cache writes."""

    model: str
    provider: str
    input: float
    cache_read: float
    cache_write: float

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "provider": self.provider, "input": self.input,
                "cache_read": self.cache_read, "cache_write": self.cache_write}


def _anthropic(model: str, price: float) -> ModelPrice:
    return ModelPrice(model, "anthropic", price, round(price * 0.1, 6), round(price * 1.25, 6))


def _openai(model: str, price: float, read_share: float) -> ModelPrice:
    return ModelPrice(model, "openai", price, round(price * read_share, 6), price)


PRICES: dict[str, ModelPrice] = {p.model: p for p in (
    _anthropic("claude-opus-4-6", 5.0),
    _anthropic("claude-opus-4-5", 5.0),
    _anthropic("claude-opus-4-1", 15.0),
    _anthropic("claude-opus-4", 15.0),
    _anthropic("claude-sonnet-4-6", 3.0),
    _anthropic("claude-sonnet-4-5", 3.0),
    _anthropic("claude-sonnet-4", 3.0),
    _anthropic("claude-haiku-4-5", 1.0),
    _openai("gpt-5.2", 1.75, 0.1),
    _openai("gpt-5.1", 1.25, 0.1),
    _openai("gpt-5", 1.25, 0.1),
    _openai("gpt-5-mini", 0.25, 0.1),
    _openai("gpt-5-nano", 0.05, 0.1),
    _openai("gpt-4.1", 2.0, 0.25),
    _openai("gpt-4.1-mini", 0.4, 0.25),
    _openai("gpt-4.1-nano", 0.1, 0.25),
    _openai("gpt-4o", 2.5, 0.5),
    _openai("gpt-4o-mini", 0.15, 0.5),
)}

#: the model a bare ``--price PROVIDER`` uses
DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-5"}


def call_cost(price: ModelPrice, tokens: int, cached: int) -> float:
    """Input cost in dollars of a call sending ``tokens`` of which ``cached`` are a cache hit."""
    return (cached * price.cache_read + (tokens - cached) * price.cache_write) / 1e6


def load_price_file(path: str | Path) -> tuple[dict[str, ModelPrice], str | None]:
    """Models and the default model name from a JSON or TOML price file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        if p.suffix.lower() == ".toml":
            data = _toml(raw)
        else:
            data = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read price file {p}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("models", {}), dict):
        raise ConfigError(f"price file {p}: expected an object with a 'models' table")
    models = {name: _entry(p, name, spec) for name, spec in data.get("models", {}).items()}
    default = data.get("default")
    if default is not None and not isinstance(default, str):
        raise ConfigError(f"price file {p}: 'default' must be a model name")
    return models, default


def _toml(raw: bytes) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib.loads(raw.decode())


def _entry(path: Path, name: str, spec: Any) -> ModelPrice:
    if not isinstance(spec, dict) or "input" not in spec:
        raise ConfigError(f"price file {path}: model {name!r} needs at least 'input' ($/MTok)")
    provider = str(spec.get("provider", "openai"))
    try:
        price = float(spec["input"])
        read = float(spec.get("cache_read", price * 0.1))
        write = float(spec.get("cache_write", price * (1.25 if provider == "anthropic" else 1)))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"price file {path}: model {name!r}: {exc}") from exc
    return ModelPrice(name, provider, price, read, write)


def resolve_price(price: str | None, model: str | None, dialect: str) -> ModelPrice:
    """The price to use for ``--price`` / ``--model`` on a session of ``dialect``.

    ``price`` is ``anthropic``, ``openai``, a JSON/TOML file, or ``None`` (the provider of
    the dialect). ``model`` picks a row; the provider's default model otherwise.
    """
    table = dict(PRICES)
    default: str | None = None
    if price in (None, "", "auto"):
        provider = "anthropic" if dialect == "anthropic" else "openai"
    elif price in DEFAULT_MODELS:
        provider = price
    else:
        models, default = load_price_file(price)
        table.update(models)
        provider = models[default].provider if default in models else "openai"
    name = model or default or DEFAULT_MODELS[provider]
    try:
        return table[name]
    except KeyError:
        raise ConfigError(
            f"no price for model {name!r}; known: {', '.join(sorted(table))} "
            "(or pass --price FILE)") from None
