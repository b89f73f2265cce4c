"""Tenants sharing one proxy and one Redis store (#36 item 4): what a tenant's
compactions drop is archived in its own scope, under handles keyed by its own key, and
``search_dropped`` / ``expand`` — the ``mcp`` SDK's client through ``agentcompact mcp``,
as docs/deploy.md configures it — see the caller's tenant only. Before, tenant B read
tenant A's ``AWS_SECRET=…`` through ``search_dropped`` and confirmed A's texts by their
unkeyed content-digest handles."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentcompact import SINGLE_TENANT, tenant_of
from agentcompact._archive import (
    ArchivedItem,
    MemoryArchive,
    TenantArchive,
    handle_of,
    open_archive,
)
from agentcompact.testing import RunningServer, UpstreamSim, serve
from tests.integrations.proxy.histories import anthropic_history

from .proxies import ProxyProcess

KEY_A, KEY_B = "sk-ant-tenant-a-0001", "sk-ant-tenant-b-0002"
SECRET_LINE = "AWS_SECRET=wJalrXUtnFEMI-tenant-a-only"
COMMON = "# build log shared by both tenants\n" + "compiling module\n" * 120
FLAGS = ["--trigger", "3000", "--target", "1500", "--counter", "chars"]
_HANDLE = re.compile(r"ac-[0-9a-f]{12}")


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningServer]:
    with serve(UpstreamSim()) as server:
        yield server


def history(private: str) -> list[dict[str, Any]]:
    """A coding session whose oldest tool results (dropped at the cliff) hold a text of
    this tenant's own and one both tenants' agents happened to read."""
    messages = anthropic_history(15)
    messages[2]["content"][0]["content"] = private + "\n" + "output line\n" * 150
    messages[4]["content"][0]["content"] = COMMON
    return messages


def send(proxy: ProxyProcess, key: str, messages: list[dict[str, Any]]) -> None:
    import httpx

    body = {"model": "claude-sim", "max_tokens": 32, "messages": messages}
    answer = httpx.post(proxy.url + "/v1/messages", json=body, timeout=60, headers={
        "x-api-key": key, "anthropic-version": "2023-06-01",
        "x-session-id": "the-same-session-id"})  # both clients name their session alike
    assert answer.status_code == 200, answer.status_code


def compaction_text(body: dict[str, Any]) -> str:
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, list) and content[0].get("text", "").startswith(
                "[agentcompact"):
            return str(content[0]["text"])
    raise AssertionError("no compaction message")


def mcp_session(url: str, key: str, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The tools' answers to ``calls``, through ``agentcompact mcp --store URL`` run with
    the tenant's API key in its environment (as Claude Code passes its own)."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def go() -> list[str]:
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "agentcompact", "mcp", "--store", url, "--page-chars", "100000"],
            env={"ANTHROPIC_API_KEY": key})
        out = []
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            for name, arguments in calls:
                result = await s.call_tool(name, arguments)
                out.append("".join(getattr(c, "text", "") for c in result.content))
        return out

    return anyio.run(go)


@pytest.mark.network
def test_tenant_b_can_neither_search_nor_expand_tenant_a(sim: RunningServer, redis_url: str,
                                                         tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="the 'mcp' extra is not installed")
    proxy = ProxyProcess(sim.base_url, redis_url, extra=FLAGS, log=tmp_path / "proxy.log")
    try:
        proxy.start()
        sim.sim.clear()  # type: ignore[union-attr]
        send(proxy, KEY_A, history(SECRET_LINE))
        send(proxy, KEY_B, history("# tenant b's notes"))
        status = proxy.status()
    finally:
        proxy.stop()
    sent_a, sent_b = [r.body for r in sim.requests if r.path == "/v1/messages"]
    handles_a = sorted(set(_HANDLE.findall(compaction_text(sent_a))))
    handles_b = sorted(set(_HANDLE.findall(compaction_text(sent_b))))
    assert handles_a and handles_b and not set(handles_a) & set(handles_b)
    assert len(status["sessions"]) == 2  # one session id, two tenants: two sessions
    # handles are keyed: the shared text has a handle per tenant, neither its digest
    view_a = TenantArchive(MemoryArchive(), tenant_of(KEY_A))
    view_b = TenantArchive(MemoryArchive(), tenant_of(KEY_B))
    assert view_a.handle_of(COMMON) in handles_a and view_b.handle_of(COMMON) in handles_b
    assert handle_of(COMMON) not in handles_a + handles_b

    calls = [("search_dropped", {"query": "AWS_SECRET"}),
             ("search_dropped", {"query": "output line", "limit": 50}),
             *[("expand", {"handle": h}) for h in handles_a]]
    as_b = mcp_session(redis_url, KEY_B, calls)
    assert as_b[0] == "[agentcompact search_dropped: nothing archived contains 'AWS_SECRET']"
    assert "wJalrXUtnFEMI" not in "".join(as_b)
    assert not set(_HANDLE.findall(as_b[1])) & set(handles_a)  # B's own parts only
    assert set(_HANDLE.findall(as_b[1])) <= set(handles_b)
    for handle, answer in zip(handles_a, as_b[2:]):
        assert answer == f"[agentcompact expand: unknown handle {handle}: not in this archive]"
    as_a = mcp_session(redis_url, KEY_A, calls)  # the positive control: A sees its own
    assert SECRET_LINE in as_a[0]
    assert all(a.startswith(f"[agentcompact expand {h}: chars 0-")
               for h, a in zip(handles_a, as_a[2:]))


def test_redis_keys_of_a_tenant_live_under_its_prefix(redis_url: str) -> None:
    """A tenant's originals and log are keys of their own (``<ns>t:<tenant>:``): a Redis
    ACL key pattern can confine a tenant's own credentials to them."""
    import redis

    tenant = tenant_of(KEY_A)
    view = open_archive(redis_url).for_tenant(tenant)  # type: ignore[union-attr]
    text = "archived for tenant a " * 20
    view.put_many([ArchivedItem(view.handle_of(text), text)])  # type: ignore[attr-defined]
    keys = sorted(k.decode() for k in redis.Redis.from_url(redis_url).keys("*"))
    prefix = f"agentcompact:t:{tenant.id}:"
    assert keys == [prefix + "a:" + view.handle_of(text), prefix + "alog"]  # type: ignore[attr-defined]
    assert KEY_A not in "".join(keys)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
