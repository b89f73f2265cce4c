"""Added latency of the agentcompact proxy vs CliffCompaction's proxy, side by side.

One local upstream (``agentcompact.testing``, answering instantly), and
in front of it a bare relay and both proxies, each served by uvicorn on loopback in its own
process, so no server shares a GIL with another or with the measuring client. Every server
of a run gets the same uvicorn settings; by default the whole run is done twice:

- ``h11/asyncio``: uvicorn's pure-Python parser and loop (what plain ``uvicorn`` gives,
  e.g. ``pip install cliffcompaction``);
- ``httptools/uvloop``: what ``agentcompact[proxy]`` installs and ``agentcompact proxy``
  serves with (uvicorn picks them when installed; CliffCompaction's CLI would too).

A session grows by one turn per step; at every step the same request body goes directly
to the upstream and through each server (order rotated), so each server's *added* latency
is paired with a direct call of the same step. Two regimes per size:

- ``under``: trigger far above the size: no compaction, the pure cost of a proxy that
  parses, measures and forwards;
- ``over``: trigger below the size: the session is compacted once (warm-up), then every
  step substitutes the stored compacted prefix (the steady state between cliffs; the
  proxies send the upstream a smaller body than the direct call, so their "added"
  latency can be below the hop's or negative).

``relay`` is a reference hop: a bare Starlette + httpx relay with no parsing (the stack
both proxies were built on; CliffCompaction still is). Also time to first streamed byte
(TTFB) direct vs through each proxy. Prints p50s and ratios; no assertions (benchmarks
print, tests assert).

    TIKTOKEN_CACHE_DIR=... python benchmarks/proxy_latency.py [--sizes 50000,200000]
        [--steps 30] [--warmup 3] [--servers h11,fast]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault(  # the shared data beside the checkout (../shared/data/tiktoken)
    "TIKTOKEN_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/data/tiktoken"),
)

import httpx  # noqa: E402 - after the offline tiktoken setting
import orjson  # noqa: E402

from agentcompact import Budget
from agentcompact.integrations.proxy import ProxyConfig, create_app  # noqa: E402
from agentcompact.testing import UpstreamSim, filler_text  # noqa: E402

TURN_TOKENS = 1000
SERVERS_DEFAULT = ("h11", "asyncio")
MODEL = "sim-model"


def history(n_turns: int) -> list[dict[str, Any]]:
    """A Claude-Code-like history: task, then turns of tool_use + a ~1k-token tool_result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing tests."}]
    for t in range(n_turns):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Looking at module {t}."},
            {"type": "tool_use", "id": f"toolu_{t:05d}", "name": "read_file",
             "input": {"path": f"src/module_{t}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{t:05d}",
             "content": f"# module_{t}.py\n" + filler_text(TURN_TOKENS)}]})
    return messages


def body(messages: list[dict[str, Any]], stream: bool) -> bytes:
    return orjson.dumps({"model": MODEL, "max_tokens": 64, "stream": stream,
                         "system": "You are a coding agent.", "messages": messages})


def timed_post(client: httpx.Client, content: bytes) -> float:
    t0 = time.perf_counter()
    response = client.post("/v1/messages", content=content,
                           headers={"content-type": "application/json", "x-api-key": "k"})
    response.read()
    elapsed = time.perf_counter() - t0
    assert response.status_code == 200, response.text[:300]
    return elapsed


def timed_first_byte(client: httpx.Client, content: bytes) -> float:
    t0 = time.perf_counter()
    with client.stream("POST", "/v1/messages", content=content,
                       headers={"content-type": "application/json", "x-api-key": "k"}) as r:
        chunks = r.iter_raw()
        next(chunks)
        elapsed = time.perf_counter() - t0
        for _ in chunks:
            pass
    return elapsed


def app_for(role: str, upstream: str, trigger: int) -> Any:
    """The ASGI app of one server role: the upstream simulator, a sink (``sink:MBPS``:
    reading at that link speed), or either proxy (``ours:buffered``: ours sending a body
    on only once it is all in, instead of while it arrives)."""
    if role == "sim":
        return UpstreamSim(max_recorded=0).app  # bodies of megabytes: keep none
    if role.startswith("sink"):
        return sink(float(role.partition(":")[2] or 0))
    if role == "relay":
        return bare_relay(upstream)
    if role.startswith("ours"):
        try:  # as ``agentcompact proxy`` does at start-up (a tree before it: nothing)
            from agentcompact.integrations.proxy._cli import KEEP_MEMORY_MIB
            from agentcompact.integrations.proxy._memory import keep_freed
        except ImportError:
            pass
        else:
            keep_freed(int(os.environ.get(KEEP_MEMORY_ENV, KEEP_MEMORY_MIB)))
        app = create_app(ProxyConfig(budget=Budget(trigger), anthropic_upstream=upstream,
                                     openai_upstream=upstream, log_requests=False))
        if role == "ours:buffered":
            app.proxy.hold_bytes = None
        return app
    from cliffcompaction.config import Config
    from cliffcompaction.proxy import create_app as cliff_app

    return cliff_app(Config(threshold_tokens=trigger, anthropic_upstream=upstream,
                            openai_upstream=upstream))


