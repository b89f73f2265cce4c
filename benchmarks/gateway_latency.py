"""Added latency of the RL gateway (``agentcompact proxy --rl-tokenizer``) per call, beside a
direct call to the same server in the same run.

The upstream answers as vLLM's OpenAI server does (``prompt_token_ids`` — one id per 4
bytes of the request, about the prompt's length — and the choice's ``token_ids`` with
``return_token_ids``, per-token ``logprobs`` with ``logprobs``), in constant time: a server
that tokenized the prompt (the simulator with a tokenizer) takes hundreds of milliseconds
of noisy CPU on a 32k-token prompt, which would drown the few milliseconds measured here.
It runs in its own process; the gateway and a bare relay (the reference hop: Starlette +
httpx, no parsing) each in theirs. An OpenAI-chat agent session grows by one turn (an assistant tool
call and a ~1k-token tool result) per step from ``--size`` tokens; at every step the same
history goes directly to the upstream (its body asking for ``logprobs`` and
``return_token_ids``), through the relay (the same body) and through the gateway (the
body without them: the gateway asks for them, records the call's ids and logprobs and
keeps the episode), order rotated. Each hop's *added* latency is paired with the direct
call of the same step. The gateway's trigger is above the session (no compaction: what
it costs on a turn of a session; a compaction is the proxy's, measured by
``benchmarks/proxy_latency.py``). Prints p50s; no assertions.

    python benchmarks/gateway_latency.py [--size 32000] [--steps 30] [--warmup 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault(  # the shared data beside the checkout (../shared/data/tiktoken)
    "TIKTOKEN_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/data/tiktoken"),
)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx  # noqa: E402
import orjson  # noqa: E402
from proxy_latency import Role, bare_relay, cpu_s, with_cpu_probe  # noqa: E402

from agentcompact import Budget
from agentcompact.testing import filler_text  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TOKENIZER = os.environ.get("AGENTCOMPACT_BENCH_TOKENIZER",
                           str(SHARED / "tokenizers" / "qwen2.5-coder-0.5b-instruct"))
TURN_TOKENS = 1000
MODEL = "sim-model"


def history(turns: int) -> list[dict[str, Any]]:
    """A coding agent's OpenAI-chat session: a task, then tool calls and ~1k-token results."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing tests."}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": f"Looking at module {t}.",
                         "tool_calls": [{"id": f"call_{t:05d}", "type": "function", "function": {
                             "name": "read_file",
                             "arguments": orjson.dumps({"path": f"src/m{t}.py"}).decode()}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{t:05d}",
                         "content": f"# m{t}.py\n" + filler_text(TURN_TOKENS)})
    return messages


def body(messages: list[dict[str, Any]], *, ask: bool) -> bytes:
    fields: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "messages": messages}
    if ask:
        fields.update(logprobs=True, return_token_ids=True)
    return orjson.dumps(fields)


ANSWER_TOKENS = 16


