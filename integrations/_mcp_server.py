"""``agentcompact mcp``: the expand tools as an MCP server (stdio), over an archive file.

The proxy writes what it compacts away into the archive beside its store (by default
the SQLite file ``~/.agentcompact/store.sqlite``; ``--store redis://…`` for replicas;
``--archive PATH`` for a file of its own); this server lets Claude Code or Codex expand
it, with the official ``mcp`` Python SDK (extra ``mcp``). Tools: ``expand(handle,
offset=0)`` and ``search_dropped(query, limit=10)``, returning the originals verbatim.

Claude Code, beside a proxy with the default store::

    claude mcp add agentcompact -- agentcompact mcp

Codex (``~/.codex/config.toml``), beside replicas sharing a Redis store::

    [mcp_servers.agentcompact]
    command = "agentcompact"
    args = ["mcp", "--store", "redis://10.0.0.5:6379/0"]

Which archive: ``--archive PATH`` (or ``AGENTCOMPACT_ARCHIVE``), else ``--store URL`` (or
``AGENTCOMPACT_STORE``), else the proxy's default store (``--state-dir`` /
``AGENTCOMPACT_STATE_DIR``) — as ``agentcompact proxy`` chooses it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from .._archive import open_archive
from .._expand import DEFAULT_PAGE_CHARS
from ..stores import check_store_url, default_store_url
from .expand_tools import EXPAND_DESCRIPTION, SEARCH_DESCRIPTION, _functions

__all__ = ["add_parser", "build_server", "run"]

_INSTRUCTIONS = (
    "agentcompact compacts long conversations. Parts it dropped or truncated are named in "
    "the compaction message by a handle such as ac-3f9ac01b22de: call expand with that "
    "handle to read the original verbatim instead of re-running a tool; search_dropped "
    "finds dropped text by content."
)


def _server_class() -> Any:
    """``MCPServer`` (mcp 2.x), or ``FastMCP`` (its name in mcp 1.x)."""
    try:
        return importlib.import_module("mcp.server.mcpserver").MCPServer
    except ImportError:
        return importlib.import_module("mcp.server.fastmcp").FastMCP


def build_server(archive: str, page_chars: int = DEFAULT_PAGE_CHARS) -> Any:
    """The MCP server object (not started) serving the archive ``archive`` names: a
    SQLite file, or a store URL (``sqlite:///PATH``, ``redis://HOST:PORT``)."""
    expand, search_dropped = _functions(open_archive(archive), page_chars)
    server = _server_class()("agentcompact", instructions=_INSTRUCTIONS)
    server.tool(name="expand", description=EXPAND_DESCRIPTION)(expand)
    server.tool(name="search_dropped", description=SEARCH_DESCRIPTION)(search_dropped)
    return server


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("mcp", help="serve expand/search_dropped over an archive (MCP, "
                                        "stdio)")
    parser.add_argument("--archive", default=os.environ.get("AGENTCOMPACT_ARCHIVE"),
                        help="an archive file of its own (the proxy's --archive; default "
                             "$AGENTCOMPACT_ARCHIVE)")
    parser.add_argument("--store", default=os.environ.get("AGENTCOMPACT_STORE"),
                        help="the proxy's store URL, whose archive to serve (default "
                             "$AGENTCOMPACT_STORE, else the proxy's default store)")
    parser.add_argument("--state-dir", default=os.environ.get("AGENTCOMPACT_STATE_DIR"),
                        help="the proxy's --state-dir, for its default store")
    parser.add_argument("--page-chars", type=int, default=DEFAULT_PAGE_CHARS,
                        help="characters per expand page")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until stdin closes.

    :raises StoreError: ``--store`` is not a store URL (no scheme, an unknown one such as
        ``postgres://``, a malformed one such as ``rediss:/h:1``, an unknown option): the
        message names the accepted forms; nothing is created.
    """
    where = args.archive or args.store or default_store_url(args.state_dir)
    if not args.archive and check_store_url(where) == "memory":
        print("agentcompact mcp: a memory store is the proxy's own; give the proxy a "
              "sqlite:// or redis:// --store (or --archive PATH)", file=sys.stderr)
        return 2
    try:
        _server_class()
    except ImportError as exc:
        print(f"agentcompact mcp is unavailable ({exc}); pip install 'agentcompact[mcp]'",
              file=sys.stderr)
        return 2
    build_server(where, args.page_chars).run("stdio")
    return 0
