"""Soak: many concurrent streaming sessions through the agentcompact proxy, checked chunk by
chunk.

The upstream simulator (own process, paced decoding) streams each reply in 4-character
deltas; every session asks for a numbered sequence, so the client knows the exact deltas
to expect and checks that none is lost, duplicated or reordered. Sessions rotate over the
three protocols (Anthropic Messages, OpenAI Chat, OpenAI Responses) and grow one turn per
request, so the proxy also compacts while streaming. Prints totals; exit status 1 on any
error or mismatch.

    TIKTOKEN_CACHE_DIR=... python benchmarks/proxy_soak.py [--seconds 120] [--sessions 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault(  # the shared data beside the checkout (../shared/data/tiktoken)
    "TIKTOKEN_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/data/tiktoken"),
)

import httpx  # noqa: E402 - after the offline tiktoken setting
import orjson  # noqa: E402

from agentcompact.integrations.proxy._reassemble import iter_sse  # noqa: E402
from agentcompact.testing import filler_text  # noqa: E402
from agentcompact.testing._script import split_tokens  # noqa: E402

PATHS = ("/v1/messages", "/v1/chat/completions", "/v1/responses")


@dataclass
class Totals:
    requests: int = 0
    chunks: int = 0
    compacted_sends: int = 0
    errors: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(args: list[str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"{args[0]} did not start") from None
            time.sleep(0.05)


def request(path: str, history: list[Any], numbers: str) -> dict[str, Any]:
    """The session's next request: its history plus a user turn carrying ``numbers``."""
    if path == "/v1/messages":
        return {"model": "sim", "max_tokens": 4096, "stream": True,
                "messages": [*history, {"role": "user", "content": numbers}]}
    if path == "/v1/chat/completions":
        return {"model": "sim", "stream": True,
                "messages": [*history, {"role": "user", "content": numbers}]}
    return {"model": "sim", "stream": True,
            "input": [*history, {"role": "user", "content": numbers}]}


def deltas(path: str, data: bytes) -> list[str]:
    """The text deltas of one SSE stream, in arrival order."""
    out: list[str] = []
    for _, payload in iter_sse(data):
        if payload == "[DONE]":
            continue
        ev = orjson.loads(payload)
        if path == "/v1/messages" and ev.get("type") == "content_block_delta":
            out.append(ev["delta"].get("text", ""))
        elif path == "/v1/chat/completions":
            out += [c["delta"]["content"] for c in ev.get("choices", ())
                    if c.get("delta", {}).get("content")]
        elif ev.get("type") == "response.output_text.delta":
            out.append(ev["delta"])
    return out


async def session(client: httpx.AsyncClient, index: int, until: float, totals: Totals) -> None:
    path = PATHS[index % len(PATHS)]
    history: list[Any] = []
    turn = 0
    while time.monotonic() < until:
        numbers = "".join(f"{(index * 100_000 + turn * 100 + i) % 10**8:08d}" for i in range(40))
        body = request(path, history, numbers)
        try:
            async with client.stream("POST", path, content=orjson.dumps(body),
                                     headers={"content-type": "application/json",
                                              "x-session-id": f"soak-{index}"}) as r:
                data = b"".join([chunk async for chunk in r.aiter_raw()])
                status = r.status_code
        except httpx.HTTPError as exc:
            totals.errors.append(f"session {index} turn {turn}: {exc!r}")
            return
        got = deltas(path, data)
        expected = split_tokens("echo: " + numbers)
        if status != 200 or got != expected:
            totals.errors.append(f"session {index} turn {turn}: status {status}, "
                                 f"{len(got)} deltas vs {len(expected)} expected")
            return
        totals.requests += 1
        totals.chunks += len(got)
        history += _turn(path, numbers, turn)
        turn += 1


def _turn(path: str, numbers: str, turn: int) -> list[Any]:
    """The user message as sent and the assistant's answer with padding (to grow the
    context): the next request extends this one, as an agent's does."""
    pad = filler_text(400)
    if path == "/v1/responses":
        return [{"role": "user", "content": numbers},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": f"echo {turn} {pad}"}]}]
    return [{"role": "user", "content": numbers},
            {"role": "assistant", "content": f"echo {turn} {pad}"}]


async def soak(base_url: str, sessions: int, seconds: float) -> Totals:
    totals = Totals()
    until = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        await asyncio.gather(*(session(client, i, until, totals) for i in range(sessions)))
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--decode", type=float, default=400.0,
                        help="upstream decode rate, tokens/s per stream")
    parser.add_argument("--trigger", type=int, default=8000,
                        help="proxy trigger in tokens (small, so sessions get compacted)")
    args = parser.parse_args(argv)
    sim_port, proxy_port = free_port(), free_port()
    sim = spawn(["agentcompact.testing", "--port", str(sim_port),
                 "--decode", str(args.decode)], sim_port)
    upstream = f"http://127.0.0.1:{sim_port}"
    proxy = spawn(["agentcompact.integrations.proxy", "--port", str(proxy_port), "--quiet",
                   "--trigger", str(args.trigger), "--anthropic-upstream", upstream,
                   "--openai-upstream", upstream], proxy_port)
    try:
        t0 = time.monotonic()
        totals = asyncio.run(soak(f"http://127.0.0.1:{proxy_port}", args.sessions, args.seconds))
        elapsed = time.monotonic() - t0
        status = httpx.get(f"http://127.0.0.1:{proxy_port}/agentcompact/status").json()
    finally:
        for proc in (proxy, sim):
            proc.terminate()
            proc.wait(10)
    print(f"{args.sessions} sessions x {elapsed:.0f} s: {totals.requests} streamed requests, "
          f"{totals.chunks} deltas checked in order, {len(totals.errors)} errors; proxy: "
          f"{status['compactions']} compactions, {status['tokens_saved']} tokens saved, "
          f"{status['fail_open']} fail-open, {status['open_streams']} streams open at the end; "
          f"held {status['held']['sent']} sent ({status['held']['sent_early']} before "
          f"measuring), {status['held']['dropped']} dropped")
    for error in totals.errors[:10]:
        print("  error:", error)
    return 1 if totals.errors or status["open_streams"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