#: a short Anthropic stream: what ``sink`` answers every request with
SINK_EVENTS = b"".join(
    b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps(data)) for name, data in (
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_sink", "type": "message", "role": "assistant", "model": MODEL,
            "content": [], "stop_reason": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "ok"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": {"output_tokens": 1}}),
        ("message_stop", {"type": "message_stop"})))


def sink(mbps: float = 0.0) -> Any:
    """An upstream that reads the whole body and answers at once, without parsing or
    counting it: what is left of a direct call is the body's trip, so what a proxy adds
    is not lost in the noise of an upstream's own work on a 12 MB body (the simulator
    counts every token: ~300 ms, +-20 ms, at 3M tokens). With ``mbps``, it reads no faster
    than a link of that many Mbit/s (a provider across a network: the proxy is on the
    client's machine, the provider is not), pacing its reads (TCP backpressure does the
    rest)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        start, got = time.perf_counter(), 0
        while True:
            message = await receive()
            got += len(message.get("body", b""))
            if mbps:
                ahead = got * 8 / (mbps * 1e6) - (time.perf_counter() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"),
                                (b"content-length", str(len(SINK_EVENTS)).encode())]})
        await send({"type": "http.response.body", "body": SINK_EVENTS})

    return app


def bare_relay(upstream: str) -> Any:
    """A reference floor: the generic hop both proxies were built on (Starlette in, httpx
    out, raw relay back) with no parsing, independent of either product's code."""
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream, timeout=120)
    drop = {"host", "content-length", "connection", "accept-encoding", "transfer-encoding"}

    async def forward(request: Any) -> Any:
        headers = [(k, v) for k, v in request.headers.raw if k.decode() not in drop]
        sent = client.build_request(request.method, request.url.path,
                                    headers=headers, content=await request.body())
        response = await client.send(sent, stream=True)
        keep = [(k, v) for k, v in response.headers.raw
                if k.decode().lower() not in ("content-length", "transfer-encoding",
                                              "connection")]

        async def body() -> Any:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                await response.aclose()

        return StreamingResponse(body(), status_code=response.status_code,
                                 headers={k.decode(): v.decode() for k, v in keep})

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


CPU_PATH = "/__bench/cpu"


def with_cpu_probe(app: Any) -> Any:
    """``app``, plus ``GET /__bench/cpu``: this process's CPU time so far (all threads, in
    seconds). CPU per request does not depend on what else the machine runs, unlike
    wall-clock latency; it is what the added latency comes down to on a quiet machine."""

    async def probed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == CPU_PATH:
            body = repr(time.process_time()).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return probed


def cpu_s(client: httpx.Client) -> float:
    return float(client.get(CPU_PATH).text)


#: set in a server's environment to a file: agentcompact's proxy runs under cProfile and
#: writes its profile there when stopped
PROFILE_ENV = "AGENTCOMPACT_BENCH_PROFILE"
#: set in the servers' environment: ``--keep-memory`` of agentcompact's proxy (MiB)
KEEP_MEMORY_ENV = "AGENTCOMPACT_BENCH_KEEP_MEMORY"
TRACE_PATH = "/__bench/trace"
#: set in a server's environment: it records when each request's body arrived and its
#: answer left (``with_trace``), for the breakdown of ``proxy_claude_code.py --trace``
TRACE_ENV = "AGENTCOMPACT_BENCH_TRACE"
_MARKS: Any = None  # the current request's marks (a contextvar, when tracing)


def mark(name: str) -> None:
    """Record ``name`` now (``time.perf_counter``: CLOCK_MONOTONIC, one clock for every
    process of the machine) in the current traced request, if any."""
    marks = _MARKS.get(None) if _MARKS is not None else None
    if marks is not None and name not in marks:
        marks[name] = time.perf_counter()


