"""Background compaction: start the summary at a soft threshold, swap it in when ready,
fall back to cliff when the hard trigger comes first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentcompact import BackgroundCompactor, Budget, Engine, StrategySettings, validate
from agentcompact._markers import COMPACTION_HEADER, SUMMARY_HEADER
from agentcompact.errors import ConfigError
from agentcompact.testing import Fault, LatencyModel, Script, digest_reply

from .conftest import client, grow, history, text_of

pytestmark = pytest.mark.network

TRIGGER, TARGET, SOFT = 6_000, 3_000, 4_500


def engine(server: Any, pm: Any, strategy: str = "summary", **settings: Any) -> Engine:
    return Engine(strategy=StrategySettings(strategy, options=client(server, **settings)),
                  plugins=pm, budget=Budget(trigger_tokens=TRIGGER, target_tokens=TARGET))


async def test_swap_in_keeps_turns_that_arrived_meanwhile(sim, pm, log) -> None:
    server = sim(latency=LatencyModel(ttft_s=0.3))
    eng = engine(server, pm)
    bg = BackgroundCompactor(eng, soft_trigger_tokens=SOFT, wait_s=5)
    msgs = history(9)
    assert eng.context_tokens(msgs) < SOFT
    result = await bg.compact(msgs)
    assert not result.modified and not bg.pending
    msgs = grow(msgs, 1)  # crosses the soft threshold: the summary starts, nothing waits
    result = await bg.compact(msgs)
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
    result = await bg.compact(msgs)
    assert bg.stats.waited == 1 and bg.stats.fell_back == 0 and not bg.pending
    assert text_of(result.messages[2]).startswith(SUMMARY_HEADER)
    assert result.tokens_after <= TRIGGER


async def test_not_ready_at_hard_trigger_falls_back_to_cliff(sim, pm, log) -> None:
    server = sim(Script(then=lambda body: digest_reply(body).failing(Fault.delay(3))))
    eng = engine(server, pm)
    bg = BackgroundCompactor(eng, soft_trigger_tokens=SOFT, wait_s=0.2)
    msgs = history(10)
    await bg.compact(msgs)
    msgs = grow(msgs, 5)
    result = await bg.compact(msgs)  # the summary needs 3 s more: waiting 0.2 s, then cliff
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


async def _settle(bg: BackgroundCompactor) -> None:
    while bg.pending:
        await asyncio.sleep(0.02)


async def test_adaptive_start_below_the_soft_threshold(sim, pm, log) -> None:
    """With a growth rate and a summary latency (here a hint) that would reach the trigger
    before a summary started at the soft threshold is ready, it starts earlier."""
    server = sim()
    eng = engine(server, pm)
    bg = BackgroundCompactor(eng, soft_trigger_tokens=SOFT, wait_s=5, latency_hint_s=60)
    msgs = history(5)
    assert eng.context_tokens(msgs) < TARGET
    await bg.compact(msgs)
    while eng.context_tokens(msgs + history(1, start=99)) <= TARGET:  # never early under it
        msgs = grow(msgs, 1)
        await bg.compact(msgs)
        assert not bg.pending
    msgs = grow(msgs, 1)
    assert TARGET < eng.context_tokens(msgs) < SOFT
    result = await bg.compact(msgs)  # over target, below soft; 60 s of growth reaches trigger
    assert not result.modified and bg.stats.started == 1 and bg.stats.early_starts == 1
    assert bg.stats.rate_tokens_s > 0
    await _settle(bg)
    msgs = grow(msgs, 1)
    result = await bg.compact(msgs)
    assert bg.stats.swapped == 1 and text_of(result.messages[2]).startswith(SUMMARY_HEADER)
    assert [e.reason for e in log.events] == ["background"]
    # the measured latency replaces the hint
    assert bg.stats.latency_s is not None and bg.stats.latency_s < 60


async def test_not_adaptive_waits_for_the_soft_threshold(sim, pm) -> None:
    bg = BackgroundCompactor(engine(sim(), pm), soft_trigger_tokens=SOFT, wait_s=5,
                             latency_hint_s=60, adaptive=False)
    msgs = history(5)
    while bg.engine.context_tokens(msgs) <= SOFT:
        await bg.compact(msgs)
        assert not bg.pending
        msgs = grow(msgs, 1)
    await bg.compact(msgs)
    assert bg.pending and bg.stats.early_starts == 0
    await bg.aclose()


async def test_hopeless_wait_falls_back_at_once(sim, pm, log) -> None:
    """When the running summary is expected to need longer than wait_s, the hard trigger
    goes straight to cliff instead of stalling wait_s for nothing."""
    server = sim(Script(then=lambda body: digest_reply(body).failing(Fault.delay(5))))
    eng = engine(server, pm)
    bg = BackgroundCompactor(eng, soft_trigger_tokens=SOFT, wait_s=3, latency_hint_s=30)
    msgs = history(10)
    await bg.compact(msgs)
    assert bg.pending
    result = await bg.compact(grow(msgs, 5))
    assert bg.stats.skipped_waits == 1 and bg.stats.waited == 0 and bg.stats.fell_back == 1
    assert result.compacted and text_of(result.messages[2]).startswith(COMPACTION_HEADER)
    assert not bg.pending and bg.stats.cancelled == 1
    assert log.events[-1].fallback == "cliff" and "not ready" in (log.events[-1].error or "")
    validate(result.messages, eng.dialect, allow_pending=True)


async def test_cancelled_summary_raises_the_latency_estimate(sim, pm) -> None:
    server = sim(Script(then=lambda body: digest_reply(body).failing(Fault.delay(5))))
    bg = BackgroundCompactor(engine(server, pm), soft_trigger_tokens=SOFT, wait_s=0.3)
    msgs = history(10)
    await bg.compact(msgs)
    assert bg.stats.latency_s is None
    await bg.compact(grow(msgs, 5))  # waits 0.3 s, falls back, cancels
    assert bg.stats.waited == 1 and bg.stats.fell_back == 1
    assert bg.stats.latency_s is not None and bg.stats.latency_s >= 0.3


async def test_staggered_tasks_swap_an_earlier_summary_while_a_newer_runs(sim, pm, log
                                                                         ) -> None:
    """max_pending=2, an agent too fast for one summary at a time (target + 2·rate·latency
    over the trigger): a second compaction starts latency/2 after the first; the first is
    swapped in when ready (turns since its cut verbatim), then the second replaces it."""
    server = sim(latency=LatencyModel(ttft_s=2.5))
    eng = engine(server, pm)
    bg = BackgroundCompactor(eng, soft_trigger_tokens=SOFT, wait_s=10, latency_hint_s=2.0,
                             max_pending=2, adaptive=False)
    msgs = history(9)
    assert eng.context_tokens(msgs) < SOFT
    await bg.compact(msgs)
    msgs = grow(msgs, 1)
    await bg.compact(msgs)  # over soft: A starts; one turn in no time: a fast agent
    assert bg.stats.started == 1 and bg.stats.rate_tokens_s * 2 * 2.0 > TRIGGER - TARGET
    msgs = grow(msgs, 1)
    await bg.compact(msgs)  # too soon after A (< latency/2): no second task yet
    assert bg.stats.started == 1
    await asyncio.sleep(1.05)
    msgs = grow(msgs, 1)
    await bg.compact(msgs)  # B starts while A runs
    assert bg.stats.started == 2 and bg.pending
    while bg.stats.finished < 1:
        await asyncio.sleep(0.02)
        assert not await bg.prepare(msgs)  # accounts for finished tasks, starts nothing
    assert bg.pending  # B still runs
    msgs = grow(msgs, 1)
    a = await bg.compact(msgs)
    assert a.modified and not a.compacted and text_of(a.messages[2]).startswith(SUMMARY_HEADER)
    assert a.messages[3:] == msgs[a.cut:] and bg.stats.swapped == 1
    await _settle(bg)
    msgs = grow(msgs, 1)
    b = await bg.compact(msgs)
    assert bg.stats.swapped == 2 and b.cut > a.cut and bg.stats.started == 2
    assert b.messages[3:] == msgs[b.cut:]
    assert [e.reason for e in log.events] == ["background", "background"]
    validate(b.messages, eng.dialect, allow_pending=True)


async def test_one_at_a_time_when_it_keeps_up(sim, pm) -> None:
    """max_pending=2 starts no second compaction when one at a time keeps up."""
    server = sim(latency=LatencyModel(ttft_s=0.5))
    bg = BackgroundCompactor(engine(server, pm), soft_trigger_tokens=SOFT, wait_s=10,
                             latency_hint_s=0.01, max_pending=2, adaptive=False)
    msgs = history(10)
    await bg.compact(msgs)
    for _ in range(3):
        await asyncio.sleep(0.05)
        msgs = grow(msgs, 1)
        await bg.compact(msgs)
    assert bg.stats.started == 1
    await bg.aclose()