def vllm_like() -> Any:
    """vLLM's chat completion answer with token ids and logprobs, for any request."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    ids = list(range(1000, 1000 + ANSWER_TOKENS))
    scored = [{"token": f"t{i}", "logprob": -0.01 * (1 + i % 7), "bytes": list(b"t%d" % i),
               "top_logprobs": []} for i in range(ANSWER_TOKENS)]

    async def chat(request: Request) -> Response:
        raw = await request.body()
        asked = orjson.loads(raw)
        choice: dict[str, Any] = {
            "index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "".join(s["token"] for s in scored)},
            "logprobs": {"content": scored} if asked.get("logprobs") else None}
        answer: dict[str, Any] = {"id": "chatcmpl-bench", "object": "chat.completion",
                                  "created": 0, "model": MODEL, "choices": [choice],
                                  "usage": {"prompt_tokens": len(raw) // 4,
                                            "completion_tokens": ANSWER_TOKENS}}
        if asked.get("return_token_ids"):
            choice["token_ids"] = ids
            answer["prompt_token_ids"] = list(range(len(raw) // 4))
        return Response(orjson.dumps(answer), media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def app_for(role: str, upstream: str, trigger: int) -> Any:
    """The ASGI app of a role: the vLLM-like upstream, the relay, or the gateway."""
    if role == "sim":
        return vllm_like()
    if role == "relay":
        return bare_relay(upstream)
    from agentcompact.integrations.proxy import GatewayConfig, ProxyConfig, create_app

    config = ProxyConfig(budget=Budget(trigger), anthropic_upstream=upstream,
                         openai_upstream=upstream, log_requests=False, store="memory:",
                         counter="tiktoken")
    if role == "proxy":  # the compaction proxy alone: the gateway's baseline
        return create_app(config)
    return create_app(config, gateway=GatewayConfig(tokenizer=TOKENIZER))


class Server(Role):
    """A role of this benchmark in its own process (``proxy_latency.Role``, this script)."""

    def __init__(self, role: str, upstream: str = "", trigger: int = 0) -> None:
        import socket
        import subprocess

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", role, "--port",
                                      str(self.port), "--upstream", upstream, "--trigger",
                                      str(trigger)])
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{role} did not start") from None
                time.sleep(0.05)


def serve(role: str, port: int, upstream: str, trigger: int) -> None:
    import uvicorn

    uvicorn.run(with_cpu_probe(app_for(role, upstream, trigger)), host="127.0.0.1",
                port=port, log_level="warning", access_log=False, lifespan="on")


def timed(client: httpx.Client, path: str, content: bytes) -> float:
    t0 = time.perf_counter()
    response = client.post(path, content=content, headers={"content-type": "application/json",
                                                           "authorization": "Bearer k"})
    response.read()
    elapsed = time.perf_counter() - t0
    assert response.status_code == 200, response.text[:300]
    return elapsed


HOPS = ("direct", "relay", "proxy", "gateway")


def run(size: int, steps: int, warmup: int) -> dict[str, float]:
    n0 = size // TURN_TOKENS
    sim = Server("sim")
    servers = {"relay": Server("relay", sim.base_url),
               "proxy": Server("proxy", sim.base_url, trigger=size * 4),
               "gateway": Server("gateway", sim.base_url, trigger=size * 4)}
    urls = {"direct": sim.base_url, **{k: s.base_url for k, s in servers.items()}}
    paths = {k: "/v1/chat/completions" for k in HOPS}
    paths["gateway"] = "/rl/g/bench/e/e0/v1/chat/completions"
    clients = {k: httpx.Client(base_url=url, timeout=120) for k, url in urls.items()}
    full = history(n0 + warmup + steps)
    times: dict[str, list[float]] = {k: [] for k in HOPS}
    cpu: dict[str, float] = {}
    worker = 0.0
    try:
        for step in range(warmup + steps):
            if step == warmup:
                cpu = {k: cpu_s(clients[k]) for k in servers}
                worker = clients["gateway"].get("/rl/stats").json()["worker_cpu_s"]
            messages = full[: 2 + 2 * (n0 + step)]
            order = list(HOPS)[step % len(HOPS):] + list(HOPS)[: step % len(HOPS)]
            for name in order:  # the gateway's client does not ask: the gateway does
                elapsed = timed(clients[name], paths[name],
                                body(messages, ask=name != "gateway"))
                if step >= warmup:
                    times[name].append(elapsed)
        time.sleep(0.5)  # the gateway's recording of the last call, on its worker
        cpu = {k: (cpu_s(clients[k]) - cpu[k]) / steps * 1000 for k in servers}
        worker = (clients["gateway"].get("/rl/stats").json()["worker_cpu_s"] - worker) \
            / steps * 1000
        episodes = clients["gateway"].get("/rl/episodes").json()["episodes"]
    finally:
        for c in clients.values():
            c.close()
        for s in (*servers.values(), sim):
            s.stop()
    out = {"direct_p50_ms": statistics.median(times["direct"]) * 1000}
    for k in servers:
        added = [a - d for a, d in zip(times[k], times["direct"], strict=True)]
        out[f"{k}_added_p50_ms"] = statistics.median(added) * 1000
        out[f"{k}_cpu_ms_per_call"] = cpu[k]
    out["gateway_worker_cpu_ms_per_call"] = worker  # off the event loop: after the answer
    out["gateway_loop_cpu_ms_per_call"] = cpu["gateway"] - worker
    out["calls_recorded"] = episodes[0]["calls"] if episodes else 0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=32_000, help="session tokens at step 0")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)
    parser.add_argument("--trigger", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.upstream, args.trigger)
        return 0
    out = run(args.size, args.steps, args.warmup)
    print(f"gateway latency at ~{args.size} prompt tokens, {args.steps} steps "
          "(one growing session; p50 of per-step differences to the direct call)")
    for key, value in out.items():
        print(f"  {key:32s} {value:10.3f}" if isinstance(value, float) else
              f"  {key:32s} {value:10d}")
    own_loop = out["gateway_loop_cpu_ms_per_call"] - out["proxy_cpu_ms_per_call"]
    print("  the gateway's own work (gateway minus the proxy alone): "
          f"added {out['gateway_added_p50_ms'] - out['proxy_added_p50_ms']:.3f} ms, "
          f"CPU on the event loop {own_loop:.3f} ms, "
          f"on its worker {out['gateway_worker_cpu_ms_per_call']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
