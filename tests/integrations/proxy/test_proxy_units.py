"""Pure parts of the proxy: routing, probes, error detection, sessions, config, reassembly."""

from __future__ import annotations

import argparse
import platform
import sys

import orjson
import pytest

from agentcompact import Budget, ConfigError, StrategySettings, get_dialect
from agentcompact.integrations.proxy import ProxyConfig
from agentcompact.integrations.proxy._cli import KEEP_MEMORY_MIB, add_parser, build_config
from agentcompact.integrations.proxy._memory import keep_freed
from agentcompact.integrations.proxy._observe import redact_headers, redact_json
from agentcompact.integrations.proxy._wire import (
    dialect_for,
    error_body,
    is_anthropic_path,
    is_context_error,
    is_probe,
    request_headers,
    session_key,
)
from agentcompact.wire import iter_sse, reassemble

from .histories import anthropic_history


@pytest.mark.parametrize(("path", "dialect", "anthropic"), [
    ("/v1/messages", "anthropic", True),
    ("/v1/messages/count_tokens", None, True),
    ("/v1/chat/completions", "openai_chat", False),
    ("/api/v1/chat/completions", "openai_chat", False),
    ("/v1/responses", "openai_responses", False),
    ("/backend-api/codex/responses", "openai_responses", False),
    ("/v1/responses/compact", None, False),
    ("/v1/models", None, False),
])
def test_routing(path: str, dialect: str | None, anthropic: bool) -> None:
    assert dialect_for(path) == dialect
    assert is_anthropic_path(path) is anthropic


def test_probe_and_context_errors() -> None:
    assert is_probe({"max_tokens": 1}) and is_probe({"max_output_tokens": 0})
    assert not is_probe({"max_tokens": 2}) and not is_probe({})
    assert is_context_error(400, b'{"error":{"message":"prompt is too long: 2 > 1"}}')
    assert is_context_error(400, b'{"error":{"code":"context_length_exceeded"}}')
    assert is_context_error(413, b"This model's maximum context length is 8192 tokens")
    assert not is_context_error(500, b"prompt is too long")
    assert not is_context_error(400, b'{"error":{"message":"invalid tool schema"}}')


def test_request_headers_drop_hop_by_hop_keep_credentials() -> None:
    headers = [(b"host", b"x"), (b"connection", b"keep-alive"), (b"content-length", b"9"),
               (b"authorization", b"Bearer t"), (b"accept-encoding", b"gzip"),
               (b"anthropic-beta", b"b1")]
    assert request_headers(headers) == [(b"authorization", b"Bearer t"),
                                        (b"anthropic-beta", b"b1"),
                                        (b"accept-encoding", b"identity")]


def test_error_bodies_have_provider_shapes() -> None:
    assert error_body("anthropic", 400, "m")["error"] == {"type": "invalid_request_error",
                                                          "message": "m"}
    assert error_body("openai_chat", 502, "m", code="c")["error"]["code"] == "c"


def test_session_keys() -> None:
    d = get_dialect("anthropic")
    history = anthropic_history(3)
    claude = {"metadata": {"user_id": orjson.dumps({"session_id": "abc"}).decode()}}
    legacy = {"metadata": {"user_id": "user_ff_account_aa_session_1234abcd-99"}}
    assert session_key(d, claude, {}, history) == session_key(d, claude, {}, history[:1])
    assert session_key(d, legacy, {}, history) != session_key(d, claude, {}, history)
    assert session_key(d, {}, {"x-session-id": "s"}, history) != session_key(d, {}, {}, history)
    root = session_key(d, {}, {}, history)
    assert root == session_key(d, {}, {}, history[:3])  # grows: same root
    other = [{"role": "user", "content": "another task"}]
    assert root != session_key(d, {}, {}, other)
    assert len(root) == 16 and "abc" not in root


def test_config_env_and_flag_precedence() -> None:
    env = {"AGENTCOMPACT_TRIGGER": "120000", "AGENTCOMPACT_SHADOW": "yes",
           "AGENTCOMPACT_ANTHROPIC_UPSTREAM": "http://up:1/", "AGENTCOMPACT_TARGET": "",
           "AGENTCOMPACT_STRATEGY_OPTIONS": '{"keep": 2}'}
    config = ProxyConfig.from_env(env)
    assert (config.budget, config.shadow) == (Budget(120_000), True)
    assert config.anthropic_upstream == "http://up:1"
    assert config.strategy == StrategySettings("cliff", options={"keep": 2})
    config = ProxyConfig.from_env(env, budget=Budget(90_000, 40_000))
    assert config.budget == Budget(90_000, 40_000) and config.shadow
    with pytest.raises(ConfigError):
        ProxyConfig.from_env({"AGENTCOMPACT_STRICT": "maybe"})
    with pytest.raises(ConfigError, match="--target"):
        ProxyConfig.from_env({"AGENTCOMPACT_TRIGGER": "100", "AGENTCOMPACT_TARGET": "200"})


