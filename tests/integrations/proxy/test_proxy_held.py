"""Speculative forwarding end to end (real sockets): a session's request that extends a
body sent unchanged goes upstream held by its last byte while the engine works, then is
completed; when the engine changes the body after all, the held request is dropped
unfinished and only the engine's body reaches the upstream's application."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest

from agentcompact.integrations.proxy import ThreadedServer

from .conftest import ProxyFactory, Upstream
from .histories import anthropic_history

pytestmark = pytest.mark.network


def post(client: httpx.Client, messages: list[Any]) -> tuple[bytes, httpx.Response]:
    raw = orjson.dumps({"model": "sim-model", "max_tokens": 64, "messages": messages})
    return raw, client.post("/v1/messages", content=raw,
                            headers={"content-type": "application/json",
                                     "x-session-id": "held-1"})


def status(proxy: ThreadedServer) -> dict[str, Any]:
    return httpx.get(f"{proxy.base_url}/agentcompact/status").json()  # type: ignore[no-any-return]


def test_unchanged_requests_go_out_held_then_complete(start_proxy: ProxyFactory,
                                                      upstream: Upstream) -> None:
    proxy = start_proxy(trigger=200_000, counter="chars")
    full = anthropic_history(12)
    sent: list[bytes] = []
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        for turns in range(2, 12):
            raw, response = post(client, full[: 1 + 2 * turns])
            assert response.status_code == 200
            assert response.json()["type"] == "message"
            sent.append(raw)
    # the upstream's application saw every body once, complete and byte-identical
    assert [r.request for r in upstream.tap.sent] == sent
    assert all(r.completed for r in upstream.tap.sent)
    held = status(proxy)["held"]
    # the first request has no earlier body to extend; every later one went out held, and,
    # far under the trigger, was completed before its new messages were even tokenized
    assert held == {"sent": len(sent) - 1, "sent_early": len(sent) - 1, "dropped": 0}


def test_held_request_is_dropped_when_the_engine_changes_the_body(
        start_proxy: ProxyFactory, upstream: Upstream) -> None:
    # chars/4 counting; an image counts 1,600 tokens whatever its JSON's size, so a short
    # image block looks harmless by its bytes and still pushes the session over the trigger
    proxy = start_proxy(trigger=3000, target=1500, counter="chars")
    history = anthropic_history(6)
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        first, response = post(client, history)
        assert response.status_code == 200
        assert upstream.tap.sent[-1].request == first  # under the trigger: unchanged
        grown = [*history, {"role": "assistant", "content": "Here is the plot."},
                 {"role": "user", "content": [
                     {"type": "image",
                      "source": {"type": "url", "url": "https://example.test/a.png"}},
                     {"type": "text", "text": "What does this show?"}]}]
        raw, response = post(client, grown)
    assert response.status_code == 200
    assert response.json()["type"] == "message"
    dropped, final = upstream.tap.sent[-2], upstream.tap.sent[-1]
    # the held request: all but its last byte; the upstream saw its client leave
    assert dropped.request == raw[:-1]
    assert dropped.finished.wait(5)
    assert dropped.status == 499
    # what the engine decided went out on its own: compacted, complete, answered
    assert final.request != raw
    assert len(orjson.loads(final.request)["messages"]) < len(grown)
    assert final.completed and final.status == 200
    # the simulator's application only ever handled complete requests
    assert len(upstream.requests) == 2
    assert status(proxy)["held"] == {"sent": 0, "sent_early": 0, "dropped": 1}


def test_only_a_body_extending_one_sent_unchanged_is_held(
        start_proxy: ProxyFactory, upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:
    proxy = start_proxy(trigger=6000, target=3000, counter="chars", log_requests=True)
    full = anthropic_history(30)
    caplog.set_level(logging.INFO, logger="agentcompact.proxy")
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        for turns in range(1, 30):
            _, response = post(client, full[: 1 + 2 * turns])
            assert response.status_code == 200
    lines = [orjson.loads(r.getMessage()) for r in caplog.records
             if r.name == "agentcompact.proxy" and r.getMessage().startswith("{")]
    assert len(lines) == 29
    held = [line["held"] and line["held"].removesuffix("-early") for line in lines]
    modified = [line["modified"] for line in lines]
    assert "sent" in held[: modified.index(True)]  # growing under the trigger: held
    assert any(modified)
    for before, line in zip(lines, lines[1:], strict=False):
        if line["held"] is not None:
            assert not before["modified"]  # the body it extends went out unchanged
    # after the cliff every body is rewritten (the stored prefix substituted): none held
    assert all(h is None for h, m in zip(held, modified, strict=True) if m)
    assert status(proxy)["held"]["dropped"] == 0
    assert all(r.completed for r in upstream.tap.sent)


def test_held_request_waits_for_the_engine_when_its_bytes_could_reach_the_trigger(
        start_proxy: ProxyFactory, upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:
    # chars/4 counting: 1,200 new bytes look like <= 600 tokens to the guess (held), but
    # only their bytes bound them for certain (1,200 > the 1,000 left): the last byte waits
    # for the exact count (~300 tokens: unchanged), then goes
    proxy = start_proxy(trigger=3000, target=1500, counter="chars", log_requests=True)
    caplog.set_level(logging.INFO, logger="agentcompact.proxy")
    base = [{"role": "user", "content": "x" * 7900}]
    grown = [*base, {"role": "assistant", "content": "y" * 1150},
             {"role": "user", "content": "go on"}]
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        first, _ = post(client, base)
        raw, response = post(client, grown)
    assert response.status_code == 200
    assert [r.request for r in upstream.tap.sent] == [first, raw]
    lines = [orjson.loads(r.getMessage()) for r in caplog.records
             if r.name == "agentcompact.proxy" and r.getMessage().startswith("{")]
    assert [line["held"] for line in lines] == [None, "sent"]
    assert [line["modified"] for line in lines] == [False, False]
