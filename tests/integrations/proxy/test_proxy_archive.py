"""A proxied session keeps an archive beside it (``--archive``): after a proxy restart the
archive still answers an expand of every handle the compaction message named, and the
restarted proxy sends the same compaction bytes (prompt cache)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from agentcompact import Budget, tenant_of
from agentcompact._archive import SQLiteArchive, open_archive

from .conftest import ProxyFactory, Upstream
from .histories import anthropic_history

pytestmark = pytest.mark.network
_HANDLE = re.compile(r"ac-[0-9a-f]{12}")
KEY = "sk-ant-archive-test"  # the tenant: --archive names a file others may share


def run_session(start_proxy: ProxyFactory, upstream: Upstream, path: Path) -> str:
    proxy = start_proxy(budget=Budget(3000, 1500), counter="chars", archive=str(path))
    history = anthropic_history(14)
    body = {"model": "sim-model", "max_tokens": 64, "messages": history}
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        response = client.post("/v1/messages", content=orjson.dumps(body),
                               headers={"content-type": "application/json",
                                        "x-session-id": "archived", "x-api-key": KEY})
    assert response.status_code == 200
    sent = orjson.loads(upstream.tap.sent[-1].request)["messages"]
    compaction = next(m for m in sent if m["role"] == "user" and isinstance(
        m["content"], list) and m["content"][0].get("text", "").startswith("[agentcompact"))
    proxy.stop()
    return str(compaction["content"][0]["text"])


def test_archive_answers_expand_after_a_restart(start_proxy: ProxyFactory, upstream: Upstream,
                                                tmp_path: Path) -> None:
    path = tmp_path / "sessions" / "archive.sqlite"
    first = run_session(start_proxy, upstream, path)
    handles = sorted(set(_HANDLE.findall(first)))
    assert handles
    cached = open_archive(str(path))  # this process's connection: close it, as a restart
    assert cached is not None and hasattr(cached, "close")
    cached.close()
    again = run_session(start_proxy, upstream, path)
    assert again == first  # byte-stable across the restart
    history = anthropic_history(14)
    view = SQLiteArchive(tmp_path / "elsewhere.sqlite").for_tenant(tenant_of(KEY))
    originals = {view.handle_of(b["content"]): b["content"]  # type: ignore[attr-defined]
                 for m in history if isinstance(m["content"], list) for b in m["content"]
                 if b.get("type") == "tool_result" and isinstance(b.get("content"), str)}
    code = ("import sys; from agentcompact import tenant_of; "
            "from agentcompact._archive import SQLiteArchive; "
            "from agentcompact._expand import expand; "
            "a = SQLiteArchive(sys.argv[1]).for_tenant(tenant_of(sys.argv[2])); "
            "print('\\x00'.join(expand(a, h, 0, 10**6).text for h in sys.argv[3:]), end='')")
    out = subprocess.run([sys.executable, "-c", code, str(path), KEY, *handles],
                         capture_output=True, check=True, text=True).stdout
    texts = out.split("\x00")
    assert len(texts) == len(handles)
    for handle, text in zip(handles, texts):
        assert view.handle_of(text) == handle  # type: ignore[attr-defined]  # verbatim
    assert any(h in originals for h in handles)  # tool results among them
