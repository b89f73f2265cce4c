"""A plugin whose ``on_compaction`` raises, behind the proxy (#36 item 12): the request
goes out compacted, the status page counts the compaction, the recorder logged it with
the compacted model call, and the next request reuses it — all four agree. Before, the
first request went out unchanged, the second reused the stored entry, and the status
page counted no compaction while the recorder had logged one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agentcompact import Budget, CompactionEvent, hookimpl, new_plugin_manager

from .conftest import ProxyFactory, Upstream
from .histories import anthropic_history

pytestmark = pytest.mark.network


class Raising:
    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        raise RuntimeError("observer broke")


def _events(run: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (run / "events.jsonl").read_bytes().splitlines()]


def test_a_raising_observer_leaves_store_result_status_and_recorder_agreeing(
        start_proxy: ProxyFactory, upstream: Upstream, tmp_path: Path) -> None:
    pm = new_plugin_manager()
    pm.register(Raising())
    proxy = start_proxy(plugins=pm, record=str(tmp_path / "run"), budget=Budget(3000),
                        counter="chars")
    history = anthropic_history(20)
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:
        first = client.post("/v1/messages", json={"model": "m", "max_tokens": 64,
                                                  "messages": history})
        assert first.status_code == 200
        sent_first = upstream.requests[-1].body["messages"]
        assert len(sent_first) < len(history)  # went out compacted
        later = history + [{"role": "assistant", "content": "done"},
                           {"role": "user", "content": "thanks"}]
        second = client.post("/v1/messages", json={"model": "m", "max_tokens": 64,
                                                   "messages": later})
        assert second.status_code == 200
        status = client.get("/agentcompact/status").json()
    sent_second = upstream.requests[-1].body["messages"]
    assert sent_second[:len(sent_first)] == sent_first  # the stored prefix, reused
    assert status["compactions"] == 1
    proxy.stop()
    kinds = [e["kind"] for e in _events(tmp_path / "run") if e["kind"] != "run_start"]
    calls = [e["data"] for e in _events(tmp_path / "run") if e["kind"] == "model_call"]
    # the first request's compaction (a long history replays its crossings: one or more
    # events), then its call, then the second call reusing it with no new compaction
    first_call = kinds.index("model_call")
    assert first_call >= 1 and set(kinds[:first_call]) == {"compaction"}
    assert kinds[first_call:] == ["model_call", "model_call"]
    assert [c["compacted"] for c in calls] == [True, True]
    assert calls[0]["messages"] == sent_first
