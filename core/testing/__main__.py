"""``python -m agentcompact.testing [--script tool-loop --steps 8] [--port 8090]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import uvicorn

from agentcompact.errors import AgentCompactError
from agentcompact.integrations._threaded_server import listening_socket

from ._app import UpstreamSim, quiet_dropped_streams
from ._latency import LatencyModel
from ._script import Script
from ._toolloop import DEFAULT_LOOP_STEPS, tool_loop_script

_SCRIPTS = {
    "echo": "answer every request with 'echo: <the last user text>'",
    "tool-loop": "call the first tool the request offers, --steps times per user message, "
                 "then answer; a request with no tool gets a digest of its prompt",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentcompact.testing",
        description="Serve a simulated Anthropic / OpenAI provider on a loopback port "
                    "(Messages, Chat Completions, Responses; streaming included). Point a "
                    "client at it: OPENAI_BASE_URL=http://HOST:PORT/v1, "
                    "ANTHROPIC_BASE_URL=http://HOST:PORT.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090, help="port (default 8090)")
    parser.add_argument("--script", choices=sorted(_SCRIPTS), default="echo",
                        help="what the model answers: " + "; ".join(
                            f"{name}: {what}" for name, what in _SCRIPTS.items())
                        + " (default echo)")
    parser.add_argument("--steps", type=int, default=DEFAULT_LOOP_STEPS,
                        help=f"tool calls per user message with --script tool-loop "
                             f"(default {DEFAULT_LOOP_STEPS})")
    parser.add_argument("--prefill", type=float, help="prefill tokens per second")
    parser.add_argument("--decode", type=float, help="decode tokens per second")
    parser.add_argument("--ttft", type=float, default=0.0, help="fixed time to first token, s")
    parser.add_argument("--concurrency", type=int, help="requests served at once (default: all)")
    parser.add_argument("--context-window", type=int, help="reject prompts estimated above it")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    script = tool_loop_script(args.steps) if args.script == "tool-loop" else Script()
    latency = LatencyModel(args.ttft, args.prefill, args.decode, args.concurrency)
    sim = UpstreamSim(script, latency=latency, context_window=args.context_window)
    try:
        sock = listening_socket(args.host, args.port)
    except AgentCompactError as exc:
        print(f"python -m agentcompact.testing: {exc}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    mode = f"tool-loop, {args.steps} steps" if args.script == "tool-loop" else "echo"
    print(f"simulated provider ({mode}) on http://{args.host}:{port}: "
          f"OPENAI_BASE_URL=http://{args.host}:{port}/v1 "
          f"ANTHROPIC_BASE_URL=http://{args.host}:{port}", file=sys.stderr, flush=True)
    quiet_dropped_streams()
    config = uvicorn.Config(sim.app, log_level="warning", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
