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

Whose originals: the tools see one tenant's (``agentcompact._tenants``), chosen as the
proxy chooses it (``--tenancy``, default ``auto``: by credential once ``--store`` or
``--archive`` is given, else the single tenant). The tenant is the credential the agent
authenticates with — ``AGENTCOMPACT_TENANT`` (an API key, or the value of the proxy's
``--tenant-header``), else ``ANTHROPIC_API_KEY``, ``ANTHROPIC_AUTH_TOKEN``,
``OPENAI_API_KEY`` — hashed with ``AGENTCOMPACT_TENANT_SECRET`` as the proxy does.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from agentcompact import SINGLE_TENANT, Tenant, open_archive, tenant_of
from agentcompact.errors import ConfigError
from agentcompact.extending import DEFAULT_PAGE_CHARS

from ..stores import check_store_url, default_store_url
from .expand_tools import EXPAND_DESCRIPTION, SEARCH_DESCRIPTION, _functions

__all__ = ["TENANT_VARIABLES", "add_parser", "build_server", "run", "tenant_from_env"]

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


#: where the tenant's credential is looked for, in order (the agent's own variables)
TENANT_VARIABLES = ("AGENTCOMPACT_TENANT", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                    "OPENAI_API_KEY")


def build_server(archive: Any, page_chars: int = DEFAULT_PAGE_CHARS,
                 tenant: Tenant = SINGLE_TENANT) -> Any:
    """The MCP server object (not started) serving ``tenant``'s part of the archive
    ``archive`` names: a SQLite file, a store URL (``sqlite:///PATH``,
    ``redis://HOST:PORT``), or an archive object."""
    found = open_archive(archive)
    if found is None:
        raise ConfigError("the expand server needs an archive: a SQLite path, a store URL "
                          "or an Archive object, not False")
    view = found.for_tenant(tenant) if hasattr(found, "for_tenant") else found
    expand, search_dropped = _functions(view, page_chars)
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
    parser.add_argument("--tenancy", choices=("auto", "credential", "single"),
                        default=os.environ.get("AGENTCOMPACT_TENANCY", "auto"),
                        help="as the proxy's --tenancy (default $AGENTCOMPACT_TENANCY, else "
                             "auto: by credential once --store or --archive is given); the "
                             "credential: $AGENTCOMPACT_TENANT, else the agent's API key "
                             "variable")
    parser.set_defaults(run=run)


def tenant_from_env(environ: dict[str, str] | None = None) -> Tenant:
    """The tenant of the credential in the environment (:data:`TENANT_VARIABLES`), hashed
    with ``AGENTCOMPACT_TENANT_SECRET`` as the proxy does.

    :raises ConfigError: no credential is set (the message names the variables)."""
    env = os.environ if environ is None else environ
    material = next((env[v] for v in TENANT_VARIABLES if env.get(v)), None)
    if material is None:
        raise ConfigError(
            "agentcompact mcp: this archive is scoped per tenant (a --store or --archive "
            f"was given): set {TENANT_VARIABLES[0]} to the API key the agent sends (or the "
            "proxy's --tenant-header value), or pass --tenancy single if the proxy runs "
            "with it")
    return tenant_of(material.strip(), env.get("AGENTCOMPACT_TENANT_SECRET") or None)


def run(args: argparse.Namespace) -> int:
    """Serve until stdin closes.

    :raises StoreError: ``--store`` is not a store URL (no scheme, an unknown one such as
        ``postgres://``, a malformed one such as ``rediss:/h:1``, an unknown option): the
        message names the accepted forms; nothing is created.
    """
    where = args.archive or args.store or default_store_url(args.state_dir)
    shared = bool(args.archive or args.store)
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
    archive = open_archive(where)  # the URL's options checked before the tenant
    scoped = args.tenancy == "credential" or (args.tenancy == "auto" and shared)
    tenant = tenant_from_env() if scoped else SINGLE_TENANT
    build_server(archive, args.page_chars, tenant).run("stdio")
    return 0
