"""Which tenant a request is (#36 item 4): by its API key once the proxy has a store or
archive others may share, by a gateway's header with ``--tenant-header``, one tenant on
the default private store; sessions, engines and prefix-store keys are the tenant's."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from agentcompact import SINGLE_TENANT, Budget, tenant_of
from agentcompact.errors import ConfigError
from agentcompact.integrations.proxy import ProxyConfig
from agentcompact.integrations.proxy._tenancy import Tenancy, credential_of

from .conftest import ProxyFactory, Upstream
from .histories import anthropic_history

pytestmark = pytest.mark.network


def test_auto_scopes_by_credential_once_a_store_may_be_shared() -> None:
    def mode(**fields: object) -> str:
        config = ProxyConfig(**fields)  # type: ignore[arg-type]
        return Tenancy.of(config.tenancy, config.tenant_header, config.tenant_secret,
                          shared_store=config.shares_store()).mode

    assert mode() == "single"  # the default: a private file in the state folder
    assert mode(store="memory") == "single"
    assert mode(store="redis://h:6379/0") == "credential"
    assert mode(store="sqlite:///team.db") == "credential"
    assert mode(archive="/srv/archive.sqlite") == "credential"
    assert mode(tenancy="credential") == "credential"
    assert mode(store="redis://h:6379/0", tenancy="single") == "single"
    assert mode(tenant_header="X-Team-User") == "header"
    with pytest.raises(ConfigError, match="--tenancy must be one of"):
        mode(tenancy="per-user")
    with pytest.raises(ConfigError, match="--tenant-header"):
        mode(tenant_header="x-user", tenancy="single")
    assert "s3cr3t" not in repr(ProxyConfig(tenant_secret="s3cr3t"))
    assert ProxyConfig.from_env({"AGENTCOMPACT_TENANT_SECRET": "s"}).tenant_secret == "s"


def test_one_key_is_one_tenant_however_it_is_sent() -> None:
    tenancy = Tenancy("credential")
    by_key = tenancy.tenant({"x-api-key": "sk-1"})
    assert tenancy.tenant({"authorization": "Bearer sk-1"}) == by_key == tenant_of("sk-1")
    assert tenancy.tenant({"x-api-key": "sk-2"}) != by_key
    assert credential_of({}) == "" and tenancy.tenant({}) == tenant_of("")
    assert Tenancy("single").tenant({"x-api-key": "sk-1"}) is SINGLE_TENANT
    header = Tenancy("header", "x-team-user")
    assert header.tenant({"x-team-user": "alice", "x-api-key": "shared"}) == tenant_of("alice")
    assert header.tenant({"x-api-key": "shared"}) == tenant_of("shared")  # no header: key
    salted = Tenancy("credential", secret="deployment")
    assert salted.tenant({"x-api-key": "sk-1"}) == tenant_of("sk-1", "deployment") != by_key


def _post(proxy: object, key: str, session: str = "same-id") -> None:
    body = {"model": "m", "max_tokens": 64, "messages": anthropic_history(20)}
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:  # type: ignore[attr-defined]
        assert client.post("/v1/messages", json=body, headers={
            "x-api-key": key, "x-session-id": session}).status_code == 200


def test_two_tenants_with_one_session_id_are_two_sessions(
        start_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path) -> None:
    proxy = start_proxy(budget=Budget(3000), counter="chars", archive=str(tmp_path / "a.sqlite"))
    for key in ("sk-tenant-a", "sk-tenant-b", "sk-tenant-a"):
        _post(proxy, key)
    sessions = proxy.proxy.stats.snapshot()["sessions"]  # type: ignore[attr-defined]
    assert len(sessions) == 2 and sorted(s["requests"] for s in sessions.values()) == [1, 2]
    # the same history, two tenants: their compactions name different handles
    a, b = (r.body["messages"] for r in upstream.requests[:2])
    assert a != b and len(a) == len(b)


def test_one_person_on_the_default_store_keeps_one_scope(
        start_proxy: ProxyFactory, upstream: Upstream) -> None:
    proxy = start_proxy(budget=Budget(3000), counter="chars")  # tenancy auto, no store given
    for key in ("sk-oauth-token-1", "sk-oauth-token-2"):  # a token that rotated
        _post(proxy, key)
    sessions = proxy.proxy.stats.snapshot()["sessions"]  # type: ignore[attr-defined]
    assert len(sessions) == 1  # one session: its compacted prefix is reused
    assert upstream.requests[0].body["messages"] == upstream.requests[1].body["messages"]
