"""Held forwarding end to end (real sockets): a request whose declared length may stay
under the trigger goes upstream while its body still arrives, held by its last byte
until the engine has decided, then is completed; when the engine changes the body after
all, the held request is dropped unfinished and only the engine's body reaches the
upstream's application. These proxies hold every body of two bytes or more (the default
holds only bodies of 64 KiB or more: below that the body's trip is negligible)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from agentcompact import Budget
from agentcompact.integrations.proxy import ThreadedServer

from .conftest import ProxyFactory, Upstream
from .histories import anthropic_history

pytestmark = pytest.mark.network


def post(client: httpx.Client, messages: list[Any]) -> tuple[bytes, httpx.Response]:
    raw = orjson.dumps({"model": "sim-model", "max_tokens": 64, "messages": messages})
    return raw, client.post("/v1/messages", content=raw,
                            headers={"content-type": "application/json",
                                     "x-session-id": "held-1"})


def holding(start_proxy: ProxyFactory, **fields: Any) -> ThreadedServer:
    """A proxy that holds every body (not only bodies of 64 KiB or more)."""
    proxy = start_proxy(**fields)
    proxy.proxy.hold_bytes = 2  # type: ignore[attr-defined]
    return proxy


def status(proxy: ThreadedServer) -> dict[str, Any]:
    return httpx.get(f"{proxy.base_url}/agentcompact/status").json()  # type: ignore[no-any-return]


def test_unchanged_requests_go_out_held_then_complete(start_proxy: ProxyFactory,
                                                      upstream: Upstream) -> None:
    proxy = holding(start_proxy, budget=Budget(200_000), counter="chars")
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
    # every request went out held; every one after the first, extending a body sent
    # unchanged far under the trigger, was completed before its new messages were even
    # tokenized (the first one, after the engine)
    assert held == {"sent": len(sent), "sent_early": len(sent) - 1, "dropped": 0}


def test_held_request_is_dropped_when_the_engine_changes_the_body(
        start_proxy: ProxyFactory, upstream: Upstream) -> None:
    # chars/4 counting; an image counts 1,600 tokens whatever its JSON's size, so short
    # image blocks look harmless by their bytes and still push the session over the trigger
    proxy = holding(start_proxy, budget=Budget(3000, 1500), counter="chars")
    history = anthropic_history(4)
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        first, response = post(client, history)
        assert response.status_code == 200
        assert upstream.tap.sent[-1].request == first  # under the trigger: unchanged
        grown = [*history, {"role": "assistant", "content": "Here is the plot."},
                 {"role": "user", "content": [
                     {"type": "image",
                      "source": {"type": "url", "url": "https://example.test/a.png"}},
                     {"type": "image",
                      "source": {"type": "url", "url": "https://example.test/b.png"}},
                     {"type": "text", "text": "What do these show?"}]}]
        raw, response = post(client, grown)
    assert response.status_code == 200
    assert response.json()["type"] == "message"
    final = upstream.tap.sent[-1]
    # the held request, if it got as far as the upstream before the engine dropped it
    # (a small body is decided before its request even connects): never complete
    for dropped in upstream.tap.sent[1:-1]:
        assert raw.startswith(dropped.request) and len(dropped.request) < len(raw)
        assert dropped.finished.wait(5)
        assert dropped.status != 200
    # what the engine decided went out on its own: compacted, complete, answered
    assert final.request != raw
    assert len(orjson.loads(final.request)["messages"]) < len(grown)
    assert final.completed and final.status == 200
    # the simulator's application only ever handled complete requests
    assert len(upstream.requests) == 2
    # the first went out held too (completed after the engine), the second was dropped
    assert status(proxy)["held"] == {"sent": 1, "sent_early": 0, "dropped": 1}


def test_only_a_body_whose_length_may_stay_under_the_trigger_is_held(
        start_proxy: ProxyFactory, upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:
    proxy = holding(start_proxy, budget=Budget(6000, 3000), counter="chars",
                    log_requests=True)
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
    # a held body is one the size guess (3 bytes a token) put under the trigger
    assert all(line["tokens_in"] * 4 // 3 <= 6000 * 1.1 for line in lines if line["held"])
    # after the cliff every body is rewritten (the stored prefix substituted): none held
    assert all(h is None for h, m in zip(held, modified, strict=True) if m)
    assert status(proxy)["held"]["dropped"] == 0
    assert all(r.completed for r in upstream.tap.sent)


def test_held_request_waits_for_the_engine_when_its_bytes_could_reach_the_trigger(
        start_proxy: ProxyFactory, upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:
    # chars/4 counting: ~8,900 bytes look like <= 3,000 tokens to the guess (held), but
    # only their bytes bound the 1,200 new ones for certain (> the ~1,100 left): the last
    # byte waits
    # for the exact count (~300 tokens: unchanged), then goes
    proxy = holding(start_proxy, budget=Budget(3000, 1500), counter="chars",
                    log_requests=True)
    caplog.set_level(logging.INFO, logger="agentcompact.proxy")
    base = [{"role": "user", "content": "x" * 7600}]
    grown = [*base, {"role": "assistant", "content": "y" * 1150},
             {"role": "user", "content": "go on"}]
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        first, _ = post(client, base)
        raw, response = post(client, grown)
    assert response.status_code == 200
    assert [r.request for r in upstream.tap.sent] == [first, raw]
    lines = [orjson.loads(r.getMessage()) for r in caplog.records
             if r.name == "agentcompact.proxy" and r.getMessage().startswith("{")]
    assert [line["held"] for line in lines] == ["sent", "sent"]
    assert [line["modified"] for line in lines] == [False, False]


def test_a_large_body_streams_upstream_while_the_client_still_sends_it(
        start_proxy: ProxyFactory, upstream: Upstream) -> None:
    # the default proxy (bodies of 64 KiB or more held): the client sends the first half
    # of a 200 KB body, then waits until the upstream has received that half before it
    # sends the rest: a proxy that waited for the whole body would never get the rest
    proxy = start_proxy(budget=Budget(1_000_000), counter="chars")
    raw = orjson.dumps({"model": "sim-model", "max_tokens": 64,
                        "messages": anthropic_history(40, result_tokens=1200)})
    assert len(raw) > 200_000
    half = len(raw) // 2
    reached = threading.Event()

    def pieces() -> Iterator[bytes]:
        yield raw[:half]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if upstream.tap.sent and len(upstream.tap.sent[-1].request) >= half:
                reached.set()
                break
            time.sleep(0.01)
        yield raw[half:]

    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:
        post(client, anthropic_history(1))  # a short one first (not held: under 64 KiB)
        response = client.post("/v1/messages", content=pieces(),
                               headers={"content-type": "application/json",
                                        "content-length": str(len(raw))})
    assert response.status_code == 200
    assert reached.is_set()  # the first half was upstream before the client sent the rest
    assert upstream.tap.sent[-1].request == raw and upstream.tap.sent[-1].completed
    assert len(upstream.requests) == 2
    assert status(proxy)["held"] == {"sent": 1, "sent_early": 0, "dropped": 0}


def test_a_client_leaving_mid_body_leaves_the_upstream_an_incomplete_request(
        start_proxy: ProxyFactory, upstream: Upstream) -> None:
    import socket

    proxy = holding(start_proxy, budget=Budget(1_000_000), counter="chars")
    raw = orjson.dumps({"model": "sim-model", "max_tokens": 64,
                        "messages": anthropic_history(4)})
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        post(client, anthropic_history(1))
    host, port = proxy.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n" % len(raw)
                     + raw[:-100])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (
                upstream.tap.sent and len(upstream.tap.sent[-1].request) >= len(raw) - 100):
            time.sleep(0.01)
    sent = upstream.tap.sent[-1]
    assert sent.request == raw[:-100]  # what arrived went on, and no more
    assert sent.finished.wait(5)
    assert len(upstream.requests) == 1  # the simulator's application never acted on it


def test_held_requests_through_an_environment_proxy_go_by_aiohttp(
        start_proxy: ProxyFactory, upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    # an HTTP forward proxy in front of the simulator: aiohttp sends it each request with
    # the absolute URL of an upstream only the forward proxy reaches (no such host here)
    from urllib.parse import urlsplit

    from agentcompact.testing import serve

    async def forward(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            assert scope["path"].startswith("http://upstream.invalid/")  # absolute form
            path = urlsplit(scope["path"]).path
            scope = {**scope, "path": path, "raw_path": path.encode()}
        await upstream.tap(scope, receive, send)

    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
                 "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with serve(forward) as forward_proxy:
        monkeypatch.setenv("HTTP_PROXY", forward_proxy.base_url)
        proxy = holding(start_proxy, budget=Budget(200_000), counter="chars",
                        anthropic_upstream="http://upstream.invalid")
        small = holding(start_proxy, budget=Budget(3000, 1500), counter="chars",
                        anthropic_upstream="http://upstream.invalid")
        full = anthropic_history(8)
        sent: list[bytes] = []
        # the test's own client is not one of the proxy's clients: no environment proxy
        with httpx.Client(base_url=proxy.base_url, timeout=10, trust_env=False) as client:
            for turns in range(2, 8):
                raw, response = post(client, full[: 1 + 2 * turns])
                assert response.status_code == 200
                assert response.json()["type"] == "message"
                sent.append(raw)
        # a body the engine changes: the held one is dropped, the compacted one answered
        images = [{"type": "image", "source": {"type": "url", "url": f"https://x.test/{i}"}}
                  for i in range(2)]  # 3,200 tokens in a short JSON: held, then compacted
        with httpx.Client(base_url=small.base_url, timeout=10, trust_env=False) as client:
            grown, response = post(client, [*anthropic_history(4), {
                "role": "assistant", "content": "Here."}, {"role": "user", "content": images}])
    monkeypatch.delenv("HTTP_PROXY")
    assert response.status_code == 200
    assert [r.request for r in upstream.tap.sent][: len(sent)] == sent
    assert all(r.completed for r in upstream.tap.sent[: len(sent)])
    assert status(proxy)["held"] == {"sent": len(sent), "sent_early": len(sent) - 1,
                                     "dropped": 0}
    assert upstream.tap.sent[-1].request != grown and upstream.tap.sent[-1].completed
    assert len(upstream.requests) == len(sent) + 1  # complete requests only
    assert status(small)["held"] == {"sent": 0, "sent_early": 0, "dropped": 1}


def test_requests_sent_early_are_logged_with_the_engines_figures(
        start_proxy: ProxyFactory, upstream: Upstream, caplog: pytest.LogCaptureFixture) -> None:
    # completed upstream before the engine measured it, a request's log line and the
    # status page still carry the engine's exact figures, and each next request of the
    # session can be sent early again
    proxy = holding(start_proxy, budget=Budget(200_000), counter="chars", log_requests=True)
    caplog.set_level(logging.INFO, logger="agentcompact.proxy")
    full = anthropic_history(6)
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        for turns in range(2, 6):
            with client.stream("POST", "/v1/messages", content=orjson.dumps(
                    {"model": "sim-model", "max_tokens": 64, "stream": True,
                     "messages": full[: 1 + 2 * turns]}),
                    headers={"x-session-id": "held-early"}) as response:
                assert response.status_code == 200
                assert b"message_stop" in response.read()
    lines = [orjson.loads(r.getMessage()) for r in caplog.records
             if r.name == "agentcompact.proxy" and r.getMessage().startswith("{")]
    assert [line["held"] for line in lines] == ["sent", "sent-early", "sent-early",
                                                "sent-early"]
    assert all(line["tokens_in"] and line["tokens_in"] == line["tokens_out"]
               and line["strategy"] == "cliff" for line in lines)
    assert [line["tokens_in"] for line in lines] == sorted({line["tokens_in"] for line in lines})
    session = next(iter(status(proxy)["sessions"].values()))
    assert session["requests"] == 4 and session["tokens_in"] == lines[-1]["tokens_in"]
