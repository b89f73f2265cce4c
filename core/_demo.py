"""``agentcompact demo``: cliff compaction on a built-in long agent session, offline.

The session is generated deterministically (a seeded coding agent: reads, greps, test
runs with long logs, edits) in the Anthropic dialect. Every model call is replayed
through a cliff engine and, for comparison, sent in full; both are priced with prompt
caching (cache reads 0.1×, cache writes 1.25× the input price).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from ._budget import Budget
from ._cachecost import CacheCost
from ._engine import Engine
from ._tokens import MessageMeter
from ._turns import split_turns
from .errors import ConfigError

__all__ = ["DemoReport", "check_settings", "demo_session", "run_demo"]

_FILES = ["src/app/server.py", "src/app/models.py", "src/app/routes/users.py",
          "src/app/routes/orders.py", "tests/test_orders.py", "src/app/db.py",
          "src/app/cache.py", "pyproject.toml", "src/app/auth.py", "tests/test_auth.py"]
_WORDS = ("order user session cache token request response handler commit rollback "
          "retry timeout payload schema migrate index query result error value").split()


def _code(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        a, b, c = rng.choice(_WORDS), rng.choice(_WORDS), rng.choice(_WORDS)
        out.append(f"{i + 1:4d}  def {a}_{b}(self, {c}: int = {rng.randint(0, 999)}):"
                   f"  # {rng.choice(_WORDS)} {rng.choice(_WORDS)}")
    return "\n".join(out)


def _log(rng: random.Random, lines: int) -> str:
    out = [f"tests/test_{rng.choice(_WORDS)}.py::test_{rng.choice(_WORDS)}_{i} "
           f"{'PASSED' if rng.random() > 0.1 else 'FAILED'}" for i in range(lines)]
    out.append(f"E   AssertionError: expected {rng.randint(1, 99)} got {rng.randint(1, 99)}")
    return "\n".join(out)


def _turn(rng: random.Random, k: int) -> list[dict[str, Any]]:
    path = rng.choice(_FILES)
    kind = rng.choice(["read", "read", "test", "grep", "edit"])
    tool_id = f"toolu_{k:04d}"
    if kind == "read":
        call = {"name": "Read", "input": {"file_path": path}}
        result = _code(rng, rng.randint(40, 400))
    elif kind == "test":
        command = f"pytest -x -q tests/ -k {rng.choice(_WORDS)}"
        call = {"name": "Bash", "input": {"command": command}}
        result = _log(rng, rng.randint(20, 300))
    elif kind == "grep":
        call = {"name": "Grep", "input": {"pattern": rng.choice(_WORDS), "path": "src/"}}
        result = "\n".join(f"{rng.choice(_FILES)}:{rng.randint(1, 500)}: {rng.choice(_WORDS)}"
                           for _ in range(rng.randint(3, 60)))
    else:
        old, new = rng.choice(_WORDS), rng.choice(_WORDS)
        call = {"name": "Edit", "input": {"file_path": path, "old_string": old, "new_string": new}}
        result = f"The file {path} has been updated."
    text = f"Step {k}: let me {kind} {path} to check the {rng.choice(_WORDS)} handling."
    assistant = {"role": "assistant", "content": [
        {"type": "text", "text": text},
        {"type": "tool_use", "id": tool_id, **call},
    ]}
    user: dict[str, Any] = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool_id, "content": result}]}
    if k % 25 == 24:
        user["content"].append({"type": "text", "text": f"Also make sure {path} keeps the "
                                f"{rng.choice(_WORDS)} behaviour (constraint #{k})."})
    return [assistant, user]


def demo_session(turns: int = 160, seed: int = 7) -> list[dict[str, Any]]:
    """A deterministic long coding-agent session (Anthropic messages)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "user", "content": (
        "Fix the failing order tests in this repository. Never change the public API "
        "of src/app/routes/orders.py; run the full test suite before finishing.")}]
    for k in range(turns):
        messages.extend(_turn(rng, k))
    messages.append({"role": "assistant", "content": [{"type": "text", "text": "All tests pass."}]})
    return messages


