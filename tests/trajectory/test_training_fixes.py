"""What the exporter does for training that a reviewer found wrong: episodes without a
reward never count as reward 0, a trained summary's row states the settings and policy
version it was sampled at, and a critic-free GAE export says what it is."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from agentcompact import EpisodeEnd, SummaryCall
from agentcompact.trajectory._tokenize import ChatTokenizer
from agentcompact.trajectory.export import ExportOptions, export_runs, read_export
from tests.conftest import QWEN_TOKENIZER, needs_shared_data
from tests.trajectory.runs import agent_loop, record

pytestmark = needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer.from_pretrained(QWEN_TOKENIZER)


def _group_with_a_crash(run: Path) -> None:
    """Group g: a win, a loss, and a rollout whose grader crashed (no reward)."""
    record(run, [agent_loop("win", 2, group="g"), agent_loop("loss", 2, group="g"),
                 agent_loop("crash", 2, group="g"), agent_loop("other", 2, group="h")],
           [EpisodeEnd(episode_id="win", reward=1.0, group_id="g", sample_index=0),
            EpisodeEnd(episode_id="loss", reward=0.0, group_id="g", sample_index=1),
            EpisodeEnd(episode_id="crash", reward=None, group_id="g", sample_index=2),
            EpisodeEnd(episode_id="other", reward=1.0, group_id="h", sample_index=0)])


def _by_episode(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["episode_id"]: r for r in rows}


def test_an_unrewarded_episode_masks_its_group_by_default(
        tmp_path: Path, tok: ChatTokenizer, caplog: pytest.LogCaptureFixture) -> None:
    _group_with_a_crash(tmp_path / "run")
    with caplog.at_level(logging.WARNING):
        manifest = export_runs([tmp_path / "run"], tmp_path / "out", tok,
                               ExportOptions(workers=1))
    rows = _by_episode(read_export(tmp_path / "out"))
    for eid in ("win", "loss", "crash"):  # the whole group: zero loss, nothing pushed down
        assert rows[eid]["mask_episode"] and set(rows[eid]["advantages"]) == {0.0}
    assert not rows["other"]["mask_episode"]
    counts = manifest["counts"]
    assert (counts["episodes_unrewarded"], counts["groups_unrewarded_masked"]) == (1, 1)
    assert "1 episode(s) without a reward: their 1 group(s) masked" in caplog.text


def test_drop_episode_leaves_it_out_of_its_groups_statistics(
        tmp_path: Path, tok: ChatTokenizer) -> None:
    _group_with_a_crash(tmp_path / "run")
    manifest = export_runs([tmp_path / "run"], tmp_path / "out", tok,
                           ExportOptions(workers=1, unrewarded="drop-episode"))
    rows = _by_episode(read_export(tmp_path / "out"))
    assert "crash" not in rows and manifest["counts"]["episodes_unrewarded_dropped"] == 1
    # the group is {1, 0}: ±0.7071 (with the crash as a 0 it would be +1.1547 / -0.5774)
    for eid, want in (("win", 0.70710677), ("loss", -0.70710677)):
        row = rows[eid]
        trained = [a for a, m in zip(row["advantages"], row["response_mask"]) if m]
        assert trained == pytest.approx([want] * len(trained), rel=1e-5)


def _with_trained_summary(run: Path, summary_request: dict[str, Any] | None) -> None:
    events = agent_loop("e", 4, compact_at=2, trained_summary=True)
    for kind, value in events:
        if kind == "model_call":
            value.policy_version = 3
    summary = next(v for k, v in events if k == "summary_call")
    assert isinstance(summary, SummaryCall)
    summary.policy_version = 3
    if summary_request is not None:
        summary.request = summary_request
    record(run, [events], [EpisodeEnd(episode_id="e", reward=1.0, group_id="g")])


def test_a_trained_summary_row_states_the_settings_it_was_sampled_at(
        tmp_path: Path, tok: ChatTokenizer) -> None:
    """The agent samples at temperature 1.0; the summary at 0.7, top_p 0.9: its row says
    0.7 and 0.9, and the policy version that wrote it."""
    _with_trained_summary(tmp_path / "run", {"temperature": 0.7, "top_p": 0.9})
    export_runs([tmp_path / "run"], tmp_path / "out", tok, ExportOptions(workers=1))
    rows = read_export(tmp_path / "out")
    [summary] = [r for r in rows if r["summary_trained"]]
    assert (summary["sampling"]["temperature"], summary["sampling"]["top_p"]) == (
        pytest.approx(0.7), pytest.approx(0.9))
    assert {r["sampling"]["temperature"] for r in rows if not r["summary_trained"]} == {1.0}
    assert {r["policy_version"] for r in rows} == {3}


def test_a_summary_recorded_without_its_settings_never_claims_the_agents(
        tmp_path: Path, tok: ChatTokenizer) -> None:
    _with_trained_summary(tmp_path / "run", None)
    export_runs([tmp_path / "run"], tmp_path / "out", tok, ExportOptions(workers=1))
    [summary] = [r for r in read_export(tmp_path / "out") if r["summary_trained"]]
    assert summary["sampling"]["temperature"] is None  # unknown, not the agent's 1.0


@pytest.mark.parametrize("mode", ["gae-chain", "gae-truncated"])
def test_a_critic_free_gae_export_says_which_trainers_cannot_take_it(
        tmp_path: Path, tok: ChatTokenizer, caplog: pytest.LogCaptureFixture, mode: str) -> None:
    record(tmp_path / "run", [agent_loop("e", 3, compact_at=1)],
           [EpisodeEnd(episode_id="e", reward=1.0, group_id="g")])
    with caplog.at_level(logging.WARNING):
        export_runs([tmp_path / "run"], tmp_path / "out", tok,
                    ExportOptions(workers=1, advantage=mode))
    text = caplog.text
    assert f"advantage {mode}: computed with V = 0" in text
    assert "verl recomputes GAE per row" in text and "SkyRL refuses GAE" in text
