"""Engine figures for issue #12: fuzz histories tried / violations, and the engine's time
per call on a 1M-token history when one message was added.

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python \
        benchmarks/core_fuzz_and_scale.py [--examples N]

Prints figures, asserts nothing (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fuzz(examples: int) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from agentcompact.testing import Script, UpstreamSim, digest_reply, serve
    from tests.fuzz.histories import RENDER, plans
    from tests.fuzz.invariants import Config, Tally, check_session
    from tests.fuzz.test_fuzz import configs

    # the summary and parallel strategies summarize through the loopback simulator, as in
    # the suite (tests/fuzz/test_fuzz.py's ``summarizer`` fixture)
    server = serve(UpstreamSim(Script(then=digest_reply))).start()
    try:
        engines = configs(f"{server.base_url}/v1")
        for dialect in ("openai_chat", "anthropic", "openai_responses", "langchain"):
            tally = Tally()

            @settings(max_examples=examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(plan=plans(), config=engines, other=engines, name=st.just(dialect),
                   seen=st.just(tally))
            def run(plan: Any, config: Config, other: Config, name: str, seen: Tally) -> None:
                check_session(name, RENDER[name](plan), config, other, seen)

            run()
            print(f"fuzz {dialect:17s} histories {tally.histories:6d}  calls "
                  f"{tally.calls:7d}  violations {len(tally.violations)}")
    finally:
        server.stop()


def scale() -> None:
    import orjson

    from agentcompact import Budget, Engine, new_plugin_manager

    msgs: list[Any] = [{"role": "system", "content": "You are a coding agent."},
                       {"role": "user", "content": "Fix the bug."}]
    k = 0
    e = Engine("cliff", "openai_chat", Budget(4_000_000), plugins=new_plugin_manager())
    while e.count(msgs) < 1_000_000:
        for _ in range(50):
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{k}", "type": "function",
                 "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]})
            msgs.append({"role": "tool", "tool_call_id": f"c{k}",
                         "content": f"file_{k}.py line {k}\n" * 60})
            k += 1
    e.compact(msgs)
    same, fresh = [], []
    for step in range(30):
        msgs.append({"role": "user", "content": f"next {step}"})
        t0 = time.perf_counter()
        e.compact(msgs)
        same.append(time.perf_counter() - t0)
    blob = orjson.dumps(msgs)
    parsed = orjson.loads(blob)
    e.compact_request({"messages": parsed})
    for step in range(10):  # a server's bodies, parsed afresh: compact_request
        parsed = orjson.loads(blob) + [{"role": "user", "content": f"again {step}"}]
        t0 = time.perf_counter()
        e.compact_request({"messages": parsed})
        fresh.append(time.perf_counter() - t0)
    print(f"1M-token history ({e.count(msgs):,} tokens, {len(msgs):,} messages), one message "
          f"added: same objects {statistics.median(same) * 1e3:.3f} ms/call (p50), "
          f"parsed afresh {statistics.median(fresh) * 1e3:.2f} ms/call (p50)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=200)
    args = parser.parse_args()
    scale()
    fuzz(args.examples)


if __name__ == "__main__":
    main()
