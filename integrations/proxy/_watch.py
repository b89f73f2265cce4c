"""``agentcompact watch``: a live terminal view of a running proxy's sessions.

Reads ``GET /agentcompact/status`` every ``--interval`` seconds and shows, per session,
tokens in (what the client sent) and out (what went upstream), compactions, fallbacks,
errors and the cache share (the part of the tokens sent that repeated the previous
request's prefix: what a provider's prompt cache can serve), under the proxy's totals.
``--once`` prints one snapshot and exits.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from typing import Any

import orjson

__all__ = ["add_parser", "render", "run"]

DEFAULT_URL = "http://127.0.0.1:8719"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``watch`` to an ``argparse`` sub-parsers object; returns the new parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "watch", help="live view of a running proxy's sessions",
        description="A live terminal view of a running agentcompact proxy (its status page).")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the proxy (default {DEFAULT_URL})")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.set_defaults(func=run)
    return p


def render(status: dict[str, Any]) -> Any:
    """A rich renderable of one status snapshot."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text(
        f"agentcompact {status.get('version', '?')} · {status.get('strategy')} · trigger "
        f"{status.get('trigger', 0):,} · target {status.get('target', 0):,} · "
        f"{status.get('handled', 0)} requests · {status.get('compactions', 0)} compactions · "
        f"{status.get('fallbacks', 0)} fallbacks · {status.get('errors', 0)} errors · "
        f"{status.get('tokens_saved', 0):,} tokens saved")
    table = Table(expand=True)
    for name, justify in (("session", "left"), ("dialect", "left"), ("requests", "right"),
                          ("tokens in", "right"), ("tokens out", "right"),
                          ("compactions", "right"), ("fallbacks", "right"),
                          ("errors", "right"), ("cache share", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]  # a Literal
    for key, s in (status.get("sessions") or {}).items():
        errors = s.get("errors", 0)
        table.add_row(key, s.get("dialect", "?"), str(s.get("requests", 0)),
                      f"{s.get('tokens_in', 0):,}", f"{s.get('tokens_out', 0):,}",
                      str(s.get("compactions", 0)), str(s.get("fallbacks", 0)),
                      f"[red]{errors}[/red]" if errors else "0",
                      f"{s.get('cache_share', 0.0):.1%}")
    return Group(head, table)


def _fetch(opener: urllib.request.OpenerDirector, url: str) -> dict[str, Any]:
    """The status page as JSON; ``OSError`` (``URLError``, ``HTTPError``) or
    ``ValueError`` when there is none."""
    with opener.open(f"{url.rstrip('/')}/agentcompact/status", timeout=5) as response:
        data = orjson.loads(response.read())
    if not isinstance(data, dict):
        raise ValueError(f"status page is a JSON {type(data).__name__}, not an object")
    return data


def run(args: argparse.Namespace) -> int:
    """Show the view until interrupted (or once); returns the exit status."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    # no proxy from the environment: the status page is on loopback
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        status = _fetch(opener, args.url)
    except (OSError, ValueError) as exc:
        print(f"agentcompact watch: no proxy status at {args.url} ({type(exc).__name__}): "
              "start one (agentcompact proxy), or give its address with --url",
              file=sys.stderr)
        return 1
    if args.once:
        console.print(render(status))
        return 0
    with Live(render(status), console=console, refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(args.interval)
                try:
                    live.update(render(_fetch(opener, args.url)))
                except (OSError, ValueError):
                    continue  # the proxy restarting: keep the last view
        except KeyboardInterrupt:
            return 0
