"""The parallel strategy: turn-aligned blocks, concurrency, incremental block cache,
per-block fallbacks — against the upstream simulator."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcompact import Budget, Engine, StrategySettings, hookimpl, validate
from agentcompact._markers import COMPACTION_HEADER, SUMMARY_HEADER
from agentcompact.strategies._parallel import ParallelStrategy, balanced_blocks
from agentcompact.testing import Fault, LatencyModel, Reply, Script, digest_reply

from .conftest import assert_clean_prompts, client, grow, history, prompt_of, text_of

pytestmark = pytest.mark.network

TRIGGER = 6_000
BUDGET: dict[str, Any] = {"budget": Budget(trigger_tokens=TRIGGER, target_tokens=TRIGGER // 2)}
BLOCK = 1_200


def engine(server: Any, pm: Any, **settings: Any) -> Engine:
    settings.setdefault("block_tokens", BLOCK)
    return Engine(strategy=StrategySettings("parallel", options=client(server, **settings)),
                  plugins=pm, **BUDGET)


def turns_in(text: str) -> set[str]:
    return set(re.findall(r"TURN\d+(?= output:)", text))


@given(st.lists(st.integers(0, 500), min_size=1, max_size=40), st.integers(1, 12))
def test_balanced_blocks_cover_units_in_order(sizes: list[int], n: int) -> None:
    units = [(i, i + 1, s) for i, s in enumerate(sizes)]
    blocks = balanced_blocks(units, n)
    assert len(blocks) == min(n, len(units))
    assert blocks[0][0] == 0 and blocks[-1][1] == len(units)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(blocks, blocks[1:], strict=False))


def test_balanced_blocks_balance() -> None:
    units = [(i, i + 1, 100) for i in range(12)]
    assert balanced_blocks(units, 4) == [(0, 3), (3, 6), (6, 9), (9, 12)]


def test_blocks_are_whole_turns_in_order(sim, pm, log) -> None:
    seen: list[tuple[int, list[Any]]] = []

    class Spy:
        @hookimpl
        def agentcompact_summary_prompt(self, messages, dialect, settings):
            seen.append((settings["block"], list(messages)))

    pm.register(Spy())
    server = sim()
    eng = engine(server, pm)
    msgs = history(14)
    result = eng.compact(msgs)
    assert len(seen) >= 4
    for _, block in seen:
        assert block[0]["role"] == "assistant"  # starts a turn
        calls = {c["id"] for m in block for c in m.get("tool_calls") or ()}
        results = {m["tool_call_id"] for m in block if m["role"] == "tool"}
        assert calls == results  # a call and its result never straddle blocks
    out = text_of(result.messages[2])
    assert out.startswith(SUMMARY_HEADER + "\n")
    # summaries in block order, whatever order the requests completed in
    order = [int(m) for m in re.findall(r"TURN(\d+) output", out)]
    assert order == sorted(order)
    validate(result.messages, eng.dialect, allow_pending=True)
    assert_clean_prompts(server)
    [event] = log.events
    assert event.strategy == "parallel" and event.error is None and event.errors == []


def test_block_output_budgets_sum_within_budget(sim, pm) -> None:
    server = sim(Script(then=lambda body: Reply.filler(4_000)))
    eng = engine(server, pm)
    result = eng.compact(history(14))
    budgets = [r.body["max_tokens"] for r in server.requests]
    assert len(budgets) >= 4 and sum(budgets) <= eng.budget.target
    assert result.tokens_after <= eng.budget.target + 50
    fixed = sim()
    engine(fixed, pm, block_output_tokens=100).compact(history(14))
    assert {r.body["max_tokens"] for r in fixed.requests} == {100}


def test_blocks_setting(sim, pm) -> None:
    server = sim()
    engine(server, pm, blocks=3).compact(history(14))
    assert len(server.requests) == 3


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_second_compaction_only_summarizes_new_blocks(sim, pm, log, mode: str) -> None:
    server = sim()
    eng = engine(server, pm)
    run = eng.compact if mode == "sync" else (lambda m: asyncio.run(eng.acompact(m)))
    msgs = history(14)
    first = run(msgs)
    n1 = len(server.requests)
    covered = set().union(*(turns_in(prompt_of(r)) for r in server.requests))
    msgs2 = grow(msgs, 12)
    second = run(msgs2)
    assert second.compacted and second.cut > first.cut
    new_requests = server.requests[n1:]
    assert new_requests
    for request in new_requests:  # no block seen before is sent again
        assert not turns_in(prompt_of(request)) & covered
    summary = text_of(second.messages[2])
    # the first compaction's block summaries are reused verbatim, in order
    for piece in text_of(first.messages[2]).removeprefix(SUMMARY_HEADER + "\n").split("\n\n"):
        assert piece in summary
    assert_clean_prompts(server)
    assert all(e.error is None for e in log.events)


def test_one_failed_block_is_rendered_verbatim(sim, pm, log) -> None:
    def responder(body: dict[str, Any]) -> Reply:
        if "TURN5 output" in json.dumps(body):
            return Reply("x").failing(Fault.http(500))
        return digest_reply(body)

    server = sim(Script(then=responder))
    eng = engine(server, pm)
    result = eng.compact(history(14))
    text = text_of(result.messages[2])
    assert text.startswith(SUMMARY_HEADER)
    assert "[verbatim excerpts of these turns" in text and "make TURN5" in text
    assert "simulated" not in text and "500" not in text.split("TURN5")[0][-200:]
    [event] = log.events
    assert event.error is None and len(event.errors) == 1 and "500" in event.errors[0]
    validate(result.messages, eng.dialect, allow_pending=True)
    # the failed block is not cached: a later compaction of the same range retries it
    again = Engine(eng.strategy, plugins=pm, **BUDGET).compact(history(14))
    assert len(again.events[0].errors) == 1


@pytest.mark.parametrize("fault", [Fault.http(500), Fault.hang(5), Fault.context_length(10)],
                         ids=["500", "timeout", "context-length"])
def test_every_block_failing_falls_back_to_cliff(sim, pm, log, fault: Fault) -> None:
    server = sim(Script(then=Reply("never").failing(fault)))
    eng = engine(server, pm, timeout=0.3)
    result = eng.compact(history(14))
    text = "\n".join(text_of(m) for m in result.messages)
    assert text_of(result.messages[2]).startswith(COMPACTION_HEADER)
    assert "simulated" not in text and "Error code" not in text
    [event] = log.events
    assert event.fallback == "cliff" and "every block failed" in (event.error or "")
    validate(result.messages, eng.dialect, allow_pending=True)


def test_concurrency_limit_and_sync_async_parity(sim, pm) -> None:
    latency = LatencyModel(ttft_s=0.02, decode_tokens_per_s=5_000)
    outs = []
    for mode in ("sync", "async", "sync"):
        server = sim(latency=latency)
        eng = engine(server, pm, max_concurrency=2)
        msgs = grow(history(14), 12)
        result = eng.compact(msgs) if mode == "sync" else asyncio.run(eng.acompact(msgs))
        outs.append(result.messages)
    assert outs[0] == outs[1] == outs[2]


def test_streaming_blocks(sim, pm) -> None:
    server = sim()
    result = engine(server, pm, stream=True).compact(history(14))
    assert text_of(result.messages[2]).startswith(SUMMARY_HEADER)
    assert all(r.body["stream"] for r in server.requests)


def test_strategy_object_and_errors() -> None:
    with pytest.raises(Exception, match="block_tokens"):
        ParallelStrategy(base_url="http://x/v1", model="m", block_tokens=0)
