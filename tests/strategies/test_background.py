"""Background compaction: start the summary at a soft threshold, swap it in when ready,
fall back to cliff when the hard trigger comes first."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentcompact import Engine, validate
from agentcompact.background import BackgroundCompactor
from agentcompact.errors import ConfigError
from agentcompact.integrations.upstream_sim import Fault, LatencyModel, Script, digest_reply
from agentcompact.markers import COMPACTION_HEADER, SUMMARY_HEADER

from .conftest import client, grow, history, text_of

pytestmark = pytest.mark.network

TRIGGER, TARGET, SOFT = 6_000, 3_000, 4_500


def engine(server: Any, pm: Any, strategy: str = "summary", **settings: Any) -> Engine:
    return Engine(strategy=strategy, plugins=pm, trigger_tokens=TRIGGER, target_tokens=TARGET,
                  strategy_settings=client(server, **settings))


async def test_swap_in_keeps_turns_that_arrived_meanwhile(sim, pm, log) -> None:
    server = sim(latency=LatencyModel(ttft_s=0.3))
    eng = engine(server, pm)
    bg = BackgroundCompactor(eng, soft_trigger_tokens=SOFT, wait_s=5)
    msgs = history(9)
    assert eng.context_tokens(msgs) < SOFT
    result = await bg.compact(msgs)
    assert not result.modified and not bg.pending
    msgs = grow(msgs, 1)  # crosses the soft threshold: the summary starts, nothing waits
    t0 = time.perf_counter()
    result = await bg.compact(msgs)
    assert time.perf_counter() - t0 < 0.2
    assert bg.pending and not result.modified and result.messages == msgs
    started_with = len(msgs)
    msgs = grow(msgs, 1)  # the agent keeps going meanwhile
    assert not (await bg.compact(msgs)).modified
    while bg.pending:
        await asyncio.sleep(0.05)
    msgs = grow(msgs, 1)
    requests = len(server.requests)
    result = await bg.compact(msgs)
    assert len(server.requests) == requests  # the swap costs no summarizer call
    assert result.modified and not result.compacted and bg.stats.swapped == 1
    out = result.messages
    assert out[:2] == msgs[:2] and text_of(out[2]).startswith(SUMMARY_HEADER)
    kept = msgs[result.cut:]
    assert result.cut < started_with and len(kept) > len(msgs) - started_with
    assert len(out) == 3 + len(kept) and all(a is b for a, b in zip(out[3:], kept, strict=True))
    assert result.tokens_after < SOFT
    validate(out, eng.dialect, allow_pending=True)
    assert [e.reason for e in log.events] == ["background"] and log.events[0].error is None
    # later calls keep the same compacted prefix byte for byte
    msgs = grow(msgs, 1)
    later = await bg.compact(msgs)
    assert later.messages[:3] == out[:3] and later.messages[2] is out[2]


async def test_hard_trigger_waits_then_swaps(sim, pm) -> None:
    server = sim(latency=LatencyModel(ttft_s=0.3))
    bg = BackgroundCompactor(engine(server, pm), soft_trigger_tokens=SOFT, wait_s=3)
    msgs = history(10)
    await bg.compact(msgs)  # soft crossing
    assert bg.pending
    msgs = grow(msgs, 5)  # straight past the hard trigger
    t0 = time.perf_counter()
    result = await bg.compact(msgs)
    stall = time.perf_counter() - t0
    assert 0.1 < stall < 2.5 and bg.stats.waited == 1 and bg.stats.fell_back == 0
    assert text_of(result.messages[2]).startswith(SUMMARY_HEADER)
    assert result.tokens_after <= TRIGGER


async def test_not_ready_at_hard_trigger_falls_back_to_cliff(sim, pm, log) -> None:
    server = sim(Script(then=lambda body: digest_reply(body).failing(Fault.delay(3))))
    eng = engine(server, pm)
    bg = BackgroundCompactor(eng, soft_trigger_tokens=SOFT, wait_s=0.2)
    msgs = history(10)
    await bg.compact(msgs)
    msgs = grow(msgs, 5)
    t0 = time.perf_counter()
    result = await bg.compact(msgs)
    assert time.perf_counter() - t0 < 1.5
    assert result.compacted and text_of(result.messages[2]).startswith(COMPACTION_HEADER)
    text = "\n".join(text_of(m) for m in result.messages)
    assert "not ready" not in text and "Summarizer" not in text
    event = log.events[-1]
    assert event.fallback == "cliff" and "not ready" in (event.error or "")
    assert bg.stats.fell_back == 1 and not bg.pending  # the stale task was cancelled
    validate(result.messages, eng.dialect, allow_pending=True)


async def test_jump_past_hard_trigger_starts_and_waits(sim, pm) -> None:
    server = sim()
    bg = BackgroundCompactor(engine(server, pm, strategy="parallel", block_tokens=1_000),
                             soft_trigger_tokens=SOFT, wait_s=5)
    result = await bg.compact(history(16))
    assert text_of(result.messages[2]).startswith(SUMMARY_HEADER)
    assert bg.stats.started == 1 and bg.stats.fell_back == 0


async def test_failed_background_summary_falls_back_like_the_engine(sim, pm, log) -> None:
    server = sim(Script(then=lambda body: digest_reply(body).failing(Fault.http(500))))
    bg = BackgroundCompactor(engine(server, pm), soft_trigger_tokens=SOFT, wait_s=5)
    msgs = history(10)
    await bg.compact(msgs)
    while bg.pending:
        await asyncio.sleep(0.02)
    result = await bg.compact(grow(msgs, 1))
    assert text_of(result.messages[2]).startswith(COMPACTION_HEADER)  # engine fail-open
    assert log.events[0].reason == "background" and log.events[0].fallback == "cliff"


async def test_aclose_cancels(sim, pm) -> None:
    server = sim(Script(then=lambda body: digest_reply(body).failing(Fault.delay(5))))
    bg = BackgroundCompactor(engine(server, pm), soft_trigger_tokens=SOFT)
    assert await bg.prepare(history(10))
    assert bg.pending and not await bg.prepare(history(10))
    await bg.aclose()
    assert not bg.pending and bg.stats.cancelled == 1


def test_soft_threshold_must_be_below_trigger(sim, pm) -> None:
    eng = engine(sim(), pm)
    with pytest.raises(ConfigError):
        BackgroundCompactor(eng, soft_trigger_tokens=TRIGGER)
    assert BackgroundCompactor(eng).soft_trigger_tokens == (TARGET + TRIGGER) // 2
