"""The summary strategy through the engine, against the upstream simulator."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentcompact import Budget, Engine, StrategySettings, hookimpl, validate
from agentcompact._markers import COMPACTION_HEADER, SUMMARY_HEADER
from agentcompact.errors import ConfigError
from agentcompact.strategies import SummaryStrategy
from agentcompact.testing import Fault, LatencyModel, Reply, Script

from .conftest import assert_clean_prompts, client, grow, history, prompt_of, text_of

pytestmark = pytest.mark.network

TRIGGER = 6_000
BUDGET: dict[str, Any] = {"budget": Budget(trigger_tokens=TRIGGER, target_tokens=TRIGGER // 2)}


def engine(server: Any, pm: Any, **settings: Any) -> Engine:
    return Engine(strategy=StrategySettings("summary", options=client(server, **settings)),
                  plugins=pm, **BUDGET)


def summary_text(result: Any) -> str:
    [message] = [m for m in result.messages if text_of(m).startswith(SUMMARY_HEADER)]
    return text_of(message)


@pytest.mark.parametrize("stream", [False, True])
def test_head_summary_recent_turns(sim, pm, log, stream: bool) -> None:
    server = sim()
    eng = engine(server, pm, stream=stream)
    msgs = history(14)
    result = eng.compact(msgs)
    assert result.compacted and result.tokens_after <= TRIGGER
    validate(result.messages, eng.dialect, allow_pending=True)
    out = result.messages
    assert out[:2] == msgs[:2] and out[0] is msgs[0]
    assert text_of(out[2]).startswith(SUMMARY_HEADER + "\n")
    assert "SUMMARY sha256=" in text_of(out[2])
    kept = msgs[result.cut:]
    assert out[3:] == kept and all(a is b for a, b in zip(out[3:], kept, strict=True))
    [event] = log.events
    assert event.strategy == "summary" and event.error is None and event.fallback is None
    assert {d.action for d in event.dropped} == {"summarized"}
    assert len(log.calls) == 1 and log.calls[0].strategy == "summary"
    assert_clean_prompts(server)


def test_prompt_holds_originals_of_all_cycles_never_a_summary(sim, pm, log) -> None:
    server = sim()
    eng = engine(server, pm)
    msgs = history(14)
    first = eng.compact(msgs)
    msgs2 = grow(msgs, 12)
    second = eng.compact(msgs2)
    assert second.compacted and second.cut > first.cut
    prompts = [prompt_of(r) for r in server.requests]
    assert len(prompts) >= 2
    assert_clean_prompts(server)
    # cumulative=False: the last prompt reads the first cycle's originals again
    assert "TURN0 output:" in prompts[-1] and "make TURN1" in prompts[-1]
    assert "SUMMARY sha256=" not in prompts[-1]  # the previous summary is never fed back
    validate(second.messages, eng.dialect, allow_pending=True)


def test_default_prompt_asks_for_what_gets_lost(sim, pm) -> None:
    server = sim()
    engine(server, pm).compact(history(14))
    system = server.requests[0].body["messages"][0]["content"]
    for needle in ("instruction", "file paths", "commands", "identifiers", "numbers",
                   "error", "Next steps", "exactly as written"):
        assert needle in system
    assert "{max_tokens}" not in system
    user = server.requests[0].body["messages"][1]["content"]
    assert "Never touch setup.cfg" not in user  # the head stays verbatim, not summarized
    assert "[tool call bash]" in user and "TURN0 output:" in user


def test_output_budget_is_the_request_budget(sim, pm) -> None:
    server = sim(Script(then=lambda body: Reply.filler(5_000)))
    eng = engine(server, pm)
    result = eng.compact(history(14))
    max_tokens = server.requests[0].body["max_tokens"]
    assert 0 < max_tokens < eng.budget.target
    assert result.tokens_after <= eng.budget.target + 50
    assert result.compacted and summary_text(result)


def test_prompt_setting_and_hook(sim, pm) -> None:
    server = sim()
    engine(server, pm, prompt="Be brief; under {max_tokens} tokens.").compact(history(14))
    assert server.requests[0].body["messages"][0]["content"].startswith("Be brief; under ")

    class Custom:
        seen: list[Any] = []

        @hookimpl
        def agentcompact_summary_prompt(self, messages, dialect, settings):
            self.seen.append((len(messages), settings["max_tokens"]))
            return [{"role": "user", "content": f"custom {len(messages)}"}]

    pm.register(Custom())
    server2 = sim()
    engine(server2, pm).compact(history(14))
    assert server2.requests[0].body["messages"] == [
        {"role": "user", "content": f"custom {Custom.seen[0][0]}"}]
    assert Custom.seen[0][1] == server2.requests[0].body["max_tokens"]


async def test_async_hook_prompt(sim, pm, log) -> None:
    class AsyncPrompt:
        @hookimpl
        def agentcompact_summary_prompt(self, messages, dialect, settings):
            async def build() -> list[dict[str, Any]]:
                await asyncio.sleep(0)
                return [{"role": "user", "content": "from an awaitable"}]
            return build()

    pm.register(AsyncPrompt())
    server = sim()
    result = await engine(server, pm).acompact(history(14))
    assert server.requests[0].body["messages"][0]["content"] == "from an awaitable"
    assert summary_text(result)
    # the sync engine cannot await it: cliff fallback, error reported
    sync = engine(server, pm).compact(history(14))
    assert text_of(sync.messages[2]).startswith(COMPACTION_HEADER)
    assert "awaitable" in (log.events[-1].error or "")


def test_identical_span_is_summarized_once(sim, pm) -> None:
    server = sim()
    strategy = SummaryStrategy(**client(server))
    msgs = history(14)
    first = Engine(strategy, plugins=pm, **BUDGET).compact(msgs)
    again = Engine(strategy, plugins=pm, **BUDGET).compact(msgs)  # fresh store
    assert len(server.requests) == 1
    assert first.messages == again.messages


def test_a_trained_summarizer_never_reuses_a_summary(sim, pm, log) -> None:
    """While training, each episode's summary is the current policy's own sample, logged
    in that episode: the same span in two episodes is summarized (and logged) twice, and a
    cache is refused."""
    server = sim()
    strategy = SummaryStrategy(**client(server, trained=True))
    msgs = history(14)
    for episode in ("e1", "e2"):
        Engine(strategy, plugins=pm, episode_id=episode, **BUDGET).compact(msgs)
    assert len(server.requests) == 2
    assert [c.episode_id for c in log.calls] == ["e1", "e2"]
    with pytest.raises(ConfigError, match="cache_size=8 with a trained summarizer"):
        SummaryStrategy(**client(server, trained=True), cache_size=8)


def test_a_trained_summarizer_samples_at_the_policys_settings_and_records_them(
        sim, pm, log) -> None:
    """Not greedy: the policy's temperature (1.0 unless given), top_p and top_k are sent
    and recorded on the ``SummaryCall`` with the policy version; greedy is refused."""
    server = sim()
    Engine(SummaryStrategy(**client(server, trained=True)), plugins=pm,
           **BUDGET).compact(history(14))
    assert server.requests[0].body["temperature"] == 1.0
    assert log.calls[0].request == {"temperature": 1.0}
    strategy = SummaryStrategy(**client(server, trained=True, top_p=0.9, top_k=20))
    strategy.summarizer.policy_version = 4
    Engine(strategy, plugins=pm, **BUDGET).compact(history(14))
    body = server.requests[1].body
    assert (body["temperature"], body["top_p"], body["top_k"]) == (1.0, 0.9, 20)
    assert log.calls[1].request == {"temperature": 1.0, "top_p": 0.9, "top_k": 20}
    assert log.calls[1].policy_version == 4
    with pytest.raises(ConfigError, match="temperature=0.0 is greedy"):
        SummaryStrategy(**client(server, trained=True, temperature=0.0))
    frozen = SummaryStrategy(**client(server))  # a frozen summarizer stays greedy
    assert frozen.summarizer.request_kwargs([], 10)["temperature"] == 0.0


@pytest.mark.parametrize("fault", [Fault.http(500), Fault.hang(5), Fault.context_length(10)],
                         ids=["500", "timeout", "context-length"])
def test_failures_fall_back_to_cliff(sim, pm, log, fault: Fault) -> None:
    server = sim(Script(then=Reply("never").failing(fault)))
    eng = engine(server, pm, timeout=0.3)
    msgs = history(14)
    result = eng.compact(msgs)
    assert result.compacted
    validate(result.messages, eng.dialect, allow_pending=True)
    text = "\n".join(text_of(m) for m in result.messages)
    assert text_of(result.messages[2]).startswith(COMPACTION_HEADER)
    for leak in ("SummarizerError", "simulated", "timed out", "maximum context", "Error code"):
        assert leak not in text
    [event] = log.events
    assert event.fallback == "cliff" and "summary: Summarizer" in (event.error or "")
    assert "_Retryable" not in (event.error or "")
    assert log.calls and log.calls[-1].error


def test_context_length_error_refits_once(sim, pm, log) -> None:
    # the server's window (chars/4) is below what the summarizer believes it has: the first
    # request overflows, the refit at 60% of the window fits.
    server = sim(context_window=3_000)
    eng = engine(server, pm, context_window=6_000)
    result = eng.compact(history(14))
    assert summary_text(result)
    first, second = (prompt_of(r) for r in server.requests)
    assert len(second) < len(first)
    assert "chars omitted" in second or "omitted here" in second  # every cut is marked
    assert "context window exceeded" in (log.calls[0].error or "")
    assert log.calls[1].error is None


def test_trim_overflow_keeps_head_and_tail_with_marker(sim, pm) -> None:
    server = sim()
    eng = engine(server, pm, context_window=3_000)
    eng.compact(history(30))
    prompt = prompt_of(server.requests[0])
    assert "omitted here to fit the summarizer's context window" in prompt
    assert "TURN0" in prompt  # the head of the span is kept …
    assert server.requests[0].body["max_tokens"] < 3_000


def test_split_overflow_summarizes_original_parts(sim, pm) -> None:
    server = sim()
    eng = engine(server, pm, context_window=3_000, overflow="split")
    result = eng.compact(history(30))
    assert len(server.requests) >= 2
    prompts = [prompt_of(r) for r in server.requests]
    assert all("omitted here" not in p for p in prompts)  # every message sent, in parts
    assert "TURN0 output" in prompts[0] and "SUMMARY sha256" not in "".join(prompts)
    turns = [{w for w in p.split() if w.startswith("TURN")} for p in prompts]
    for a, b in zip(turns, turns[1:], strict=False):
        assert not a & b  # parts are disjoint runs of original messages
    assert summary_text(result).count("SUMMARY sha256=") >= 1


def test_cumulative_opt_in_feeds_previous_summary(sim, pm) -> None:
    server = sim()
    eng = engine(server, pm, cumulative=True)
    msgs = history(14)
    eng.compact(msgs)
    eng.compact(grow(msgs, 12))
    last = prompt_of(server.requests[-1])
    assert "[summary of the turns before these]" in last and "SUMMARY sha256=" in last
    assert SUMMARY_HEADER not in last


def test_deterministic_and_sync_async_parity(sim, pm) -> None:
    msgs = grow(history(14), 8)
    outs = []
    for mode in ("sync", "sync", "async"):
        server = sim()
        eng = engine(server, pm)
        result = eng.compact(msgs) if mode == "sync" else asyncio.run(eng.acompact(msgs))
        outs.append(result.messages)
    assert outs[0] == outs[1] == outs[2]


def test_engine_settings_and_environment(sim, pm, monkeypatch: pytest.MonkeyPatch) -> None:
    server = sim()
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_BASE_URL", f"{server.base_url}/v1")
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_MODEL", "env-model")
    eng = Engine(strategy="summary", plugins=pm, **BUDGET)
    assert summary_text(eng.compact(history(14)))
    assert server.requests[0].body["model"] == "env-model"
    with pytest.raises(ConfigError, match="unknown strategy settings"):
        Engine(strategy=StrategySettings("summary", options={"bogus": 1}), plugins=pm)


def test_streaming_with_latency(sim, pm) -> None:
    server = sim(latency=LatencyModel(ttft_s=0.05, decode_tokens_per_s=2_000))
    result = engine(server, pm, stream=True).compact(history(14))
    assert summary_text(result)


@pytest.mark.parametrize("strategy", ["summary", "parallel"])
def test_engine_summarizer_shortcuts_reach_the_endpoint(sim, pm, log, strategy: str) -> None:
    server = sim()
    eng = Engine(strategy=StrategySettings(strategy, base_url=f"{server.base_url}/v1",
                                           model="shortcut-model", api_key="sk-shortcut"),
                 plugins=pm, **BUDGET)
    result = eng.compact(history(14))
    assert result.compacted and result.event is not None and result.event.fallback is None
    assert server.requests, "the summarizer endpoint was never called"
    for request in server.requests:
        assert request.body["model"] == "shortcut-model"
        assert request.headers["authorization"] == "Bearer sk-shortcut"


def test_engine_summarizer_dict_and_env(sim, pm, monkeypatch) -> None:
    server = sim()
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_BASE_URL", f"{server.base_url}/v1")
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_API_KEY", "sk-env")
    eng = Engine(strategy=StrategySettings("summary",
                                           summarizer={"model": "dict-model", "max_retries": 0}),
                 plugins=pm, **BUDGET)
    assert eng.compact(history(14)).compacted
    [request] = server.requests
    assert request.body["model"] == "dict-model"
    assert request.headers["authorization"] == "Bearer sk-env"
