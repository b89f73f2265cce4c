"""The real Claude Code, Codex and Gemini CLIs through the proxy: figures per client and model.

Each CLI (found on PATH or in ``$AGENTCOMPACT_CLI_BIN``; ``.ci/run`` installs pinned
versions) runs a scripted session of ``--steps`` tool steps (one file read each) through
``agentcompact proxy`` against the upstream simulator, with its default model and with one
older model, at each ``--triggers`` value. Printed per run: steps completed, requests,
compactions, fallbacks and errors, upstream requests the provider's rules refuse
(``validate``), prefix changes outside compactions (the client only appended, yet what
went upstream changed without a compaction), the cached-prefix share, and the input cost
with prompt caching (read 0.1x, write 1.25x; tokens = chars/4 of each message's JSON)
through the proxy relative to the client's own requests (what it sends without a proxy).

    TIKTOKEN_CACHE_DIR=... AGENTCOMPACT_CLI_BIN=.ci-node/node_modules/.bin \\
        python benchmarks/proxy_clis.py [--steps 44] [--triggers 40000,80000] \\
        [--clis claude,codex,gemini]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault(  # the shared data beside the checkout (../shared/data/tiktoken)
    "TIKTOKEN_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../shared/data/tiktoken"),
)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402

from agentcompact import validate  # noqa: E402
from agentcompact._cachecost import CacheCost  # noqa: E402
from agentcompact.dialects import (  # noqa: E402
    AnthropicDialect,
    Dialect,
    GeminiDialect,
    OpenAIResponsesDialect,
    digest_of,
)
from agentcompact.errors import ValidationError  # noqa: E402
from agentcompact.integrations.proxy._observe import redact_json  # noqa: E402
from agentcompact.testing import find_cli  # noqa: E402
from tests.clis.harness import CliRun, run_cli  # noqa: E402 - the tests' own driver

SESSIONS = [("claude", None), ("claude", "claude-sonnet-4-5"),
            ("codex", None), ("codex", "gpt-5.1-codex"),
            ("gemini", None), ("gemini", "gemini-2.5-pro")]
DIALECTS: dict[str, Dialect] = {"claude": AnthropicDialect(), "codex": OpenAIResponsesDialect(),
                                "gemini": GeminiDialect()}
#: what a request sends besides its messages (Gemini: ``systemInstruction``)
FIXED = ("system", "tools", "instructions", "systemInstruction")


def _tokens(value: Any) -> int:
    return -(-len(orjson.dumps(value)) // 4)


def _cost(dialect: Dialect, bodies: list[dict[str, Any]]) -> CacheCost:
    cost = CacheCost()
    for body in bodies:
        fixed = {k: body.get(k) for k in FIXED}
        messages = dialect.messages_of(body)
        cost.add([digest_of(fixed), *(digest_of(m) for m in messages)],
                 [_tokens(fixed), *(_tokens(m) for m in messages)])
    return cost


def figures(run: CliRun, steps: int) -> dict[str, Any]:
    dialect = DIALECTS[run.cli]
    upstream = [redact_json(r.body) for r in run.dialect_requests]
    clients = [d["body"] for d in run.dumps]
    lines = run.proxy_lines
    main = [i for i, b in enumerate(upstream) if b.get("tools") or any(
        isinstance(m, dict) and m.get("type") == "additional_tools" for m in b.get("input", []))]
    invalid = 0
    for body in upstream:
        try:
            validate(dialect.messages_of(body), dialect)
        except ValidationError:
            invalid += 1
    outside = 0
    for a, b in zip(main, main[1:]):
        sent = [digest_of(m) for m in dialect.messages_of(upstream[a])]
        sent_next = [digest_of(m) for m in dialect.messages_of(upstream[b])]
        own = [digest_of(m) for m in dialect.messages_of(clients[a])]
        own_next = [digest_of(m) for m in dialect.messages_of(clients[b])]
        if (sent_next[:len(sent)] != sent and own_next[:len(own)] == own
                and not lines[b]["compacted"]):
            outside += 1
    proxied = _cost(dialect, [upstream[i] for i in main])
    direct = _cost(dialect, [clients[i] for i in main])
    return {
        "steps": sum(1 for s in range(steps) if s in run.loop.calls),
        "ok": run.returncode == 0,
        "requests": len(upstream),
        "compactions": sum(1 for line in lines if line["compacted"]),
        "fallbacks": sum(1 for line in lines if line["fallback"]),
        "errors": sum(1 for line in lines if line["error"]),
        "invalid": invalid,
        "outside": outside,
        "cached": proxied.cached_share,
        "cost": proxied.cost / direct.cost,
        "peak": max(line["tokens_out"] or 0 for line in lines),
        "peak_client": max(line["tokens_in"] or 0 for line in lines),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=44)
    parser.add_argument("--triggers", default="40000,80000")
    parser.add_argument("--clis", default="claude,codex,gemini",
                        help="which CLIs to run (comma-separated)")
    args = parser.parse_args(argv)
    clis = set(args.clis.split(","))
    print(f"{'client':>7} {'model':>18} {'trigger':>8} | {'steps':>7} {'reqs':>5} "
          f"{'compact':>7} {'fallbk':>6} {'errors':>6} {'invalid':>7} {'outside':>7} | "
          f"{'peak sent':>9} {'peak client':>11} {'cached':>7} {'cost':>6}")
    for cli, model in [s for s in SESSIONS if s[0] in clis]:
        executable = find_cli(cli)
        if executable is None:
            print(f"{cli:>7}: not installed (run .ci/run or set AGENTCOMPACT_CLI_BIN)")
            continue
        for trigger in (int(t) for t in args.triggers.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                run = run_cli(cli, executable, Path(tmp), steps=args.steps, trigger=trigger,
                              model=model)
                f = figures(run, args.steps)
            print(f"{cli:>7} {model or 'default':>18} {trigger:>8,} | "
                  f"{f['steps']:>3}/{args.steps:<3} {f['requests']:>5} {f['compactions']:>7} "
                  f"{f['fallbacks']:>6} {f['errors']:>6} {f['invalid']:>7} {f['outside']:>7} | "
                  f"{f['peak']:>9,} {f['peak_client']:>11,} {f['cached']:>7.1%} "
                  f"{f['cost']:>5.2f}x" + ("" if f["ok"] else "  (CLI failed)"), flush=True)
    print("peak = largest request in tokens (the proxy's counter) sent upstream / sent by the "
          "client; cached = share of input tokens repeating the previous request's prefix "
          "through the proxy; cost = input cost with prompt caching through the proxy / the "
          "client's own requests (no proxy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
