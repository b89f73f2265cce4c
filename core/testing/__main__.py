"""``python -m agentcompact.testing --port 8090 [--prefill 5000 --decode 50]``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import uvicorn

from ._app import UpstreamSim, quiet_dropped_streams
from ._latency import LatencyModel


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m agentcompact.testing",
        description="Serve a simulated Anthropic/OpenAI provider that echoes the last user text.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--prefill", type=float, help="prefill tokens per second")
    parser.add_argument("--decode", type=float, help="decode tokens per second")
    parser.add_argument("--ttft", type=float, default=0.0, help="fixed time to first token, s")
    parser.add_argument("--concurrency", type=int, help="requests served at once (default: all)")
    parser.add_argument("--context-window", type=int, help="reject prompts estimated above it")
    args = parser.parse_args(argv)
    latency = LatencyModel(args.ttft, args.prefill, args.decode, args.concurrency)
    sim = UpstreamSim(latency=latency, context_window=args.context_window)
    quiet_dropped_streams()
    uvicorn.run(sim.app, host=args.host, port=args.port, timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