def test_config_takes_the_engines_options_and_names_where_others_go() -> None:
    config = ProxyConfig(strategy="summary", budget=Budget(50_000), counter="chars")
    assert config.strategy == StrategySettings("summary") and config.budget.trigger == 50_000
    settings = StrategySettings("cliff", options={"segments": 3})
    assert ProxyConfig(strategy=settings).strategy is settings
    for wrong in ({"trigger": 5000}, {"target": 100}, {"strategy_options": {"a": 1}}):
        with pytest.raises(ConfigError, match=r"budget=Budget\(trigger_tokens=.*"
                                              r"strategy=StrategySettings\(name"):
            ProxyConfig(**wrong)
        with pytest.raises(ConfigError, match="unknown setting"):
            ProxyConfig().replace(**wrong)
        with pytest.raises(ConfigError, match="unknown setting"):
            ProxyConfig.from_env({}, **wrong)
    with pytest.raises(ConfigError, match="ProxyConfig.budget must be a Budget"):
        ProxyConfig(budget=5000)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="strategy name or a StrategySettings"):
        ProxyConfig(strategy=object())  # type: ignore[arg-type]


def test_cli_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTCOMPACT_PORT", "9000")
    monkeypatch.setenv("AGENTCOMPACT_STRICT", "1")
    monkeypatch.setenv("AGENTCOMPACT_TARGET", "2000")  # with the flag's trigger
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["proxy", "--trigger", "5000", "--shadow",
                              "--strategy-option", "cap=300", "--strategy-option", "x=abc"])
    config = build_config(args)
    assert (config.port, config.budget, config.shadow, config.strict) == (
        9000, Budget(5000, 2000), True, True)
    assert config.strategy == StrategySettings("cliff", options={"cap": 300, "x": "abc"})
    assert args.func.__name__ == "run"
    assert args.keep_memory == KEEP_MEMORY_MIB
    assert parser.parse_args(["proxy", "--keep-memory", "0"]).keep_memory == 0


def test_keep_freed_sets_glibc_allocator_options_and_nothing_else() -> None:
    assert keep_freed(0) is False  # 0: the allocator's defaults are left alone
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert keep_freed(KEEP_MEMORY_MIB) is glibc


def test_redaction() -> None:
    assert redact_headers({"x-api-key": "k", "Authorization": "b", "accept": "a"}) == {
        "x-api-key": "[redacted]", "Authorization": "[redacted]", "accept": "a"}
    assert redact_json({"api_key": "s", "max_tokens": 5, "nested": [{"access_token": "t"}]}) == {
        "api_key": "[redacted]", "max_tokens": 5, "nested": [{"access_token": "[redacted]"}]}


def test_sse_parsing_and_truncated_stream() -> None:
    data = b"event: a\r\ndata: {\"x\": 1}\r\n\r\n: comment\n\ndata: [DONE]\n\n"
    assert list(iter_sse(data)) == [("a", '{"x": 1}'), (None, "[DONE]")]
    cut = (b'event: message_start\ndata: {"type":"message_start","message":{"model":"m",'
           b'"usage":{"input_tokens":3}}}\n\nevent: content_block_start\ndata: {"type":'
           b'"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
           b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
           b'"text":"hi"}}\n\n')
    got = reassemble("anthropic", cut, streamed=True)
    assert got.response == [{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]
    assert not got.complete and got.model == "m"


def test_sse_reader_reads_the_same_events_however_the_bytes_are_split() -> None:
    from agentcompact.wire import SSEReader

    data = (b"event: a\r\ndata: {\"x\": 1}\r\n\r\n: comment\n\ndata: one\ndata: two\n\n"
            b"data:tight\r\rdata: [DONE]\n\ndata: last, no blank line")
    whole = SSEReader()
    expected = whole.feed(data) + whole.close()
    assert expected == [b'{"x": 1}', b"one\ntwo", b"tight", b"[DONE]", b"last, no blank line"]
    for cut in range(len(data) + 1):
        reader = SSEReader()
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) + reader.close() == expected
    reader = SSEReader()
    assert [e for i in range(len(data)) for e in reader.feed(data[i:i + 1])] + reader.close() \
        == expected


