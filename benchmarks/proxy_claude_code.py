"""Added latency with Claude Code-shaped bodies at 200k / 1M / 3M tokens, agentcompact's proxy
and CliffCompaction's side by side in one run.

The history is a real Claude Code session (``../shared/data/trajectories/claude-code``,
258c7280, ~137k tokens) repeated with fresh tool ids until the size is reached, sent as
Claude Code sends it: three system blocks, ~12 tools, a ``role: system`` message after the
first user message, ``metadata.user_id`` holding a session id, ``stream: true``, and the
``cache_control`` marker on the newest block only, so each request changes the previous
newest message (its marker is gone) and appends one turn. No compaction happens (trigger far
above the size): Claude Code behind the proxy sees the compacted usage and never compacts
itself, so this is the steady per-request cost as its history grows.

Per step the same body goes directly to the upstream, through agentcompact's proxy and
through CliffCompaction's (order rotated; each server in its own process, uvicorn with
httptools/uvloop for all); "added" is the proxied time minus the direct time of the same
step. The upstream is a sink by default (it reads the body and answers at once: the
simulator's own token count of a 12 MB body, ~300 ms +-20, would drown what a proxy adds);
``--link-mbps`` makes it read at a network link's speed, as a provider across a network
does, where a proxy that sends a body on only once it is all in pays the whole transfer
again (``--buffered`` shows that proxy side by side). ``work`` is agentcompact's own
per-request work measured in process without HTTP (parse what is new, measure, decide),
the part that must stay O(new bytes).

    TIKTOKEN_CACHE_DIR=... python benchmarks/proxy_claude_code.py [--sizes 200000,1000000,3000000]
        [--steps 20] [--warmup 3] [--no-cliff] [--buffered] [--link-mbps 1000]
        [--upstream sink|sim]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault(  # the shared data beside the checkout (../shared/data/tiktoken)
    "TIKTOKEN_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/data/tiktoken"),
)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402 - after the offline tiktoken setting
import orjson  # noqa: E402
import proxy_latency  # noqa: E402 - the server roles, in their own processes

from agentcompact import Budget
from agentcompact.trajectory import load  # noqa: E402

SESSION = (Path(__file__).resolve().parents[1].parent / "shared" / "data" / "trajectories"
           / "claude-code" / "258c7280-ae70-4798-800f-63464d01a85d.jsonl")
MARK = {"type": "ephemeral"}
SYSTEM_MESSAGE = {"role": "system", "content": "# Environment\n - Platform: linux\n" * 40}


def _renamed(message: dict[str, Any], rep: int) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    out = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            block = {**block, "id": f"{block['id']}_r{rep}"}
        elif isinstance(block, dict) and block.get("type") == "tool_result":
            block = {**block, "tool_use_id": f"{block['tool_use_id']}_r{rep}"}
        out.append(block)
    return {**message, "content": out}


def history(tokens: int) -> list[dict[str, Any]]:
    """The real session repeated (fresh tool ids each time) to about ``tokens`` (chars/4)."""
    session = load(SESSION)[0].messages
    chars = len(orjson.dumps(session))
    out: list[dict[str, Any]] = [session[0], SYSTEM_MESSAGE]
    rep = 0
    while len(orjson.dumps(out)) < tokens * 4 + chars:
        out.extend(_renamed(m, rep) for m in session[1:])
        rep += 1
    return out


def call_points(messages: list[dict[str, Any]]) -> list[int]:
    """Prefix lengths a request can end at: just before an assistant message."""
    return [i for i in range(2, len(messages))
            if messages[i]["role"] == "assistant" and messages[i - 1]["role"] == "user"]


def _marked(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content,
                                        "cache_control": MARK}]}
    return {**message, "content": [*content[:-1], {**content[-1], "cache_control": MARK}]}


def body(messages: list[dict[str, Any]]) -> bytes:
    """A Claude Code request: the marker on the newest block only."""
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
              {"type": "text", "text": "You are Claude Code.", "cache_control": MARK},
              {"type": "text", "text": "Instructions. " * 500, "cache_control": MARK}]
    tools = [{"name": f"Tool{i}", "description": "Does a thing. " * 400,
              "input_schema": {"type": "object", "properties": {"arg": {"type": "string"}}}}
             for i in range(12)]
    return orjson.dumps({
        "model": "claude-opus-5-5", "messages": [*messages[:-1], _marked(messages[-1])],
        "system": system, "tools": tools, "max_tokens": 128000, "stream": True,
        "metadata": {"user_id": '{"device_id":"d","session_id":"bench-session"}'},
    })


#: the marks of ``--trace``, in the order a request passes them: the client's (c_), the
#: proxy's (p_: its ASGI receive and send, and inside it) and the upstream's (u_)
TRACE_MARKS = ("c_sent", "p_in_first", "u_in_first", "p_in_last", "p_joined", "p_prepared",
               "p_released", "u_in_last", "u_out_start", "p_headers_in", "p_out_start",
               "p_out_body", "c_first")


def traced_first_byte(client: httpx.Client, content: bytes) -> tuple[float, dict[str, float]]:
    """``timed_first_byte`` with the client's marks: its request sent (the last byte
    written to the socket) and the answer's first byte, from its start (seconds)."""
    marks: dict[str, float] = {}

    def trace(name: str, info: Any) -> None:
        if name == "http11.send_request_body.complete":
            marks["c_sent"] = time.perf_counter()

    t0 = time.perf_counter()
    with client.stream("POST", "/v1/messages", content=content, extensions={"trace": trace},
                       headers={"content-type": "application/json", "x-api-key": "k"}) as r:
        chunks = r.iter_raw()
        next(chunks)
        marks["c_first"] = time.perf_counter()
        for _ in chunks:
            pass
    return marks["c_first"] - t0, {k: v - t0 for k, v in marks.items()}


