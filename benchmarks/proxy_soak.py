"""Soak: many concurrent streaming sessions through the agentcompact proxy, checked chunk by
chunk.

The upstream simulator (own process, paced decoding) streams each reply in 4-character
deltas; every session asks for a numbered sequence, so the client knows the exact deltas
to expect and checks that none is lost, duplicated or reordered. Sessions rotate over the
three protocols (Anthropic Messages, OpenAI Chat, OpenAI Responses) and grow one turn per
request, so the proxy also compacts while streaming. Prints totals; exit status 1 on any
error or mismatch.

``--requests N`` stops after N requests; ``--idle S`` has each session pause about S
seconds after every tenth request, so pooled client connections sit idle around a
keep-alive limit (httpx, the client here, drops its idle connections after 5 s; a server
closing them at the same moment loses the POSTs sent on them). A POST that fails on the
way (``lost``) is counted and the session goes on. ``--compare-keep-alive S`` runs the
soak twice in one run: the proxy keeping idle connections S seconds (uvicorn's default,
5), then with its own default.

    TIKTOKEN_CACHE_DIR=... python benchmarks/proxy_soak.py [--seconds 120] [--sessions 32]
    python benchmarks/proxy_soak.py --requests 6400 --idle 5 --compare-keep-alive 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault(  # the shared data beside the checkout (../shared/data/tiktoken)
    "TIKTOKEN_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/data/tiktoken"),
)

import httpx  # noqa: E402 - after the offline tiktoken setting
import orjson  # noqa: E402

from agentcompact.testing import filler_text  # noqa: E402
from agentcompact.testing._script import split_tokens  # noqa: E402
from agentcompact.wire import iter_sse  # noqa: E402

PATHS = ("/v1/messages", "/v1/chat/completions", "/v1/responses")


@dataclass
class Totals:
    requests: int = 0
    chunks: int = 0
    compacted_sends: int = 0
    lost: int = 0  # POSTs that failed on the way (a connection closed under them)
    errors: list[str] = field(default_factory=list)
    limit: int | None = None  # requests to send in all
    idle: float = 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_STATE = tempfile.TemporaryDirectory(prefix="agentcompact-soak-")


def spawn(args: list[str], port: int) -> subprocess.Popen[bytes]:
    # the proxy's default store in a folder of this run: never ~/.agentcompact, whose
    # prefixes from another run (or another checkout) would apply to these sessions
    env = {**os.environ, "AGENTCOMPACT_STATE_DIR": tempfile.mkdtemp(dir=_STATE.name)}
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
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
    pauses = random.Random(index)
    while time.monotonic() < until and (totals.limit is None
                                        or totals.requests + totals.lost < totals.limit):
        if totals.idle and turn and turn % 10 == 0:
            await asyncio.sleep(pauses.uniform(totals.idle - 0.3, totals.idle + 0.3))
        numbers = "".join(f"{(index * 100_000 + turn * 100 + i) % 10**8:08d}" for i in range(40))
        body = request(path, history, numbers)
        try:
            async with client.stream("POST", path, content=orjson.dumps(body),
                                     headers={"content-type": "application/json",
                                              "x-session-id": f"soak-{index}"}) as r:
                data = b"".join([chunk async for chunk in r.aiter_raw()])
                status = r.status_code
        except httpx.TransportError as exc:
            totals.lost += 1
            totals.errors.append(f"session {index} turn {turn}: lost: {exc!r}")
            continue
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


async def soak(base_url: str, sessions: int, seconds: float, limit: int | None = None,
               idle: float = 0.0) -> Totals:
    totals = Totals(limit=limit, idle=idle)
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
    parser.add_argument("--requests", type=int, help="stop after this many requests")
    parser.add_argument("--idle", type=float, default=0.0,
                        help="seconds each session pauses after every tenth request")
    parser.add_argument("--compare-keep-alive", type=float, metavar="SECONDS",
                        help="first run the proxy with --keep-alive SECONDS, then its default")
    args = parser.parse_args(argv)
    if args.requests and args.seconds == 120.0:
        args.seconds = 3600.0  # the request count ends the run
    failed = False
    runs = [None] if args.compare_keep_alive is None else [args.compare_keep_alive, None]
    for keep_alive in runs:
        failed |= run(args, keep_alive)
    return 1 if failed else 0


def run(args: argparse.Namespace, keep_alive: float | None) -> bool:
    """One soak against a fresh proxy; True when it failed."""
    sim_port, proxy_port = free_port(), free_port()
    sim = spawn(["agentcompact.testing", "--port", str(sim_port),
                 "--decode", str(args.decode)], sim_port)
    upstream = f"http://127.0.0.1:{sim_port}"
    extra = [] if keep_alive is None else ["--keep-alive", str(keep_alive)]
    proxy = spawn(["agentcompact.integrations.proxy", "--port", str(proxy_port), "--quiet",
                   "--trigger", str(args.trigger), "--anthropic-upstream", upstream,
                   "--openai-upstream", upstream, *extra], proxy_port)
    try:
        t0 = time.monotonic()
        totals = asyncio.run(soak(f"http://127.0.0.1:{proxy_port}", args.sessions,
                                  args.seconds, args.requests, args.idle))
        elapsed = time.monotonic() - t0
        status = httpx.get(f"http://127.0.0.1:{proxy_port}/agentcompact/status").json()
    finally:
        for proc in (proxy, sim):
            proc.terminate()
            proc.wait(10)
    setting = "default" if keep_alive is None else f"{keep_alive:g} s"
    print(f"{args.sessions} sessions x {elapsed:.0f} s (keep-alive {setting}, idle "
          f"{args.idle:g} s): {totals.requests} streamed requests, {totals.lost} POSTs lost, "
          f"{totals.chunks} deltas checked in order, {len(totals.errors) - totals.lost} other "
          f"errors; proxy: {status['compactions']} compactions, {status['tokens_saved']} "
          f"tokens saved, {status['fail_open']} fail-open, {status['open_streams']} streams "
          f"open at the end; held {status['held']['sent']} sent "
          f"({status['held']['sent_early']} before measuring), {status['held']['dropped']} "
          f"dropped")
    for error in totals.errors[:10]:
        print("  error:", error)
    return bool(totals.errors or status["open_streams"])


if __name__ == "__main__":
    raise SystemExit(main())