def with_trace(app: Any) -> Any:
    """``app``, timing every request's first and last body chunk handed to it and its
    answer's start and first body chunk; ``GET /__bench/trace`` returns the marks of the
    requests since the last call (and forgets them)."""
    global _MARKS
    import contextvars

    _MARKS = contextvars.ContextVar("bench_marks")
    done: list[dict[str, float]] = []

    async def traced(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["path"] == TRACE_PATH:
            body = orjson.dumps(done)
            done.clear()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        marks: dict[str, float] = {"start": time.perf_counter()}
        _MARKS.set(marks)
        done.append(marks)

        async def rx() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                mark("in_first")
                if not message.get("more_body"):
                    mark("in_last")
            return message

        async def tx(message: Any) -> None:
            if message["type"] == "http.response.start":
                mark("out_start")
            elif message["type"] == "http.response.body":
                mark("out_body")
            await send(message)

        await app(scope, rx, tx)

    return traced


def trace_proxy(app: Any) -> None:
    """Marks inside agentcompact's proxy (a benchmark's instrumentation: the methods are
    wrapped, not changed): the body joined, the request prepared (parsed, decided), the
    held request's last byte released, the answer's headers in."""
    from agentcompact.integrations.proxy import _app, _upstream

    receive = _app._receive

    async def received(*args: Any) -> Any:
        raw = await receive(*args)
        mark("joined")
        return raw

    _app._receive = received  # type: ignore[assignment]
    proxy = app.proxy
    prepare, send_out = proxy._prepare, proxy._send_out

    async def prepared(*args: Any) -> Any:
        out = await prepare(*args)
        mark("prepared")
        return out

    async def sent_out(*args: Any) -> Any:
        sent = await send_out(*args)
        mark("headers_in")
        return sent

    proxy._prepare, proxy._send_out = prepared, sent_out
    release = _upstream.HeldRequest.release

    def released(self: Any) -> bool:
        ok = release(self)
        if ok:
            mark("released")
        return ok

    _upstream.HeldRequest.release = released  # type: ignore[method-assign]


def serve_role(role: str, port: int, upstream: str, trigger: int, http: str, loop: str
               ) -> None:
    """Child process body: serve one role with the same uvicorn settings for all."""
    import logging

    import uvicorn

    logging.getLogger("cliffcompaction").setLevel(logging.WARNING)
    app = app_for(role, upstream, trigger)
    if os.environ.get(TRACE_ENV):
        if role.startswith("ours"):
            trace_proxy(app)
        app = with_trace(app)
    profile = os.environ.get(PROFILE_ENV) if role.startswith("ours") else None
    if profile:  # a profile of the proxy's process, written when it is stopped
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        try:
            uvicorn.run(with_cpu_probe(app), host="127.0.0.1", port=port, log_level="warning",
                        access_log=False, http=http, loop=loop, lifespan="on")
        finally:
            profiler.disable()
            profiler.dump_stats(profile)
        return
    uvicorn.run(with_cpu_probe(app), host="127.0.0.1", port=port,
                log_level="warning", access_log=False, http=http, loop=loop, lifespan="on")


class Role:
    """One server in its own process (no GIL shared with the client or the other servers)."""

    #: uvicorn's HTTP parser and event loop, the same for every server of a run
    http, loop = SERVERS_DEFAULT

    def __init__(self, role: str, upstream: str = "", trigger: int = 0) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", role, "--port",
                                      str(self.port), "--upstream", upstream,
                                      "--trigger", str(trigger), "--http", self.http,
                                      "--loop", self.loop])
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{role} did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def run_regime(upstream: str, size: int, regime: str, steps: int, warmup: int
               ) -> dict[str, float]:
    n0 = size // TURN_TOKENS
    trigger = size * 4 if regime == "under" else int(size * 0.8)
    servers = {name: Role(name, upstream, trigger) for name in ("relay", "ours", "cliff")}
    urls = {"direct": upstream, **{k: s.base_url for k, s in servers.items()}}
    clients = {k: httpx.Client(base_url=u, timeout=120) for k, u in urls.items()}
    full = history(n0 + warmup + steps)
    total: dict[str, list[float]] = {k: [] for k in urls}
    ttfb: dict[str, list[float]] = {k: [] for k in urls}
    cpu: dict[str, float] = {}
    try:
        for step in range(warmup + steps):
            if step == warmup:
                cpu = {k: cpu_s(clients[k]) for k in servers}
            messages = full[: 1 + 2 * (n0 + step)]
            plain, streamed = body(messages, False), body(messages, True)
            k = step % len(urls)
            order = list(urls)[k:] + list(urls)[:k]
            for passes, content, fn in ((total, plain, timed_post),
                                        (ttfb, streamed, timed_first_byte)):
                for name in order:
                    elapsed = _measure(fn, clients[name], content)
                    if step >= warmup:
                        passes[name].append(elapsed)
        cpu = {k: (cpu_s(clients[k]) - cpu[k]) / (2 * steps) for k in servers}
    finally:
        for c in clients.values():
            c.close()
        for s in servers.values():
            s.stop()
    out: dict[str, float] = {}
    for name in ("relay", "ours", "cliff"):
        added = [p - d for p, d in zip(total[name], total["direct"], strict=True)]
        first = [p - d for p, d in zip(ttfb[name], ttfb["direct"], strict=True)]
        out[f"{name}_added_p50_ms"] = p50_ms(added)
        out[f"{name}_ttfb_delta_p50_ms"] = p50_ms(first)
        out[f"{name}_cpu_ms"] = cpu[name] * 1000
    out["direct_p50_ms"] = p50_ms(total["direct"])
    out["direct_ttfb_p50_ms"] = p50_ms(ttfb["direct"])
    return out


