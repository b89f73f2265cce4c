"""Replay figures against values computed by hand on a small built session."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentcompact.replay import (
    PRICES,
    ContenderSettings,
    FullHistory,
    Sent,
    replay,
    replay_trajectory,
    resolve_price,
)
from agentcompact.trajectory import Trajectory


class WordCounter:
    """One token per whitespace-separated word: easy to count by hand."""

    name = "words"

    def count_texts(self, texts: list[str]) -> list[int]:
        return [len(t.split()) for t in texts]


def _result(ref: str, text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ref,
                                         "content": text}]}


# words (+4 framing tokens per message), computed by hand:
# m0 "Fix the bug in src/app/db.py please"                         6 -> 10
# m1 "Reading src/app/db.py" + '{"file_path":"src/app/db.py"}'      3 -> 7
# m2 "def connect_db(): return 4242"                               4 -> 8
# m3 "Running the tests now" + '{"command":"pytest -x"}'            6 -> 10
# m4 "FAILED test_db.py::test_connect - AssertionError: 4242 != 42" 7 -> 11
SESSION: list[dict[str, Any]] = [
    {"role": "user", "content": "Fix the bug in src/app/db.py please"},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Reading src/app/db.py"},
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "src/app/db.py"}}]},
    _result("t1", "def connect_db(): return 4242"),
    {"role": "assistant", "content": [
        {"type": "text", "text": "Running the tests now"},
        {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "pytest -x"}}]},
    _result("t2", "FAILED test_db.py::test_connect - AssertionError: 4242 != 42"),
    {"role": "assistant", "content": [
        {"type": "text",
         "text": "The value 4242 in src/app/db.py must become 42; connect_db fixed."}]},
]
TRAJ = Trajectory(source="built", format="anthropic", dialect="anthropic", messages=SESSION)
SONNET = PRICES["claude-sonnet-4-5"]  # $3 input, $0.30 read, $3.75 write per MTok


def _run(strategies: list[str], trigger: int = 40, price: Any = SONNET, **kw: Any) -> Any:
    return replay([TRAJ], strategies, trigger=trigger, counter=WordCounter(), price=price, **kw)


def test_full_history_figures() -> None:
    run = _run(["none"]).trajectories[0].runs["none"]
    # calls before m1, m3, m5: contexts m0 | m0..m2 | m0..m4
    assert run.tokens == [10, 10 + 7 + 8, 10 + 7 + 8 + 10 + 11]
    # each call repeats the whole previous context
    assert run.cached == [0, 10, 25]
    totals = _run(["none"]).totals()["none"]
    assert totals["cached_share"] == pytest.approx(35 / 81)
    assert totals["cost_usd"] == pytest.approx((35 * 0.30 + 46 * 3.75) / 1e6)
    # needed: call 0 -> src/app/db.py (in m0); call 1 -> none ("pytest -x" is new);
    # call 2 -> 4242, src/app/db.py, connect_db; all present in the full history
    assert run.needed == [1, 0, 3]
    assert run.present == [1, 0, 3]
    assert totals["recall"] == 1.0
    assert totals["compactions"] == 0


def test_window_figures_and_drop_record() -> None:
    run = _run(["window"]).trajectories[0].runs["window"]
    # call 2: 46 > 40; room 40 - 10 (head) = 30 holds the last turn m3+m4 (21) but not
    # also m1+m2 (15): sent m0, m3, m4
    assert run.tokens == [10, 25, 10 + 10 + 11]
    assert run.cached == [0, 10, 10]  # only m0 still matches the previous call's prefix
    assert run.present == [1, 0, 2]  # connect_db was only in the dropped m2
    totals = _run(["window"]).totals()["window"]
    assert totals["cached_share"] == pytest.approx(20 / 66)
    assert totals["cost_usd"] == pytest.approx((20 * 0.30 + 46 * 3.75) / 1e6)
    assert totals["recall"] == pytest.approx(3 / 4)
    assert totals["peak_tokens"] == 31
    (record,) = run.compactions
    assert record.call == 2 and record.at == 5
    assert [(d["index"], d["action"], d["tokens"]) for d in record.dropped] == [
        (1, "dropped", 7), (2, "dropped", 8)]
    assert record.tokens_before == 46 and record.tokens_after == 31
    assert sorted(i for i, _ in record.lost_items) == ["connect_db", "file_path"]


def test_openai_cache_read_price() -> None:
    totals = _run(["none"], price=resolve_price("openai", "gpt-4o", "anthropic")).totals()
    # gpt-4o: $2.50 input, cached reads at half price, no write premium
    assert totals["none"]["cost_usd"] == pytest.approx((35 * 1.25 + 46 * 2.50) / 1e6)


def test_cached_prefix_is_by_content_not_identity() -> None:
    class Copies:
        name = "copies"

        def prepare(self, messages: list[Any]) -> Sent:
            return Sent(copy.deepcopy(messages))

    settings = ContenderSettings(trigger=40, counter=WordCounter())
    full = replay_trajectory(TRAJ, ["none"], settings, SONNET, contenders={"none": FullHistory()})
    copies = replay_trajectory(TRAJ, ["copies"], settings, SONNET,
                               contenders={"copies": Copies()})
    a, b = full.runs["none"], copies.runs["copies"]
    assert (a.tokens, a.cached, a.present) == (b.tokens, b.cached, b.present)


def test_cliff_compacts_and_records_what_it_dropped() -> None:
    report = _run(["none", "cliff"], trigger=30, target=28)
    run = report.trajectories[0].runs["cliff"]
    assert len(run.compactions) == 1
    record = run.compactions[0]
    assert record.call == 2 and record.tokens_after < record.tokens_before
    assert {d["index"] for d in record.dropped} <= {1, 2}
    assert run.tokens[2] < report.trajectories[0].runs["none"].tokens[2]


def test_system_prompt_is_counted_and_cached() -> None:
    traj = Trajectory(source="s", format="anthropic", dialect="anthropic", messages=SESSION,
                      system="You are a careful engineer")  # 5 words -> 9 tokens
    report = replay([traj], ["none"], trigger=40, counter=WordCounter(), price=SONNET)
    run = report.trajectories[0].runs["none"]
    assert run.tokens == [19, 34, 55]
    assert run.cached == [0, 19, 34]


def test_skipped_strategies_carry_a_reason() -> None:
    report = _run(["none", "summary", "parallel"])
    assert set(report.skipped) == {"summary", "parallel"}
    assert all("--summarizer-url" in r for r in report.skipped.values())
    assert report.strategies == ["none"]