def test_create_app_is_a_starlette_app_with_the_proxy_routes() -> None:
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from agentcompact import new_plugin_manager
    from agentcompact.integrations.proxy import create_app

    app = create_app(ProxyConfig(log_requests=False), plugins=new_plugin_manager())
    assert isinstance(app, Starlette)
    assert [route.path for route in app.routes] == ["/agentcompact/status", "/{path:path}"]
    with TestClient(app) as client:  # lifespan runs; the status page goes through Starlette
        status = client.get("/agentcompact/status").json()
    assert status["requests"] == 0


def _watch_run(disconnect_after: float, work_s: float) -> tuple[tuple[bool, object], int]:
    """``until_disconnect`` on a sleeping ``work`` with a client that leaves after
    ``disconnect_after`` s; returns its result and the task's pending cancellations after."""
    import asyncio

    from agentcompact.integrations.proxy._relay import until_disconnect

    async def receive() -> dict[str, str]:
        await asyncio.sleep(disconnect_after)
        return {"type": "http.disconnect"}

    async def work() -> str:
        await asyncio.sleep(work_s)
        return "answered"

    async def main() -> tuple[tuple[bool, object], int]:
        out = await until_disconnect(work(), receive)
        await asyncio.sleep(0.01)  # a cancellation leaking out of the call would raise here
        task = asyncio.current_task()
        assert task is not None
        return out, task.cancelling() if hasattr(task, "cancelling") else 0

    return asyncio.run(main())


def test_until_disconnect_cancels_work_when_the_client_leaves() -> None:
    out, pending = _watch_run(disconnect_after=0.0, work_s=30)
    assert out == (False, None) and pending == 0


def test_until_disconnect_returns_the_work_when_it_finishes_first() -> None:
    out, pending = _watch_run(disconnect_after=30, work_s=0.0)
    assert out == (True, "answered") and pending == 0


def test_client_watch_spans_steps_and_stops_the_step_running_when_the_client_leaves(
) -> None:
    import asyncio

    from agentcompact.integrations.proxy._relay import ClientWatch

    async def main() -> list[object]:
        leave = asyncio.Event()

        async def receive() -> dict[str, str]:
            await leave.wait()
            return {"type": "http.disconnect"}

        async def step(value: str, wait: float) -> str:
            await asyncio.sleep(wait)
            return value

        watch = ClientWatch(receive)
        out: list[object] = [await watch.run(step("headers", 0))]
        leave.set()
        out.append(await watch.run(step("relayed", 30)))  # cancelled when the client leaves
        out.append(await watch.run(step("never", 0)))  # the client is gone: not run
        await asyncio.sleep(0.01)  # a cancellation leaking out of run() would raise here
        watch.close()
        task = asyncio.current_task()
        assert task is not None
        out.append(task.cancelling())
        return out

    if not hasattr(asyncio.Task, "uncancel"):
        pytest.skip("ClientWatch needs Task.uncancel (Python 3.11)")
    assert asyncio.run(main()) == [(True, "headers"), (False, None), (False, None), 0]


def test_upstreams_behind_an_environment_proxy_go_through_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from agentcompact.integrations.proxy._upstream import UpstreamClient, UpstreamError

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("NO_PROXY", "internal.test")
    client = UpstreamClient(5, 30)
    target, via = client.route("https://api.example.test/v1/messages?beta=%2F")
    # the path and query exactly as the client wrote them
    assert (str(target), via) == ("https://api.example.test/v1/messages?beta=%2F",
                                  "http://proxy.test:3128")
    assert client.route("https://internal.test/v1/messages")[1] is None  # NO_PROXY
    with pytest.raises(UpstreamError, match="not an http"):
        client.route("ftp://api.example.test/v1/messages")
    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "HTTP_PROXY",
                 "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert UpstreamClient(5, 30).route("https://api.example.test/v1/messages")[1] is None