@dataclass
class DemoReport:
    calls: int
    compactions: int
    peak_tokens: int
    full_peak_tokens: int
    trigger: int
    cached_share: float
    full_cached_share: float
    cost_ratio: float
    engine_ms_per_call: float
    #: the last call: the history it had, and what cliff sent instead
    history: list[dict[str, Any]] = field(default_factory=list)
    history_tokens: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)
    sent_tokens: int = 0
    head_len: int = 0
    #: compactions that fell back from the cliff strategy's own output (no room for it)
    fallbacks: int = 0


#: tokens a compaction message needs beside the newest turn to show anything
_ROOM = 1_000
#: the most turns the demo builds (about 2,600 tokens each)
MAX_TURNS = 2_000


def check_settings(trigger: int, turns: int) -> None:
    """Refuse settings under which the demo would show nothing or mislead."""
    if not 1 <= turns <= MAX_TURNS:
        raise ConfigError(f"--turns {turns}: give 1 to {MAX_TURNS:,} turns (default 160)")
    if trigger < 1:
        raise ConfigError(f"--trigger {trigger}: give a positive number of tokens "
                          "(default 60000)")


def run_demo(trigger: int = 60_000, turns: int = 160) -> DemoReport:
    check_settings(trigger, turns)
    messages = demo_session(turns)
    engine = Engine(strategy="cliff", dialect="anthropic", budget=Budget(trigger_tokens=trigger))
    full = engine.count(messages[:-1])
    if trigger >= full:
        raise ConfigError(f"--trigger {trigger:,}: the {turns}-turn session peaks at {full:,} "
                          "tokens and would never be compacted; give a smaller --trigger "
                          "or more --turns")
    engine_log = logging.getLogger("agentcompact")
    level = engine_log.level
    engine_log.setLevel(logging.ERROR)  # a fallback is counted here and refused below
    try:
        report = _replay(messages, engine, trigger)
    finally:
        engine_log.setLevel(level)
    if report.peak_tokens > trigger or report.fallbacks:
        # the newest turn stays whole: the trigger must hold the largest one, the head and
        # room for the compaction message beside them
        turns_of = split_turns(messages, engine.dialect)
        newest = max(engine.count(messages[turns_of.starts[k]:turns_of.end(k)])
                     for k in range(len(turns_of)))
        head = engine.count(messages[:turns_of.head_len])
        enough = -(-(newest + head + _ROOM) // 1000) * 1000
        raise ConfigError(f"--trigger {trigger:,} leaves no room beside the newest turn, which "
                          f"the engine keeps whole (up to {newest:,} tokens here); "
                          f"give --trigger {enough} or more")
    return report


def _replay(messages: list[dict[str, Any]], engine: Engine, trigger: int) -> DemoReport:
    meter = MessageMeter(engine.counter, engine.dialect)  # digests, for the cache cost
    ours, full = CacheCost(), CacheCost()
    calls = compactions = 0
    spent = 0.0
    fallbacks = 0
    last: Any = None
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        context = messages[:i]
        t0 = time.perf_counter()
        last = engine.compact(context)
        spent += time.perf_counter() - t0
        calls += 1
        compactions += last.compacted
        fallbacks += sum(1 for e in last.events if e.fallback is not None)
        sent = meter.measure(last.messages)
        ours.add(sent.digests, sent.tokens)
        original = meter.measure(context)
        full.add(original.digests, original.tokens)
    return DemoReport(calls, compactions, ours.peak, full.peak, trigger, ours.cached_share,
                      full.cached_share, ours.cost / full.cost, spent * 1000 / max(calls, 1),
                      history=messages[:-1], history_tokens=last.tokens_original,
                      sent=list(last.messages), sent_tokens=last.tokens_after,
                      head_len=last.head_len, fallbacks=fallbacks)
