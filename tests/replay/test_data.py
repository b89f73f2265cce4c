"""Replay of every shared trajectory file runs without error (non-LLM strategies)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcompact.replay import load_sessions, replay
from agentcompact.replay._baselines import ContenderSettings, unavailable_reason
from tests.conftest import TRAJECTORIES, needs_shared_data

pytestmark = needs_shared_data("trajectories")


@pytest.fixture(scope="module")
def sessions() -> list:
    skipped: list[tuple[Path, str]] = []
    found = load_sessions([str(TRAJECTORIES)], on_skip=lambda p, r: skipped.append((p, r)))
    # the one OpenHands event stream is the only file that is not a chat
    assert [p.parent.name for p, _ in skipped] == ["trajs"], skipped
    return found


def test_every_file_replays(sessions: list) -> None:
    report = replay(sessions, ["none", "window", "cliff"], trigger=20_000)
    assert report.failures == {}
    assert len(report.trajectories) == len(sessions) > 200
    totals = report.totals()
    assert totals["none"]["recall"] == 1.0 and totals["none"]["compactions"] == 0
    for name in ("window", "cliff"):
        t = totals[name]
        assert t["calls"] == totals["none"]["calls"]
        assert t["compactions"] > 0 and t["errors"] == 0
        assert t["total_input_tokens"] < totals["none"]["total_input_tokens"]
        assert 0.5 < t["recall"] < 1.0
    for traj in report.trajectories:
        for run in traj.runs.values():
            assert len(run.tokens) == len(traj.calls)
            assert all(0 <= c <= t for c, t in zip(run.cached, run.tokens))
            assert all(0 <= p <= n for p, n in zip(run.present, run.needed))
    json_figures = report.to_dict()
    assert set(json_figures["totals"]) == {"none", "window", "cliff"}


def test_cliff_stays_under_trigger_on_big_sessions() -> None:
    folder = TRAJECTORIES / "claude-code"
    big = [str(p) for p in sorted(folder.glob("*.jsonl")) if p.stat().st_size > 1_000_000]
    assert len(big) == 3
    report = replay(load_sessions(big), ["none", "cliff"], trigger=60_000)
    for traj in report.trajectories:
        none, cliff = traj.runs["none"], traj.runs["cliff"]
        assert max(none.tokens) > 100_000
        assert cliff.compactions and max(cliff.tokens) <= 60_000
        for record in cliff.compactions:
            assert record.dropped and record.tokens_after < record.tokens_before
        assert traj.harness_compactions  # Claude Code's own compact_boundary


@pytest.mark.skipif(
    unavailable_reason("cliffcompaction", ContenderSettings(1)) is not None,
    reason="cliffcompaction not installed (extra 'bench')")
def test_cliffcompaction_peer_on_small_sessions() -> None:
    files = [TRAJECTORIES / "claude-code" / "subagent.jsonl",
             TRAJECTORIES / "mini-swe-agent-pr854"]
    report = replay(load_sessions([str(f) for f in files]), ["none", "cliffcompaction"],
                    trigger=8_000)
    assert report.failures == {} and report.skipped == {}
    peer = report.totals()["cliffcompaction"]
    assert peer["compactions"] > 0
    assert peer["total_input_tokens"] < report.totals()["none"]["total_input_tokens"]
