"""The summarizer client against the upstream simulator over a real loopback socket."""

from __future__ import annotations

import pytest

from agentcompact._summarizer import CallInfo, Summarizer, SummarizerOverflow
from agentcompact.errors import ConfigError, SummarizerError
from agentcompact.testing import Fault, Reply, Script

from .conftest import client

pytestmark = pytest.mark.network

PROMPT = [{"role": "system", "content": "Summarize."}, {"role": "user", "content": "hello"}]


def test_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_MODEL", "m")
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_API_KEY", "sk-secret")
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_TIMEOUT", "7.5")
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_WINDOW", "8192")
    s = Summarizer()
    assert (s.base_url, s.model, s.api_key, s.timeout, s.context_window) == (
        "http://127.0.0.1:9/v1", "m", "sk-secret", 7.5, 8192)
    assert Summarizer(context_window=4096).context_window == 4096  # arguments win
    assert "sk-secret" not in repr(s)
    assert Summarizer(model="other", timeout=1).model == "other"


def test_missing_config_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTCOMPACT_SUMMARIZER_BASE_URL", raising=False)
    monkeypatch.delenv("AGENTCOMPACT_SUMMARIZER_MODEL", raising=False)
    with pytest.raises(ConfigError, match="AGENTCOMPACT_SUMMARIZER_BASE_URL"):
        Summarizer()
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="TIMEOUT"):
        Summarizer("http://x/v1", "m")
    monkeypatch.delenv("AGENTCOMPACT_SUMMARIZER_TIMEOUT")
    monkeypatch.setenv("AGENTCOMPACT_SUMMARIZER_WINDOW", "8k")
    with pytest.raises(ConfigError, match="WINDOW"):
        Summarizer("http://x/v1", "m")
    monkeypatch.delenv("AGENTCOMPACT_SUMMARIZER_WINDOW")
    assert Summarizer("http://x/v1", "m").context_window == 32_000


@pytest.mark.parametrize("stream", [False, True])
def test_sync_call_logs_summary_call(sim, pm, log, stream: bool) -> None:
    server = sim(Script("the summary"))
    s = Summarizer(**client(server, stream=stream))
    with s.session() as session:
        out = session.summarize(PROMPT, 50, CallInfo("summary", pm, "ep1", 3))
    assert out.text == "the summary"
    body = server.requests[0].body
    assert body["max_tokens"] == 50 and body["temperature"] == 0.0
    assert bool(body.get("stream")) is stream
    [call] = log.calls
    assert (call.output, call.block, call.episode_id, call.error) == ("the summary", 3, "ep1", None)
    assert call.prompt == PROMPT and call.usage["completion_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_async_call_parity(sim, pm, log, stream: bool) -> None:
    server = sim(Script("the summary"))
    s = Summarizer(**client(server, stream=stream))
    async with s.asession() as session:
        out = await session.summarize(PROMPT, 50, CallInfo("summary", pm))
    assert out.text == "the summary" and log.calls[0].output == "the summary"


@pytest.mark.parametrize("fault", [Fault.http(500), Fault.http(429), Fault.http(503)])
def test_retries_transient_errors(sim, pm, log, fault: Fault) -> None:
    server = sim(Script(Reply("x").failing(fault), "recovered"))
    s = Summarizer(**client(server, max_retries=2, backoff_s=0.01))
    with s.session() as session:
        assert session.summarize(PROMPT, 20, CallInfo("summary", pm)).text == "recovered"
    assert len(server.requests) == 2 and log.calls[-1].error is None


def test_dropped_stream_is_retried(sim, pm) -> None:
    server = sim(Script(Reply("a long answer here").failing(Fault.drop(2)), "whole"))
    s = Summarizer(**client(server, max_retries=1, backoff_s=0.01, stream=True))
    with s.session() as session:
        assert session.summarize(PROMPT, 20, CallInfo("summary", pm)).text == "whole"
    assert len(server.requests) == 2


def test_client_errors_are_not_retried(sim, pm, log) -> None:
    server = sim(Script(Reply("x").failing(Fault.http(401))))
    s = Summarizer(**client(server, max_retries=3, backoff_s=0.01))
    with s.session() as session, pytest.raises(SummarizerError, match="401"):
        session.summarize(PROMPT, 20, CallInfo("summary", pm))
    assert len(server.requests) == 1
    assert log.calls[0].error and "401" in log.calls[0].error and log.calls[0].output == ""


async def test_timeout_raises_summarizer_error(sim, pm, log) -> None:
    server = sim(Script(Reply("x").failing(Fault.hang(5))))
    s = Summarizer(**client(server, timeout=0.3))
    async with s.asession() as session:  # the server would answer after 5 s: a timeout
        with pytest.raises(SummarizerError, match="timed out"):  # is the only way to fail
            await session.summarize(PROMPT, 20, CallInfo("summary", pm))
    assert "timed out" in (log.calls[0].error or "")


def test_context_length_error_is_overflow(sim, pm) -> None:
    server = sim(Script(Fault.context_length(1000)))
    s = Summarizer(**client(server, max_retries=3))
    with s.session() as session, pytest.raises(SummarizerOverflow):
        session.summarize(PROMPT, 20, CallInfo("summary", pm))
    assert len(server.requests) == 1


def test_empty_summary_is_an_error(sim, pm) -> None:
    server = sim(Script(Reply("   ")))
    s = Summarizer(**client(server))
    with s.session() as session, pytest.raises(SummarizerError, match="empty"):
        session.summarize(PROMPT, 20, CallInfo("summary", pm))


async def _summarize(s: Summarizer, driver: str, info: CallInfo) -> str:
    if driver == "sync":
        with s.session() as session:
            return session.summarize(PROMPT, 20, info).text
    async with s.asession() as session:
        return (await session.summarize(PROMPT, 20, info)).text


@pytest.mark.parametrize("driver", ["sync", "async"])
async def test_one_retry_policy_for_both_drivers(sim, pm, log, driver: str) -> None:
    failing = Reply("x").failing(Fault.http(503))
    server = sim(Script(failing, failing, "recovered"))
    s = Summarizer(**client(server, max_retries=1, backoff_s=0.01))
    with pytest.raises(SummarizerError, match=r"HTTP 503.*after 2 attempts"):
        await _summarize(s, driver, CallInfo("summary", pm))
    assert len(server.requests) == 2  # one attempt + max_retries
    [call] = log.calls  # the failed call is logged once, with its error
    assert "503" in (call.error or "") and call.output == ""
    # a fresh call starts a fresh policy (attempts are not carried over)
    assert await _summarize(s, driver, CallInfo("summary", pm)) == "recovered"
    assert len(server.requests) == 3 and log.calls[-1].error is None