def test_debug_dumps_redact_with_the_project_policy() -> None:
    """The ``--debug-dir`` dumps use the recorder's policy: ``private_key``, ``credentials``
    and ``passwd`` (missed by the proxy's old rule) are redacted too."""
    body = {"private_key": "k", "credentials": {"user": "u"}, "passwd": "p",
            "metadata": {"user_id": "me"}, "max_tokens": 5}
    assert redact_json(body) == {"private_key": "[redacted]", "credentials": "[redacted]",
                                 "passwd": "[redacted]", "metadata": {"user_id": "me"},
                                 "max_tokens": 5}


class _Upstream:
    """An upstream answer in the shape ``RelayResponse`` reads (the relay is under test)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.status_code = 200
        self.raw_headers = [(b"content-type", b"text/event-stream")]
        self.chunks = list(chunks)
        self.closed: bool | None = None

    async def next_chunk(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def close(self, complete: bool) -> None:
        self.closed = complete


@pytest.mark.parametrize("chunks", [[b"data: 1\n\n", b"data: 2\n\n"], []])
def test_relay_runs_after_first_once_the_first_chunk_is_sent_and_before_on_close(
        chunks: list[bytes]) -> None:
    import asyncio

    from agentcompact.integrations.proxy._relay import RelayResponse

    events: list[object] = []

    async def send(message: dict[str, object]) -> None:
        events.append(message.get("body", message["type"]))

    async def receive() -> dict[str, str]:
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    upstream = _Upstream(chunks)
    relay = RelayResponse(upstream, after_first=lambda: events.append("after_first"),  # type: ignore[arg-type]
                          on_close=lambda ok: events.append(("closed", ok)))
    asyncio.run(relay({"type": "http"}, receive, send))
    if chunks:
        assert events == ["http.response.start", chunks[0], "after_first", chunks[1], b"",
                          ("closed", True)]
    else:  # no chunk: it runs before the end of the answer
        assert events == ["http.response.start", "after_first", b"", ("closed", True)]
    assert upstream.closed is True


def test_relay_sends_the_last_bytes_once_the_work_after_first_is_done() -> None:
    """``after_first`` started work elsewhere (the engine measuring in a worker thread):
    the answer's last bytes wait for it, so a client holding the whole answer finds it
    done; the first bytes do not."""
    import asyncio

    from agentcompact.integrations.proxy._relay import RelayResponse

    events: list[object] = []

    async def send(message: dict[str, object]) -> None:
        events.append(message.get("body", message["type"]))

    async def receive() -> dict[str, str]:
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    async def work() -> None:
        await asyncio.sleep(0.05)
        events.append("work done")

    async def main() -> None:
        relay = RelayResponse(_Upstream([b"data: 1\n\n", b"data: 2\n\n"]),  # type: ignore[arg-type]
                              after_first=lambda: asyncio.ensure_future(work()))
        await relay({"type": "http"}, receive, send)

    asyncio.run(main())
    assert events == ["http.response.start", b"data: 1\n\n", b"data: 2\n\n", "work done", b""]


def test_a_client_leaving_before_the_last_bytes_does_not_cancel_the_work_after_first() -> None:
    """A client with every event of the answer may leave before its last bytes (Codex
    exits at ``response.completed``): the relay is cancelled, the work ``after_first``
    started (the engine measuring, then the exchange's log line and counters) is not."""
    import asyncio

    from agentcompact.integrations.proxy._relay import RelayResponse

    events: list[object] = []

    async def main() -> asyncio.Future[None]:
        has_all = asyncio.Event()

        async def send(message: dict[str, object]) -> None:
            events.append(message.get("body", message["type"]))
            if message.get("body") == b"data: 2\n\n":
                has_all.set()

        async def receive() -> dict[str, str]:
            await has_all.wait()
            return {"type": "http.disconnect"}

        async def work() -> None:
            await asyncio.sleep(0.05)
            events.append("work done")

        started: list[asyncio.Future[None]] = []
        relay = RelayResponse(_Upstream([b"data: 1\n\n", b"data: 2\n\n"]),  # type: ignore[arg-type]
                              after_first=lambda: started.append(
                                  asyncio.ensure_future(work())) or started[0],
                              on_close=lambda ok: events.append(("closed", ok)))
        await relay({"type": "http"}, receive, send)
        await asyncio.wait(started, timeout=5)
        return started[0]

    work_done = asyncio.run(main())
    assert not work_done.cancelled()
    assert events == ["http.response.start", b"data: 1\n\n", b"data: 2\n\n", ("closed", False),
                      "work done"]
