"""Faults a shared proxy meets, measured on a real ``agentcompact proxy`` process.

* ``store``: another process holds the default SQLite store's write lock (``--hold``
  seconds, 30 by default) while session A streams and session B sends requests that
  compact (prefix saves, archive writes): A's largest gap between two chunks and B's
  request times, before and during the lock, and the store's state on the status page.
* ``record``: ``--record`` reassembly of vLLM-style streams (token ids and logprobs in
  every chunk) from 8k to 64k tokens, in process (per-token time: linear means flat);
  through the proxy, a 64k-token answer recorded while session A streams (A's largest
  gap), the proxy's resident memory after a recorded answer of ``--big-mb`` MB (150), and
  how long the proxy takes to exit on SIGTERM right after a 100 MB recorded answer.
* ``history``: the first request of a session carrying 4,000 and 8,000 turns (``--turns``; agent
  turns with ~600-token tool results; default proxy settings), the time until it is
  answered (the upstream answers at once) and the proxy's CPU time for it, ``--repeats``
  times (new sessions, histories of their own): the ratios of the medians.

Prints one line per figure. The machine's load is printed too: on a shared machine the
absolute times vary, compare the figures of one run.

    TIKTOKEN_CACHE_DIR=... python benchmarks/proxy_faults.py [--only store,record,history]
        [--hold 30] [--big-mb 150] [--turns 4000] [--repeats 3] [--keep-memory MIB]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault(  # the shared data beside the checkout (../shared/data/tiktoken)
    "TIKTOKEN_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/data/tiktoken"),
)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.…histories

import httpx  # noqa: E402 - after the offline tiktoken setting
import orjson  # noqa: E402

from agentcompact.testing import filler_text, serve  # noqa: E402
from agentcompact.wire import reassemble  # noqa: E402
from tests.integrations.proxy.histories import anthropic_history, chat_history  # noqa: E402


# --- processes ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def process(args: list[str], port: int, env: dict[str, str] | None = None
            ) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m ARGS`` listening on ``port``; terminated on exit."""
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"{args[0]} did not start") from None
            time.sleep(0.05)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)


