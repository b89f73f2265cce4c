"""The MCP server driven by the ``mcp`` SDK's own client over stdio (a subprocess running
``agentcompact mcp``), against an archive file another process wrote."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentcompact import tenant_of
from agentcompact._archive import ArchivedItem, SQLiteArchive

mcp = pytest.importorskip("mcp")
from mcp import ClientSession, StdioServerParameters  # noqa: E402  # after the skip
from mcp.client.stdio import stdio_client  # noqa: E402

KEY = "sk-ant-mcp-test"  # the tenant: an --archive file is scoped per credential
ORIGINAL = "".join(f"line {i}: résumé \u2603 {'x' * (i % 7)}\n" for i in range(2_000))


def _text(result: object) -> str:
    content = getattr(result, "content", [])
    return "".join(getattr(c, "text", "") for c in content)


async def test_mcp_client_expands_and_searches(tmp_path: Path) -> None:
    path = tmp_path / "state" / "archive.sqlite"
    archive = SQLiteArchive(path)
    mine = archive.for_tenant(tenant_of(KEY))
    handle = mine.handle_of(ORIGINAL)  # type: ignore[attr-defined]
    mine.put_many([ArchivedItem(handle, ORIGINAL, f"[turn 3 · result of Bash · expand "
                                                  f"{handle}]")])
    archive.close()
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "agentcompact", "mcp", "--archive", str(path), "--page-chars", "5000"],
        env={"ANTHROPIC_API_KEY": KEY})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        names = {t.name for t in (await session.list_tools()).tools}
        assert names == {"expand", "search_dropped"}
        pages: list[str] = []
        offset: int | None = 0
        while offset is not None:
            text = _text(await session.call_tool("expand", {"handle": handle,
                                                            "offset": offset}))
            header, _, body = text.partition("\n")
            assert header.startswith(f"[agentcompact expand {handle}: chars {offset}-")
            pages.append(body)
            offset = int(header.rsplit("offset=", 1)[1].rstrip(")]")) if "more:" in header \
                else None
        assert "".join(pages) == ORIGINAL and len(pages) > 1
        found = _text(await session.call_tool("search_dropped", {"query": "LINE 1999:"}))
        assert handle in found and "line 1999: résumé" in found
        missing = _text(await session.call_tool("expand", {"handle": "ac-000000000000"}))
        assert missing == "[agentcompact expand: unknown handle ac-000000000000: not in this " \
                          "archive]"
