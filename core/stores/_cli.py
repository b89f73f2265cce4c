"""``agentcompact store stats|prune``: what the prefix store and archive hold, and their
bounds applied now.

``stats`` prints rows, bytes and ages per table and the file's size against its bounds;
``prune`` evicts what is past them (least recently used first; ``--max-bytes`` and
``--max-age-days`` for a tighter bound this once) and ``--vacuum`` shrinks the file to
what it holds. The store is the proxy's default (``sqlite:///<state dir>/store.sqlite``)
unless ``--store`` names another; a file that does not exist is reported, never created.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import StoreError
from . import _parse_bytes, backend_from_url, default_store_url

__all__ = ["add_parser", "run"]

#: an administrator's prune may wait longer for the file's lock than a request does
_ADMIN_TIMEOUT_S = 10.0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``store`` to an ``argparse`` sub-parsers object; returns the new parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "store", help="show or bound the prefix store and archive (stats, prune)",
        description="What the proxy's store holds (prefix entries and archived "
                    "originals) and its bounds; prune evicts the least recently used "
                    "past them. Example: agentcompact store prune --max-bytes 256MB")
    p.add_argument("action", choices=("stats", "prune"))
    p.add_argument("--store", metavar="URL", help="sqlite:///PATH or redis://HOST:PORT "
                   "(default: the proxy's default store in --state-dir)")
    p.add_argument("--state-dir", metavar="DIR", help="folder of the default store "
                   "(default $AGENTCOMPACT_STATE_DIR or ~/.agentcompact)")
    p.add_argument("--max-bytes", metavar="SIZE",
                   help="prune: bound the live size to SIZE (512MB, 2GB…) this once")
    p.add_argument("--max-age-days", type=float, metavar="DAYS",
                   help="prune: evict what is unused for DAYS this once")
    p.add_argument("--vacuum", action="store_true",
                   help="prune: then rewrite the file to its live size (locks it meanwhile)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run(args: argparse.Namespace) -> int:
    """Print the store's figures, or prune it; the exit status."""
    url = args.store or default_store_url(args.state_dir)
    try:
        backend = _open(url)
        bounds = _bounds(args)
        if args.action == "prune":
            removed = backend.prune(vacuum=args.vacuum, **bounds)
        stats = backend.stats()
    except StoreError as exc:
        return _fail(str(exc))
    except ValueError as exc:
        return _fail(f"{exc} (write --max-bytes as 512MB, 2GB or a byte count)")
    except OSError as exc:
        return _fail(f"{url}: {exc.strerror or type(exc).__name__}")
    except Exception as exc:
        if not isinstance(exc, getattr(backend, "errors", ())):
            raise
        return _fail(f"{backend.describe()}: {type(exc).__name__}: {exc} (try again)")
    finally:
        if "backend" in locals():
            backend.close()
    if args.action == "prune":
        stats["removed"] = removed
    print(json.dumps(stats) if args.json else _describe(stats))
    return 0


def _open(url: str) -> Any:
    backend, _ = backend_from_url(url)
    path = getattr(backend, "path", None)
    if isinstance(path, Path) and not path.exists():
        raise StoreError(f"no store at {path} (nothing to show or prune)")
    if hasattr(backend, "timeout"):
        backend.timeout = max(backend.timeout, _ADMIN_TIMEOUT_S)
    return backend


def _bounds(args: argparse.Namespace) -> dict[str, Any]:
    if args.action != "prune":
        return {}
    bounds: dict[str, Any] = {}
    if args.max_bytes is not None:
        bounds["max_bytes"] = _parse_bytes(args.max_bytes)
    if args.max_age_days is not None:
        if args.max_age_days < 0:
            raise StoreError("--max-age-days must be 0 or more")
        bounds["max_age_days"] = args.max_age_days
    return bounds


def _fail(message: str) -> int:
    print(f"agentcompact store: {message}", file=sys.stderr)
    return 1


def _describe(stats: dict[str, Any]) -> str:
    """The figures as a few lines of text."""
    lines = [stats["where"]]
    if "live_bytes" in stats:
        age = stats["max_age_days"]
        lines.append(f"  size: {_size(stats['live_bytes'])} live, "
                     f"{_size(stats['file_bytes'])} on disk; bound "
                     f"{_size(stats['max_bytes']) if stats['max_bytes'] else 'none'}, "
                     f"{f'{age:g} days unused' if age else 'no age bound'}")
    else:  # a Redis server
        limit = _size(stats["maxmemory"]) if stats["maxmemory"] else "none"
        lines.append(f"  server memory: {_size(stats['used_memory'] or 0)} (maxmemory "
                     f"{limit}, {stats['maxmemory_policy']}); entries expire {stats['ttl']} s "
                     "unused")
    for name in ("prefixes", "archive"):
        lines.append(f"  {name}: " + ", ".join(f"{k} {_value(k, v)}"
                                              for k, v in stats[name].items()))
    removed = stats.get("removed")
    if removed is not None:
        lines.append(f"  pruned: {removed.get('prefix_entries', 0)} prefix entries, "
                     f"{removed.get('dropped', 0)} archived originals")
    return "\n".join(lines)


def _value(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_use"):
        return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return _size(value) if key == "bytes" else str(value)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"