@contextmanager
def proxy(state: Path, *extra: str, openai: str, anthropic: str
          ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    with process(["agentcompact", "proxy", "--port", str(port), "--quiet",
                  "--log-level", "ERROR", "--openai-upstream", openai,
                  "--anthropic-upstream", anthropic, *extra], port,
                 {"AGENTCOMPACT_STATE_DIR": str(state)}) as proc:
        yield f"http://127.0.0.1:{port}", proc


@contextmanager
def sim(decode: float | None = None) -> Iterator[str]:
    port = free_port()
    args = ["agentcompact.testing", "--port", str(port)]
    with process(args + (["--decode", str(decode)] if decode else []), port):
        yield f"http://127.0.0.1:{port}"


class Streamer(threading.Thread):
    """Session A: one long streamed answer; each chunk's arrival time."""

    def __init__(self, url: str, tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.tokens = url, tokens
        self.arrivals: list[float] = []
        self.started = threading.Event()

    def run(self) -> None:
        body = {"model": "m", "max_tokens": 100_000, "stream": True,
                "messages": [{"role": "user", "content": filler_text(self.tokens)}]}
        with httpx.Client(timeout=600) as client, client.stream(
                "POST", self.url + "/v1/messages", content=orjson.dumps(body),
                headers={"x-session-id": "streamer"}) as answer:
            for _ in answer.iter_raw():
                self.arrivals.append(time.monotonic())
                self.started.set()

    def largest_gap(self, start: float, end: float) -> float:
        gaps = [b - a for a, b in zip(self.arrivals, self.arrivals[1:]) if start <= b <= end]
        return max(gaps, default=0.0)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# --- store -------------------------------------------------------------------------------
def store_figures(hold: float) -> None:
    with tempfile.TemporaryDirectory() as tmp, sim(decode=40) as slow, sim() as fast, \
            proxy(Path(tmp), "--trigger", "3000", "--counter", "chars",
                  openai=fast, anthropic=slow) as (url, _):
        state = Path(tmp) / "store.sqlite"

        def compacting(n: int) -> float:
            t0 = time.monotonic()
            answer = httpx.post(url + "/v1/chat/completions", timeout=600, json={
                "model": "m", "messages": chat_history(12, 300 + n)},
                headers={"x-session-id": f"b-{n}"})
            assert answer.status_code == 200, answer.status_code
            return time.monotonic() - t0

        compacting(0)  # the store file and its tables exist
        streamer = Streamer(url, int((hold + 12) * 40))
        streamer.start()
        streamer.started.wait(30)
        n, before, during = 1, [], []
        t0 = time.monotonic()
        while time.monotonic() < t0 + 4:
            before.append(compacting(n))
            n += 1
        locker = sqlite3.connect(state, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # held by this process: another than the proxy's
        lock_t0 = time.monotonic()
        states = set()
        while time.monotonic() < lock_t0 + hold:
            during.append(compacting(n))
            n += 1
            states.add(httpx.get(url + "/agentcompact/status").json()["store"]["state"])
        locker.execute("ROLLBACK")
        locker.close()
        lock_t1 = time.monotonic()
        time.sleep(5.5)  # the store's retry_after: the next request writes back
        compacting(n)
        streamer.join(hold + 60)
        quiet = streamer.largest_gap(t0, lock_t0)
        locked = streamer.largest_gap(lock_t0, lock_t1)
        status = httpx.get(url + "/agentcompact/status").json()["store"]
    print(f"store: write lock held {hold:.0f} s by another process; session A's largest "
          f"gap {quiet:.3f} s before, {locked:.3f} s during the lock (ratio "
          f"{locked / max(quiet, 1e-3):.1f}); session B: {len(before)} requests before "
          f"(p50 {statistics.median(before):.3f} s, max {max(before):.3f} s), "
          f"{len(during)} during (p50 {statistics.median(during):.3f} s, max "
          f"{max(during):.3f} s); status during: {sorted(states)}; after: "
          f"{status['state']}, {status['pending_write_back']} writes pending")


# --- record ------------------------------------------------------------------------------
def vllm_stream(tokens: int) -> bytes:
    """A vLLM-style chat stream (``return_token_ids`` and ``logprobs``): prompt ids in the
    first chunk, each token's id, logprob and bytes in its chunk."""
    head = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "system_fingerprint": "fp", "service_tier": "default"}
    frames = [b"data: " + orjson.dumps({**head, "prompt_token_ids": list(range(30)),
                                         "choices": [{"index": 0, "delta": {
                                             "role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]})]
    for i in range(tokens):
        tok = f" w{i % 997}"
        frames.append(b"data: " + orjson.dumps({**head, "choices": [{
            "index": 0, "delta": {"content": tok}, "token_ids": [i % 150_000],
            "logprobs": {"content": [{"token": tok, "logprob": -0.01,
                                      "bytes": list(tok.encode()), "top_logprobs": []}],
                         "refusal": None},
            "finish_reason": "stop" if i == tokens - 1 else None}]}))
    frames.append(b"data: [DONE]")
    return b"\n\n".join(frames) + b"\n\n"


def reassembly_figures() -> None:
    per_token = {}
    for tokens in (8_000, 16_000, 32_000, 64_000):
        data = vllm_stream(tokens)
        wall = cpu = float("inf")
        for _ in range(3):
            w0, c0 = time.perf_counter(), time.process_time()
            got = reassemble("openai_chat", data, streamed=True)
            wall = min(wall, time.perf_counter() - w0)
            cpu = min(cpu, time.process_time() - c0)
        assert got.token_ids is not None and len(got.token_ids) == tokens
        per_token[tokens] = cpu / tokens * 1e6
        print(f"record: reassembly of a {tokens:,}-token stream ({len(data) / 1e6:.1f} MB): "
              f"{wall:.3f} s wall, {cpu:.3f} s CPU ({per_token[tokens]:.2f} us/token)")
    print(f"record: per-token CPU time at 64k over 8k tokens: "
          f"{per_token[64_000] / per_token[8_000]:.2f} (1.0: linear)")


class BigAnswers:
    """An upstream answering chat requests with the stream its ``x-bench-tokens`` header
    sizes (built once per size)."""

    def __init__(self) -> None:
        self.bodies: dict[int, bytes] = {}

    def body(self, tokens: int) -> bytes:
        if tokens not in self.bodies:
            self.bodies[tokens] = vllm_stream(tokens)
        return self.bodies[tokens]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        tokens = int(dict(scope["headers"]).get(b"x-bench-tokens", b"1000"))
        data = self.body(tokens)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for start in range(0, len(data), 1 << 16):
            await send({"type": "http.response.body", "body": data[start:start + (1 << 16)],
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def ask(url: str, tokens: int) -> float:
    t0 = time.monotonic()
    with httpx.Client(timeout=600) as client, client.stream(
            "POST", url + "/v1/chat/completions", headers={"x-bench-tokens": str(tokens)},
            json={"model": "m", "stream": True,
                  "messages": [{"role": "user", "content": "hi"}]}) as answer:
        for _ in answer.iter_raw():
            pass
    return time.monotonic() - t0


def recorded_calls(run: Path) -> int:
    path = run / "events.jsonl"
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if b'"kind":"model_call"' in line[:200])


def wait_recorded(run: Path, count: int, timeout: float = 600) -> float:
    t0 = time.monotonic()
    while recorded_calls(run) < count and time.monotonic() < t0 + timeout:
        time.sleep(0.05)
    return time.monotonic() - t0


def record_figures(big_mb: int, keep: list[str]) -> None:
    big = BigAnswers()
    tokens_big = int(big_mb * 1e6 / len(vllm_stream(1000)) * 1000)
    big.body(64_000), big.body(tokens_big), big.body(int(tokens_big * 100 / big_mb))
    with tempfile.TemporaryDirectory() as tmp, sim(decode=40) as slow, serve(big) as upstream, \
            proxy(Path(tmp), "--record", str(Path(tmp) / "run"), "--store", "memory:", *keep,
                  openai=upstream.base_url, anthropic=slow) as (url, proc):
        run = Path(tmp) / "run"
        streamer = Streamer(url, 400)
        streamer.start()
        streamer.started.wait(30)
        t0 = time.monotonic()
        ask(url, 64_000)
        recorded = wait_recorded(run, 1)
        time.sleep(0.5)
        gap = streamer.largest_gap(t0, time.monotonic())
        print(f"record: a 64,000-token answer relayed and recorded (recorded "
              f"{recorded:.2f} s after its end) while session A streams: A's largest gap "
              f"{gap:.3f} s")
        streamer.join(60)
        calls = recorded_calls(run)
        before = rss_mib(proc.pid)
        ask(url, tokens_big)
        wait_recorded(run, calls + 1)
        time.sleep(1.0)
        after = rss_mib(proc.pid)
        print(f"record: proxy RSS {before:.0f} MiB before a {big_mb} MB recorded answer "
              f"({tokens_big:,} tokens), {after:.0f} MiB after it is recorded "
              f"(+{after - before:.0f} MiB; --keep-memory "
              f"{keep[1] if keep else 'default, 128'} MiB of freed memory may stay)")
        calls = recorded_calls(run)
        ask(url, int(tokens_big * 100 / big_mb))
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(600)
        exited = time.monotonic() - t_term
        kept = "recorded" if recorded_calls(run) > calls else "NOT recorded"
        print(f"record: SIGTERM right after a 100 MB answer: the proxy exited in "
              f"{exited:.2f} s, that answer {kept}")


# --- history -----------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    """CPU seconds the process has used, all its threads (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def history_figures(smaller: int, repeats: int) -> None:
    """Each repeat sends both histories as first requests of new sessions, each history
    with its own task text (no prefix the store or the body cache knows); the medians of
    the repeats, wall time and the proxy's CPU time (steadier than wall time on a shared
    machine)."""
    sizes = (smaller, 2 * smaller)
    wall: dict[int, list[float]] = {n: [] for n in sizes}
    cpu: dict[int, list[float]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory() as tmp, sim() as fast, \
            proxy(Path(tmp), openai=fast, anthropic=fast) as (url, proc):
        for rep in range(repeats):
            for turns in sizes:
                messages = anthropic_history(turns, result_tokens=600)
                messages[0] = {**messages[0], "content": f"{messages[0]['content']} (run {rep})"}
                body = orjson.dumps({"model": "m", "max_tokens": 64, "messages": messages})
                del messages
                c0, t0 = cpu_s(proc.pid), time.monotonic()
                answer = httpx.post(url + "/v1/messages", content=body, timeout=900,
                                    headers={"x-session-id": f"history-{turns}-{rep}",
                                             "content-type": "application/json"})
                wall[turns].append(time.monotonic() - t0)
                cpu[turns].append(cpu_s(proc.pid) - c0)
                assert answer.status_code == 200
                print(f"history: first request of {turns:,} turns ({len(body) / 1e6:.1f} MB) "
                      f"answered in {wall[turns][-1]:.2f} s, proxy CPU {cpu[turns][-1]:.2f} s "
                      f"(load {load()})", flush=True)
    big, small = 2 * smaller, smaller
    ratio = statistics.median(wall[big]) / statistics.median(wall[small])
    cpu_ratio = statistics.median(cpu[big]) / statistics.median(cpu[small])
    print(f"history: {big:,} over {small:,} turns, medians of {repeats}: wall {ratio:.2f}x "
          f"({statistics.median(wall[big]):.2f} / {statistics.median(wall[small]):.2f} s), "
          f"proxy CPU {cpu_ratio:.2f}x ({statistics.median(cpu[big]):.2f} / "
          f"{statistics.median(cpu[small]):.2f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", default="store,record,history")
    parser.add_argument("--hold", type=float, default=30.0, help="seconds the lock is held")
    parser.add_argument("--big-mb", type=int, default=150, help="the large recorded answer")
    parser.add_argument("--turns", type=int, default=4_000,
                        help="history: the smaller history (the larger has twice as many)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="history: repeats of the pair (the medians are compared)")
    parser.add_argument("--keep-memory", type=int, metavar="MIB",
                        help="the proxy's --keep-memory (default: its own, 128 MiB of freed "
                             "memory kept for the next large body)")
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load average {load()} (1, 5, 15 min)")
    parts = set(args.only.split(","))
    if "store" in parts:
        store_figures(args.hold)
    if "record" in parts:
        reassembly_figures()
        keep = [] if args.keep_memory is None else ["--keep-memory", str(args.keep_memory)]
        record_figures(args.big_mb, keep)
    if "history" in parts:
        history_figures(args.turns, args.repeats)
    print(f"load average at the end {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