def _measure(fn: Callable[[httpx.Client, bytes], float], client: httpx.Client,
             content: bytes) -> float:
    return fn(client, content)


SERVERS = {"h11": ("h11", "asyncio"), "fast": ("httptools", "uvloop")}


def work_p50_ms(size: int, regime: str, steps: int, warmup: int) -> float:
    """The agentcompact proxy's own work per request, in process and without HTTP: the
    benchmark's session (plain and streamed body each step) through the proxy's request
    preparation (parse what is new, session key, engine, encode). The rest of ``ours+``
    is the HTTP hop."""
    from agentcompact.integrations.proxy._app import CompactionProxy

    n0 = size // TURN_TOKENS
    trigger = size * 4 if regime == "under" else int(size * 0.8)
    proxy = CompactionProxy(ProxyConfig(budget=Budget(trigger), log_requests=False))
    full = history(n0 + warmup + steps)
    times: list[float] = []
    for step in range(warmup + steps):
        for stream in (False, True):
            raw = body(full[: 1 + 2 * (n0 + step)], stream)
            t0 = time.perf_counter()
            proxy._prepare_here("/v1/messages", "anthropic", raw, {})
            if step >= warmup:
                times.append(time.perf_counter() - t0)
    return p50_ms(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="50000,200000", help="request sizes in tokens")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per regime")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured first steps")
    parser.add_argument("--regimes", default="under,over")
    parser.add_argument("--servers", default="h11,fast",
                        help="uvicorn settings, one run each, the same for every server: "
                             "h11 (h11/asyncio), fast (httptools/uvloop)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--trigger", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--http", help=argparse.SUPPRESS)
    parser.add_argument("--loop", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_role(args.serve, args.port, args.upstream, args.trigger, args.http, args.loop)
        return 0
    print(f"{'server':>16} {'size':>7} {'regime':>6} | {'direct':>7} | {'relay+':>7} "
          f"{'ours+':>7} {'cliff+':>7} {'ratio':>6} | {'TTFB direct':>11} {'ours Δ':>7} "
          f"{'cliff Δ':>7} | {'CPU relay':>9} {'ours':>6} {'cliff':>6} {'ratio':>6} | "
          f"{'work':>5}")
    for server in args.servers.split(","):
        Role.http, Role.loop = SERVERS[server]
        label = f"{Role.http}/{Role.loop}"
        upstream = Role("sim")
        try:
            for size in (int(s) for s in args.sizes.split(",")):
                for regime in args.regimes.split(","):
                    r = run_regime(upstream.base_url, size, regime, args.steps, args.warmup)
                    work = work_p50_ms(size, regime, args.steps, args.warmup)
                    ours, cliff, floor = (r[f"{k}_added_p50_ms"]
                                          for k in ("ours", "cliff", "relay"))
                    print(f"{label:>16} {size:>7} {regime:>6} | {r['direct_p50_ms']:7.2f} | "
                          f"{floor:7.2f} {ours:7.2f} {cliff:7.2f} {ours / cliff:6.3f} | "
                          f"{r['direct_ttfb_p50_ms']:11.2f} "
                          f"{r['ours_ttfb_delta_p50_ms']:7.2f} "
                          f"{r['cliff_ttfb_delta_p50_ms']:7.2f} | {r['relay_cpu_ms']:9.2f} "
                          f"{r['ours_cpu_ms']:6.2f} {r['cliff_cpu_ms']:6.2f} "
                          f"{r['ours_cpu_ms'] / r['cliff_cpu_ms']:6.3f} | {work:5.2f}",
                          flush=True)
        finally:
            upstream.stop()
    print("ms, p50 over paired steps. relay+/ours+/cliff+ = added latency vs direct (relay: a "
          "bare Starlette+httpx hop, no parsing); ratio = ours+/cliff+ (target <= 0.2); "
          "Δ = TTFB through the proxy minus direct (target <= 5 ms); CPU = the server "
          "process's CPU time per request (all threads), ratio = ours/cliff; work = ours' "
          "own per-request work in process (parse, measure, compact/encode), no HTTP")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
