"""Replay shows fidelity: recall "in context" and "or one expand away", and the survival
of rule-like user messages, per strategy."""

from __future__ import annotations

from typing import Any

from agentcompact.replay import replay
from agentcompact.trajectory import Trajectory
from tests.core.histories import text
from tests.tool_loop import Call, Step, tool_loop

RULE = "Never edit files under vendor/ and keep every function under 40 lines."


def session() -> list[dict[str, Any]]:
    steps: list[Step] = []
    for k in range(30):
        log = (text(1_250, k) + f"\nsrc/module_{k}.py:{100 + k}: check_value_{k}\n"
               + text(1_250, k + 100))  # mid-result: a compaction cuts it out
        steps.append(Step([Call(f"t{k}", "Bash", {"command": f"pytest tests/test_module_{k}.py"},
                                log)], f"Looking at module_{k}.", human=RULE if k == 2 else None))
        # the next turn names what an older result said: needed items, dropped by now
        old = max(0, k - 6)
        steps.append(Step([Call(f"u{k}", "Read", {"file_path": f"src/module_{k}.py"}, "ok")],
                          f"Earlier, module_{old} said check_value_{old}."))
    return tool_loop("anthropic", steps, task="Fix the bug in src/app.py")


def test_replay_reports_expand_recall_and_rules() -> None:
    traj = Trajectory(source="built", format="anthropic", dialect="anthropic",
                      messages=session())
    report = replay([traj], ["cliff", "window"], trigger=12_000)
    totals = report.totals()
    cliff, window = totals["cliff"], totals["window"]
    assert cliff["compactions"] >= 1
    assert cliff["recall_with_expand"] is not None and window["recall_with_expand"] is None
    assert cliff["recall_with_expand"] > cliff["recall"]  # dropped results, one expand away
    assert set(cliff["recall_by_kind_with_expand"]) == set(cliff["recall_by_kind"])
    assert cliff["user_rules"]["needed"] > 0
    assert cliff["user_rules"]["survival"] == 1.0  # pinned by the rules plugin
    assert window["user_rules"]["survival"] < 1.0  # a window drops it
