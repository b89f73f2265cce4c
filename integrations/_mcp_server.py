"""``agentcompact mcp``: the expand tools as an MCP server (stdio), over an archive file.

The proxy writes what it compacts away into an archive file (``agentcompact proxy
--archive PATH``); this server lets Claude Code or Codex expand it, with the official
``mcp`` Python SDK (extra ``mcp``). Tools: ``expand(handle, offset=0)`` and
``search_dropped(query, limit=10)``, returning the originals verbatim.

Claude Code::

    claude mcp add agentcompact -- agentcompact mcp --archive ~/.agentcompact/archive.sqlite

Codex (``~/.codex/config.toml``)::

    [mcp_servers.agentcompact]
    command = "agentcompact"
    args = ["mcp", "--archive", "/home/me/.agentcompact/archive.sqlite"]

The archive path may also come from ``AGENTCOMPACT_ARCHIVE``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from .._archive import SQLiteArchive
from .._expand import DEFAULT_PAGE_CHARS
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


def build_server(archive_path: str, page_chars: int = DEFAULT_PAGE_CHARS) -> Any:
    """The MCP server object (not started) serving the archive at ``archive_path``."""
    expand, search_dropped = _functions(SQLiteArchive(archive_path), page_chars)
    server = _server_class()("agentcompact", instructions=_INSTRUCTIONS)
    server.tool(name="expand", description=EXPAND_DESCRIPTION)(expand)
    server.tool(name="search_dropped", description=SEARCH_DESCRIPTION)(search_dropped)
    return server


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("mcp", help="serve expand/search_dropped over an archive (MCP, "
                                        "stdio)")
    parser.add_argument("--archive", default=os.environ.get("AGENTCOMPACT_ARCHIVE"),
                        help="the archive file (default: $AGENTCOMPACT_ARCHIVE)")
    parser.add_argument("--page-chars", type=int, default=DEFAULT_PAGE_CHARS,
                        help="characters per expand page")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not args.archive:
        print("agentcompact mcp: give --archive PATH (or set AGENTCOMPACT_ARCHIVE)",
              file=sys.stderr)
        return 2
    try:
        _server_class()
    except ImportError as exc:
        print(f"agentcompact mcp is unavailable ({exc}); pip install 'agentcompact[mcp]'",
              file=sys.stderr)
        return 2
    build_server(args.archive, args.page_chars).run("stdio")
    return 0