def _server_marks(client: httpx.Client, prefix: str) -> dict[str, float]:
    """The marks of the last request a traced server handled (absolute, seconds)."""
    got = orjson.loads(client.get(proxy_latency.TRACE_PATH).content)
    return {f"{prefix}{k}": v for k, v in got[-1].items() if k != "start"} if got else {}


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def measure(size: int, steps: int, warmup: int, names: list[str], upstream_role: str,
            trace: bool = False) -> dict[str, float]:
    full = history(size + 200_000)
    points = [p for p in call_points(full) if len(orjson.dumps(full[:p])) >= size * 4]
    points = points[:warmup + steps]
    trigger = size * 4
    upstream = proxy_latency.Role(upstream_role)
    servers = {n: proxy_latency.Role(n, upstream.base_url, trigger) for n in names}
    urls = {"direct": upstream.base_url, **{k: s.base_url for k, s in servers.items()}}
    clients = {k: httpx.Client(base_url=u, timeout=300) for k, u in urls.items()}
    times: dict[str, list[float]] = {k: [] for k in urls}
    traces: dict[str, list[dict[str, float]]] = {k: [] for k in urls}
    cpu: dict[str, float] = {}
    try:
        for step, point in enumerate(points):
            if step == warmup:
                cpu = {k: proxy_latency.cpu_s(clients[k]) for k in urls}
            content = body(full[:point])
            order = list(urls)[step % len(urls):] + list(urls)[:step % len(urls)]
            for name in order:
                if trace:
                    t0 = time.perf_counter()
                    elapsed, marks = traced_first_byte(clients[name], content)
                    marks = {k: v + t0 for k, v in marks.items()}  # absolute, as the servers'
                    got = {**marks, **_server_marks(clients["direct"], "u_")}
                    if name != "direct":
                        got.update(_server_marks(clients[name], "p_"))
                    if step >= warmup:
                        traces[name].append({k: (v - t0) * 1000 for k, v in got.items()})
                else:
                    elapsed = proxy_latency.timed_first_byte(clients[name], content)
                if step >= warmup:
                    times[name].append(elapsed)
        # CPU seconds per request of each server process (all threads): the upstream's
        # counts the direct call and every proxy's forwarded one
        cpu = {k: (proxy_latency.cpu_s(clients[k]) - v) / steps for k, v in cpu.items()}
    finally:
        for c in clients.values():
            c.close()
        for s in [*servers.values(), upstream]:
            s.stop()
    out = {"direct_p50": _p(times["direct"], 0.5),
           "upstream_cpu": cpu["direct"] * 1000 / (1 + len(names))}
    out.update({f"{name}_cpu": cpu[name] * 1000 for name in names})
    for name in names:
        added = [a - d for a, d in zip(times[name], times["direct"], strict=True)]
        out[f"{name}_p50"], out[f"{name}_p99"] = _p(added, 0.5), _p(added, 0.99)
    if "ours:buffered" in times:  # what held forwarding saves, paired step by step
        saved = [b - h for b, h in zip(times["ours:buffered"], times["ours"], strict=True)]
        out["held_saves_p50"], out["held_saves_p99"] = _p(saved, 0.5), _p(saved, 0.99)
    out.update(work(full, points, warmup, trigger))
    if trace:
        for name, got in traces.items():
            for key in TRACE_MARKS:
                values = [g[key] for g in got if key in g]
                if values:
                    out[f"trace:{name}:{key}"] = sorted(values)[len(values) // 2]
    return out


def work(full: list[dict[str, Any]], points: list[int], warmup: int, trigger: int
         ) -> dict[str, float]:
    """agentcompact's own per-request work, in process (no HTTP), p50 and p99."""
    from agentcompact.integrations.proxy import ProxyConfig
    from agentcompact.integrations.proxy._app import CompactionProxy

    proxy = CompactionProxy(ProxyConfig(budget=Budget(trigger), log_requests=False))
    times: list[float] = []
    for step, point in enumerate(points):
        raw = body(full[:point])
        t0 = time.perf_counter()
        proxy._prepare_here("/v1/messages", "anthropic", raw, {})
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    reuse = proxy.bodies
    return {"work_p50": _p(times, 0.5), "work_p99": _p(times, 0.99),
            "partial_hits": reuse.partial_hits, "misses": reuse.misses}


def _print_trace(r: dict[str, float]) -> None:
    """The median ms of each mark from the request's start, one row per server."""
    for name in ("direct", "ours", "ours:buffered", "cliff"):
        cells = [f"{key}={r[f'trace:{name}:{key}']:.1f}" for key in TRACE_MARKS
                 if f"trace:{name}:{key}" in r]
        if cells:
            print(f"    trace {name}: " + " ".join(cells), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="200000,1000000,3000000")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-cliff", dest="cliff", action="store_false")
    parser.add_argument("--buffered", action="store_true",
                        help="also a proxy that sends a body on only once it is all in "
                             "(ours:buffered), side by side with ours (sent as it arrives)")
    parser.add_argument("--upstream", choices=("sink", "sim"), default="sink",
                        help="sink: reads the body and answers at once (default); sim: the "
                             "upstream simulator, which also counts the body's tokens")
    parser.add_argument("--link-mbps", type=float, default=0.0,
                        help="the sink reads no faster than this many Mbit/s (a provider "
                             "across a network; default 0: loopback speed)")
    parser.add_argument("--trace", action="store_true",
                        help="also print where the time goes: the median time of each mark "
                             "(client sent, proxy and upstream body in, proxy decided and "
                             "released, answer back) from the request's start, per server")
    parser.add_argument("--keep-memory", type=int, metavar="MIB",
                        help="agentcompact proxy's --keep-memory (default: its default; 0: "
                             "the allocator's defaults)")
    args = parser.parse_args(argv)
    if args.keep_memory is not None:
        os.environ[proxy_latency.KEEP_MEMORY_ENV] = str(args.keep_memory)
    if args.trace:
        os.environ[proxy_latency.TRACE_ENV] = "1"  # the servers' processes inherit it
    proxy_latency.Role.http, proxy_latency.Role.loop = proxy_latency.SERVERS["fast"]
    names = ["ours", *(["ours:buffered"] if args.buffered else []),
             *(["cliff"] if args.cliff else [])]
    widths = {n: max(14, len(n) + 5) for n in names}
    both = "ours:buffered" in names
    print(f"{'tokens':>9} | {'direct':>8} | "
          + " | ".join(f"{n + '+ p50':>{widths[n]}} {'p99':>7}" for n in names)
          + (f" | {'held saves p50':>14} {'p99':>7}" if both else "")
          + f" | {'work p50':>8} {'p99':>7} | "
          + " ".join(f"{n + ' cpu':>{len(n) + 4}}" for n in ["upstream", *names])
          + " | reuse (partial/miss) | load")
    for size in (int(s) for s in args.sizes.split(",")):
        upstream = (f"sink:{args.link_mbps:g}" if args.upstream == "sink" and args.link_mbps
                    else args.upstream)
        r = measure(size, args.steps, args.warmup, names, upstream, args.trace)
        cells = " | ".join(f"{r[f'{n}_p50']:{widths[n]}.2f} {r[f'{n}_p99']:7.2f}"
                           for n in names)
        if both:
            cells += f" | {r['held_saves_p50']:14.2f} {r['held_saves_p99']:7.2f}"
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        cpus = " ".join(f"{r[f'{n}_cpu']:{len(n) + 4}.2f}" for n in ["upstream", *names])
        print(f"{size:>9,} | {r['direct_p50']:8.2f} | {cells} | {r['work_p50']:8.2f} "
              f"{r['work_p99']:7.2f} | {cpus} | {int(r['partial_hits'])}/"
              f"{int(r['misses']):<13} | {load}", flush=True)
        if args.trace:
            _print_trace(r)
    link = f", {args.link_mbps:g} Mbit/s" if args.link_mbps else ""
    print(f"ms to the first streamed byte ({args.upstream} upstream{link}); name+ = added vs "
          "direct on the same step (ours:buffered: agentcompact sending a body on only once "
          "it is all in); held saves = ours:buffered's time minus ours' on the same step; work = "
          "agentcompact's per-request work in process (target: added p50 <= 10 ms at 3M); "
          "cpu = a server process's CPU ms per request (all threads; the upstream's per "
          "request it served), less sensitive to load than the times; "
          "load = the machine's load averages (1/5/15 min) after the size's run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