def test_every_archive_keeps_tenants_apart(kind: str, tmp_path: Path,
                                           request: pytest.FixtureRequest) -> None:
    if kind == "memory":
        archive: Any = MemoryArchive()
    else:
        url = (f"sqlite:///{tmp_path}/store.sqlite" if kind == "sqlite"
               else request.getfixturevalue("redis_url"))
        archive = open_archive(url)
    a, b = archive.for_tenant(tenant_of(KEY_A)), archive.for_tenant(tenant_of(KEY_B))
    assert archive.for_tenant(SINGLE_TENANT) is archive
    text = SECRET_LINE + "\n" + "x" * 500
    handle = a.handle_of(text)
    a.put_many([ArchivedItem(handle, text, "[skim]")])
    archive.put_many([ArchivedItem(handle_of("single " * 40), "single " * 40)])
    assert a.get(handle) is not None and a.get(handle).text == text  # type: ignore[union-attr]
    assert b.get(handle) is None and archive.get(handle) is None
    assert [h.handle for h in a.search("aws_secret")] == [handle]
    assert b.search("AWS_SECRET") == [] and archive.search("AWS_SECRET") == []
    assert [h.text for h in archive.search("single")] == ["single " * 40]
    assert a.search("single") == []
    assert (len(a), len(b), len(archive)) == (1, 0, 1)
    if kind != "memory":  # another process: nothing cached
        archive.close()
        again = open_archive(url)
        assert again.for_tenant(tenant_of(KEY_A)).get(handle) is not None  # type: ignore[union-attr]
        assert again.for_tenant(tenant_of(KEY_B)).get(handle) is None  # type: ignore[union-attr]
        assert again.search("AWS_SECRET") == []  # type: ignore[union-attr]
        again.close()  # type: ignore[union-attr]


def test_a_tenant_secret_changes_every_id_and_handle() -> None:
    plain, salted = tenant_of(KEY_A), tenant_of(KEY_A, "deployment-secret")
    assert plain.id != salted.id and plain.handle_key != salted.handle_key
    assert tenant_of(KEY_A) == plain and tenant_of(KEY_B).id != plain.id
    assert KEY_A not in repr(plain) and repr(plain.handle_key) not in repr(plain)
    assert len(plain.id) == 16 and orjson.dumps(plain.id)


def test_mcp_takes_the_tenant_of_the_agents_credential(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mcp", reason="the 'mcp' extra is not installed")
    from agentcompact.errors import ConfigError
    from agentcompact.integrations._mcp_server import tenant_from_env

    assert tenant_from_env({"ANTHROPIC_API_KEY": KEY_A}) == tenant_of(KEY_A)
    assert tenant_from_env({"OPENAI_API_KEY": "sk-o", "AGENTCOMPACT_TENANT": KEY_B}) == \
        tenant_of(KEY_B)  # the explicit one first
    assert tenant_from_env({"ANTHROPIC_API_KEY": KEY_A, "AGENTCOMPACT_TENANT_SECRET": "s"}) \
        == tenant_of(KEY_A, "s")
    with pytest.raises(ConfigError, match="AGENTCOMPACT_TENANT") as info:
        tenant_from_env({})
    assert "\n" not in str(info.value)
    # a shared store and no credential: refused before serving anything
    from agentcompact._cli import main

    for name in ("AGENTCOMPACT_TENANT", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                 "OPENAI_API_KEY", "AGENTCOMPACT_TENANCY"):
        monkeypatch.delenv(name, raising=False)
    try:  # raised, or said in one line by a top-level handler of the command
        code = main(["mcp", "--store", f"sqlite:///{tmp_path}/store.sqlite"])
    except ConfigError as exc:
        assert "scoped per tenant" in str(exc)
    else:
        assert code != 0 and "scoped per tenant" in capsys.readouterr().err
