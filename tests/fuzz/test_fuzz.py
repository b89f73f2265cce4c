"""The fuzz suite: adversarial histories per dialect, every invariant checked on every
example (see ``invariants``). ``AGENTCOMPACT_FUZZ_PROFILE=soak`` (``tox -e fuzz``) runs
thousands of examples per dialect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompact.testing import Script, UpstreamSim, digest_reply, serve

from .conftest import PROFILE
from .histories import RENDER, Plan, plans
from .invariants import Config, Tally, check_session, dump, make

DIALECTS = ["openai_chat", "anthropic", "openai_responses", "langchain", "gemini"]
ROOT = Path(__file__).resolve().parents[2]


def configs(summarizer: str) -> Any:
    """Engine settings: the three built-in strategies (the LLM ones summarizing through
    the loopback upstream simulator) and a third-party one, either counter."""
    return st.builds(
        Config, trigger=st.sampled_from([1500, 3000, 6000, 20000]),
        recent=st.integers(1, 3), minimum=st.integers(0, 1), strict=st.booleans(),
        strategy=st.sampled_from(["cliff", "cliff", "cliff", "naive", "summary", "parallel"]),
        counter=st.sampled_from(["chars", "chars", "tiktoken"]), summarizer=st.just(summarizer),
    ).filter(lambda c: c.minimum <= c.recent)


@pytest.fixture(scope="module")
def summarizer() -> Iterator[str]:
    server = serve(UpstreamSim(Script(then=digest_reply))).start()
    yield f"{server.base_url}/v1"
    server.stop()


@pytest.mark.network
@pytest.mark.parametrize("dialect", DIALECTS)
def test_fuzz_invariants(dialect: str, summarizer: str) -> None:
    if dialect == "langchain":
        pytest.importorskip("langchain_core")
    tally = Tally()
    engines = configs(summarizer)

    @settings(settings.get_profile(PROFILE))
    @given(plan=plans(), config=engines, other=engines)
    def run(plan: Plan, config: Config, other: Config) -> None:
        before = len(tally.violations)
        check_session(dialect, RENDER[dialect](plan), config, other, tally)
        assert len(tally.violations) == before, tally.violations[before:]

    run()
    print(f"fuzz {dialect}: {tally.histories} histories, {tally.calls} calls, "
          f"{len(tally.violations)} violations")


_SAMPLE = """
import json, sys
from tests.fuzz.histories import RENDER
from tests.fuzz.invariants import Config, dump, make
from tests.fuzz.test_fuzz import sample_plans
out = []
for dialect in ("openai_chat", "anthropic", "openai_responses"):
    for plan in sample_plans():
        engine, _ = make(dialect, Config(3000, 2, 1, False, "cliff"))
        out.append(dump(engine.compact(RENDER[dialect](plan)).messages))
sys.stdout.write(json.dumps(out))
"""


def sample_plans() -> list[Plan]:
    """A few fixed adversarial plans (surrogates, deep nesting, pins, big results)."""
    from .histories import PIN, Turn

    big = "output line " * 800
    turns = [Turn(True, "look", ["a1"], [("a1", big)]),
             Turn(False, "", ["b1", "b2"], [("b1", "x"), ("b2", big)], odd="surrogate"),
             Turn(True, "then", ["c1"], [("c1", big)], human=f"{PIN}-1: keep it", odd="deep"),
             Turn(True, "more", ["d1"], [("d1", big)], instruction="Be brief."),
             Turn(True, "", ["e1"], [("e1", big)], odd="list")]
    return [Plan("Fix it.", turns, True), Plan("Fix it.", turns[::-1], False)]


def test_same_output_in_a_fresh_process() -> None:
    here = []
    for dialect in ("openai_chat", "anthropic", "openai_responses"):
        for plan in sample_plans():
            engine, _ = make(dialect, Config(3000, 2, 1, False, "cliff"))
            here.append(dump(engine.compact(RENDER[dialect](plan)).messages))
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    proc = subprocess.run([sys.executable, "-c", _SAMPLE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    there: list[Any] = json.loads(proc.stdout)
    assert there == here
    assert any("[agentcompact" in text for text in here)


def test_dump_is_stable() -> None:
    assert dump([{"b": 1, "a": 2}]) == dump([{"a": 2, "b": 1}])
