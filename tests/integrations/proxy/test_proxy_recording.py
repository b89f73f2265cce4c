"""``--record`` of answers as upstreams send them: content codings removed before the
answer is read (relayed to the client as sent), a call that cannot be read named in one
warning and left out (never an empty assistant turn), and a long stream reassembled away
from the event loop (another session's stream keeps flowing)."""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from agentcompact import new_plugin_manager
from agentcompact.integrations.proxy import ProxyConfig, ThreadedServer, create_app
from agentcompact.testing import LatencyModel, UpstreamSim, filler_text, serve

pytestmark = pytest.mark.network

ANSWER = "Hello from a compressed answer."


def chat_json(text: str = ANSWER) -> bytes:
    return orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 6}})


def chat_sse(pieces: list[str], ids: bool = False) -> bytes:
    """A chat.completion.chunk stream, vLLM-style with ``ids`` (token ids and logprobs
    per chunk)."""
    frames = []
    for i, piece in enumerate(pieces):
        choice: dict[str, Any] = {"index": 0, "delta": {"content": piece},
                                  "finish_reason": "stop" if i == len(pieces) - 1 else None}
        if ids:
            choice["token_ids"] = [i]
            choice["logprobs"] = {"content": [{"token": piece, "logprob": -0.5,
                                               "bytes": list(piece.encode()),
                                               "top_logprobs": []}]}
        frames.append(b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk",
                                                "model": "m", "choices": [choice]}) + b"\n\n")
    return b"".join(frames) + b"data: [DONE]\n\n"


def encode(data: bytes, coding: str) -> bytes:
    if coding == "gzip":
        return gzip.compress(data)
    if coding == "gzip-two-members":
        return gzip.compress(data[:10]) + gzip.compress(data[10:])
    if coding == "deflate":
        return zlib.compress(data)
    if coding == "deflate-raw":
        raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        return raw.compress(data) + raw.flush()
    if coding == "br":
        import brotli

        return bytes(brotli.compress(data))
    if coding == "zstd":
        import zstandard

        return bytes(zstandard.ZstdCompressor().compress(data))
    if coding == "gzip, br":
        import brotli

        return bytes(brotli.compress(gzip.compress(data)))
    return data


class EncodingUpstream:
    """An upstream answering each chat request with the body its test headers ask for,
    content-coded as asked (``x-test-coding``), as a stream or not (``x-test-stream``),
    sent in small pieces (a coding's frames split between chunks)."""

    def __init__(self, piece: int = 7) -> None:
        self.body = b""
        self.piece = piece

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        while (await receive()).get("more_body"):
            pass
        headers = dict(scope["headers"])
        coding = headers.get(b"x-test-coding", b"").decode()
        stream = headers.get(b"x-test-stream") == b"1"
        body = self.body or (chat_sse(["Hello ", "from a ", "compressed answer."]) if stream
                             else chat_json())
        wire = {"gzip-two-members": "gzip", "deflate-raw": "deflate",
                "claim-gzip": "gzip"}.get(coding, coding)
        out = [(b"content-type", b"text/event-stream" if stream else b"application/json")]
        if coding:
            out.append((b"content-encoding", wire.encode()))
        data = encode(body, coding)
        await send({"type": "http.response.start", "status": 200, "headers": out})
        for start in range(0, len(data), self.piece):
            await send({"type": "http.response.body", "body": data[start:start + self.piece],
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[Any]:
    """A recording proxy in front of an ``EncodingUpstream``: ``(proxy, upstream, run)``."""
    app = EncodingUpstream()
    with serve(app) as upstream:
        config = ProxyConfig(openai_upstream=upstream.base_url,
                             anthropic_upstream=upstream.base_url, log_requests=False,
                             record=str(tmp_path / "run"), store="memory")
        proxy = ThreadedServer(create_app(config, plugins=new_plugin_manager())).start()
        try:
            yield proxy, app, tmp_path / "run"
        finally:
            proxy.stop()


def calls(proxy: ThreadedServer, run: Path) -> list[dict[str, Any]]:
    proxy.stop()  # the recorder's writes are done
    lines = (run / "events.jsonl").read_bytes().splitlines()
    return [e["data"] for e in map(orjson.loads, lines) if e["kind"] == "model_call"]


def ask(proxy: ThreadedServer, coding: str, stream: bool) -> tuple[int, bytes]:
    """The answer's status and its bytes as relayed (not decoded here)."""
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", proxy.base_url + "/v1/chat/completions", json={
                "model": "m", "stream": stream,
                "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-test-coding": coding, "x-test-stream": "1" if stream else "0"}
    ) as answer:
        return answer.status_code, b"".join(answer.iter_raw())


