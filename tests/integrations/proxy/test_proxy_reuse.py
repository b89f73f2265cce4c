"""Session prefix reuse end to end (real sockets): a proxy that parses incrementally sends
the upstream exactly what a proxy parsing every body afresh sends, across growing, edited,
forked and rewritten histories in the three wire formats."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from agentcompact import Budget
from agentcompact.integrations.proxy import ThreadedServer
from agentcompact.integrations.proxy._bodies import BodyCache

from .conftest import ProxyFactory, Upstream
from .histories import anthropic_history, chat_history, responses_history

pytestmark = pytest.mark.network

DIALECTS: dict[str, tuple[str, str, Callable[..., list[Any]], int]] = {
    # path, messages key, history, messages per turn
    "anthropic": ("/v1/messages", "messages", anthropic_history, 2),
    "openai_chat": ("/v1/chat/completions", "messages", chat_history, 3),
    "openai_responses": ("/v1/responses", "input", responses_history, 3),
}


def sequence(history: Callable[..., list[Any]], per_turn: int) -> list[list[Any]]:
    """Message lists a session sends: growing one turn at a time past the trigger (a
    compaction, then the stored prefix substituted), a retry, an edited early message,
    a fork back to an earlier branch, and a client-side rewrite of the start."""
    full = history(26)
    head = len(full) - 26 * per_turn
    grow = [full[: head + per_turn * t] for t in range(1, 27)]
    edited = [dict(m) for m in grow[-1]]
    edited[head + 1] = {**edited[head + 1], "id_extra": "edited"}
    fork = grow[14] + history(2)[head:]  # same prefix as step 14, other continuation
    rewritten = grow[0][:head] + grow[-1][head + 10 * per_turn:]
    return [*grow[:20], grow[19], edited, grow[20], fork, grow[21], rewritten,
            *grow[22:]]


def send(proxy: ThreadedServer, path: str, raw: bytes) -> httpx.Response:
    with httpx.Client(base_url=proxy.base_url, timeout=10) as client:
        return client.post(path, content=raw, headers={"content-type": "application/json",
                                                       "x-session-id": "s1"})


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("style", ["orjson", "json-default"])
def test_upstream_gets_what_a_fresh_parse_sends(start_proxy: ProxyFactory, upstream: Upstream,
                                                dialect: str, style: str) -> None:
    path, key, history, per_turn = DIALECTS[dialect]
    reusing = start_proxy(budget=Budget(3000, 1500), counter="chars")
    fresh = start_proxy(budget=Budget(3000, 1500), counter="chars")
    fresh.proxy.bodies = BodyCache(max_entries=0)  # type: ignore[attr-defined]  # parse afresh
    serialize = orjson.dumps if style == "orjson" else (lambda v: json.dumps(v).encode())
    modified = 0
    for step, messages in enumerate(sequence(history, per_turn)):
        body = {"model": "sim-model", "max_tokens": 64, key: messages,
                "tools": [{"name": "read_file", "step": step % 3}]}
        raw = serialize(body)
        assert send(reusing, path, raw).status_code == 200
        got = upstream.tap.sent[-1].request
        assert send(fresh, path, raw).status_code == 200
        expected = upstream.tap.sent[-1].request
        assert orjson.loads(got) == orjson.loads(expected), f"step {step}"
        if got == raw:
            continue
        modified += 1
        # every message sent unchanged goes out as the client's own bytes
        originals = {serialize(m).strip() for m in messages}
        for message in orjson.loads(got)[key]:
            if message in messages:
                assert any(o in got for o in originals if orjson.loads(o) == message)
    assert modified >= 5  # the histories crossed the trigger: prefixes were substituted
    cache = reusing.proxy.bodies  # type: ignore[attr-defined]
    assert cache.hits >= 20 and cache.partial_hits + cache.misses >= 3  # edits, forks