CODINGS = ["gzip", "gzip-two-members", "deflate", "deflate-raw", "br", "zstd", "gzip, br"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("coding", CODINGS)
def test_content_coded_answers_are_recorded_decoded(recorded: Any, coding: str,
                                                    stream: bool) -> None:
    pytest.importorskip("brotli" if "br" in coding else "zlib")
    if coding == "zstd":
        pytest.importorskip("zstandard")
    proxy, upstream, run = recorded
    status, relayed = ask(proxy, coding, stream)
    assert status == 200
    sent = chat_sse(["Hello ", "from a ", "compressed answer."]) if stream else chat_json()
    assert relayed == encode(sent, coding)  # relayed as sent: the client decodes
    (call,) = calls(proxy, run)
    assert call["response"] == [{"role": "assistant", "content": ANSWER}]


@pytest.mark.parametrize("coding, stream, body, why", [
    ("x-unknown", False, b"", "Content-Encoding 'x-unknown' is not one the recorder decodes"),
    ("claim-gzip", True, b"data: {}\n\n", "its gzip content does not decode"),
    ("", True, b"data: not json\n\ndata: [DONE]\n\n", "holds no event the recorder can read"),
    ("", False, b"<html>gateway</html>", "the answer is not JSON"),
    ("", False, b"[1, 2]", "the answer is a JSON list, not an object"),
])
def test_an_answer_that_cannot_be_read_is_named_and_left_out(
        recorded: Any, caplog: pytest.LogCaptureFixture, coding: str, stream: bool,
        body: bytes, why: str) -> None:
    proxy, upstream, run = recorded
    upstream.body = body
    caplog.set_level(logging.WARNING, logger="agentcompact")
    status, _ = ask(proxy, coding, stream)
    assert status == 200
    assert calls(proxy, run) == []  # no row rather than a wrong one
    lines = [r.getMessage() for r in caplog.records if "--record" in r.getMessage()]
    assert len(lines) == 1 and why in lines[0], lines
    assert "/v1/chat/completions" in lines[0]
    assert all(r.exc_info is None for r in caplog.records)  # no traceback


TOKENS = 24_000


def test_a_long_recorded_stream_is_reassembled_off_the_event_loop(tmp_path: Path) -> None:
    """A 24k-token vLLM-style stream (token ids and logprobs in every chunk) ends while
    another session streams through the same proxy (``agentcompact proxy --record``, a
    process of its own): its reassembly and recording take no turn of the loop that
    relays the other stream (on the loop, in quadratic time, they stalled it 9 s on a
    loaded 2-core machine)."""
    big = EncodingUpstream(piece=64 * 1024)
    big.body = chat_sse([f" w{i % 997}" for i in range(TOKENS)], ids=True)
    slow = UpstreamSim(latency=LatencyModel(decode_tokens_per_s=40))
    with serve(big) as chat_upstream, serve(slow) as anthropic_upstream, proxy_process(
            tmp_path, "--record", str(tmp_path / "run"), "--store", "memory:",
            "--openai-upstream", chat_upstream.base_url,
            "--anthropic-upstream", anthropic_upstream.base_url) as url:
        arrivals: list[float] = []
        started = threading.Event()

        def stream() -> None:
            with httpx.Client(timeout=60) as client, client.stream(
                    "POST", url + "/v1/messages", json={
                        "model": "m", "max_tokens": 4096, "stream": True,
                        "messages": [{"role": "user", "content": filler_text(80)}]}) as answer:
                for _ in answer.iter_raw():
                    arrivals.append(time.monotonic())
                    started.set()

        other = threading.Thread(target=stream, daemon=True)
        other.start()
        assert started.wait(20)
        with httpx.Client(timeout=60) as client, client.stream(
                "POST", url + "/v1/chat/completions", json={
                    "model": "m", "stream": True,
                    "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-test-stream": "1"}) as answer:
            assert answer.status_code == 200
            for _ in answer.iter_raw():
                pass
        other.join(30)
    gap = max(b - a for a, b in zip(arrivals, arrivals[1:]))
    assert gap < 0.5, gap  # chunks every 25 ms
    lines = (tmp_path / "run" / "events.jsonl").read_bytes().splitlines()
    (call,) = [e["data"] for e in map(orjson.loads, lines)
               if e["kind"] == "model_call" and e["data"]["dialect"] == "openai_chat"]
    assert call["response_token_ids"] == list(range(TOKENS))
    assert len(call["response_logprobs"]) == TOKENS


@contextlib.contextmanager
def proxy_process(tmp_path: Path, *args: str) -> Iterator[str]:
    """``agentcompact proxy ARGS`` in a process of its own; its URL. Stopped by SIGTERM
    (its recorder's writes done)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "AGENTCOMPACT_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "agentcompact", "proxy", "--port",
                             str(port), "--quiet", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/agentcompact/status", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "no proxy"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
