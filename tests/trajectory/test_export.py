"""End-to-end export: tau-bench with GRPO groups, Claude Code with its compaction, file
formats and loaders, the validator, and the CLI."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from agentcompact import EpisodeEnd
from agentcompact.errors import ConfigError, ExportError
from agentcompact.rl import SegmentRowError, read_rows, write_parquet
from agentcompact.trajectory import import_trajectories
from agentcompact.trajectory._export_cli import main
from agentcompact.trajectory._tokenize import ChatTokenizer
from agentcompact.trajectory.export import (
    ExportOptions,
    export_runs,
    read_export,
    validate_export,
)
from tests.conftest import QWEN_TOKENIZER, TRAJECTORIES, needs_shared_data
from tests.trajectory.runs import agent_loop, record

TAU = TRAJECTORIES / "tau-bench" / "historical_trajectories" / "gpt-4o-airline.json"
CLAUDE = TRAJECTORIES / "claude-code" / "258c7280-ae70-4798-800f-63464d01a85d.jsonl"

pytestmark = needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer.from_pretrained(QWEN_TOKENIZER)


@pytest.fixture(scope="module")
def tau_export(tmp_path_factory: pytest.TempPathFactory, tok: ChatTokenizer) -> Path:
    if not TAU.exists():
        pytest.skip(f"shared data absent: {TAU}")
    base = tmp_path_factory.mktemp("tau")
    assert import_trajectories([TAU], base / "events.jsonl") == 200
    export_runs([base], base / "out", tok, ExportOptions(rows_per_shard=64))
    return base / "out"


def test_tau_bench_exports_50_groups_of_4(tau_export: Path) -> None:
    manifest = json.loads((tau_export / "manifest.json").read_text())
    assert manifest["counts"]["groups"] == 50 and manifest["counts"]["episodes"] == 200
    rows = read_export(tau_export)
    groups: dict[str, list[int]] = {}
    order: list[str] = []
    for row in rows:
        if row["group_id"] not in groups:
            order.append(row["group_id"])
        groups.setdefault(row["group_id"], []).append(row["sample_index"])
    assert len(groups) == 50 and all(sorted(v) == [0, 1, 2, 3] for v in groups.values())
    # groups are contiguous and shards are cut only between groups
    assert [r["group_id"] for r in rows] == [g for g in order for _ in groups[g]]
    assert len(manifest["files"]["segments"]) == 4  # 64 rows per shard, 200 rows, 4 per group
    for entry in manifest["files"]["segments"]:
        assert entry["rows"] % 4 == 0


def test_grpo_advantages_hand_checked(tau_export: Path) -> None:
    source = json.loads(TAU.read_text())
    rows = read_export(tau_export)
    # pick a group with mixed outcomes
    by_task: dict[str, list[float]] = {}
    for run in source:
        by_task.setdefault(str(run["task_id"]), []).append(float(run["reward"]))
    task = next(t for t, r in by_task.items() if 0 < sum(r) < len(r))
    rewards = by_task[task]
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)  # unbiased, as verl
    seen = 0
    for row in rows:
        if row["group_id"] != task:
            continue
        want = (row["episode_reward"] - mean) / (std + 1e-6)
        assert row["episode_reward"] == rewards[row["sample_index"]]
        for adv, m in zip(row["advantages"], row["response_mask"], strict=True):
            assert adv == (pytest.approx(want, rel=1e-6) if m else 0.0)
        seen += 1
    assert seen == 4
    losers = [r for r in rows if r["group_id"] == task and r["episode_reward"] == 0.0]
    assert all(max(r["advantages"]) <= 0 < -min(r["advantages"]) for r in losers)


def test_rows_end_on_eos_and_hashes_recorded(tau_export: Path, tok: ChatTokenizer) -> None:
    rows = read_export(tau_export)
    eos = tok.hf.convert_tokens_to_ids("<|im_end|>")
    assert all(r["response_ids"][-1] == eos and r["response_mask"][-1] == 1 for r in rows)
    assert {r["tokenizer_sha256"] for r in rows} == {tok.tokenizer_sha256}
    assert {r["chat_template_sha256"] for r in rows} == {tok.chat_template_sha256}
    assert all(r["sampling"]["logprobs_mode"] == "none" for r in rows)
    episodes = pq.read_table(tau_export / "episodes.parquet").to_pylist()
    assert len(episodes) == 200 and all(e["num_segments"] == 1 for e in episodes)
    assert all(e["max_working_context"] > 0 for e in episodes)


def test_jsonl_equals_parquet(tau_export: Path, tmp_path: Path, tok: ChatTokenizer) -> None:
    base = tau_export.parent
    export_runs([base], tmp_path / "j", tok, ExportOptions(fmt="jsonl", rows_per_shard=64))
    assert read_rows(tmp_path / "j" / "segments-00000.jsonl") == read_rows(
        tau_export / "segments-00000.parquet")
    assert sorted(p.name for p in (tmp_path / "j").iterdir()) == [
        "README.md", "episodes.jsonl", "manifest.json",
        *[f"segments-0000{i}.jsonl" for i in range(4)]]


def test_loads_with_pyarrow_and_datasets(tau_export: Path, tmp_path: Path) -> None:
    import datasets

    files = sorted(str(p) for p in tau_export.glob("segments-*.parquet"))
    table = pq.read_table(files[0])
    assert table.schema.field("response_mask").type.value_type.bit_width == 8
    ds = datasets.load_dataset("parquet", data_files=files, split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert len(ds) == 200
    assert ds[0]["prompt_ids"] == table.column("prompt_ids")[0].as_py()


def test_validator_names_a_broken_row(tau_export: Path, tmp_path: Path) -> None:
    rows = read_rows(tau_export / "segments-00000.parquet")
    bad = dict(rows[5])  # untrain the last token (the EOS), consistently in every field
    bad["response_mask"] = [*bad["response_mask"][:-1], 0]
    bad["advantages"] = [*bad["advantages"][:-1], 0.0]
    bad["episode_num_loss_tokens"] -= 1
    rows[5] = bad
    out = tmp_path / "bad"
    out.mkdir()
    for p in tau_export.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    write_parquet(rows, out / "segments-00000.parquet")
    with pytest.raises(SegmentRowError, match="must end on a mask-1 token") as info:
        validate_export(out)
    assert info.value.problems[0].episode_id == rows[5]["episode_id"]
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["counts"]["segments"] += 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "segments-00000.parquet").write_bytes(
        (tau_export / "segments-00000.parquet").read_bytes())
    with pytest.raises(ExportError, match="manifest counts 201 segments"):
        validate_export(out)


@needs_shared_data("trajectories", "claude-code")
def test_claude_code_compact_boundary_gives_two_windows(tmp_path: Path) -> None:
    out = tmp_path / "cc"
    assert main([str(CLAUDE), "--out", str(out), "--tokenizer", str(QWEN_TOKENIZER),
                 "--no-progress", "--advantage", "none"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["compactions"] == 1
    assert manifest["counts"]["breaks"]["compaction"] == 1
    rows = read_export(out)
    assert len(rows) >= 2 and rows[-1]["is_last_segment"]
    triggers = [r["compaction_trigger"] for r in rows]
    assert triggers.count("token_budget") == 1 and triggers[-1] == "none"
    # no reward in a Claude Code session: kept as data, masked from the loss
    assert all(r["mask_episode"] for r in rows)


def test_gae_chain_with_zero_values_equals_reward(tmp_path: Path, tok: ChatTokenizer) -> None:
    run = tmp_path / "run"
    record(run, [agent_loop("a", 4, compact_at=2), agent_loop("b", 2)],
           [EpisodeEnd("a", reward=1.0, group_id="g", sample_index=0),
            EpisodeEnd("b", reward=0.0, group_id="g", sample_index=1)])
    export_runs([run], tmp_path / "out", tok, ExportOptions(advantage="gae-chain"))
    rows = read_export(tmp_path / "out")
    a_rows = [r for r in rows if r["episode_id"] == "a"]
    assert len(a_rows) == 2  # gamma = lam = 1, V = 0: A = R on every action token
    for r in a_rows:
        assert {x for x, m in zip(r["advantages"], r["response_mask"], strict=True) if m} == {1.0}
        assert r["returns"] is not None


def test_failed_episodes_are_masked(tmp_path: Path, tok: ChatTokenizer) -> None:
    run = tmp_path / "run"
    record(run, [agent_loop("a", 2), agent_loop("b", 2)],
           [EpisodeEnd("a", reward=1.0, group_id="g", sample_index=0),
            EpisodeEnd("b", reward=0.0, stop_reason="context_length", group_id="g",
                       sample_index=1)])
    export_runs([run], tmp_path / "out", tok, ExportOptions(advantage="rloo"))
    by_ep = {r["episode_id"]: r for r in read_export(tmp_path / "out")}
    assert not by_ep["a"]["mask_episode"] and by_ep["b"]["mask_episode"]
    assert set(by_ep["b"]["advantages"]) == {0.0}
    assert by_ep["b"]["stop_reason"] == "context_length"
    # RLOO baseline counts the masked episode: A_a = 1 - 0
    assert max(by_ep["a"]["advantages"]) == 1.0


def test_export_refuses_a_used_folder_and_bad_options(tmp_path: Path, tok: ChatTokenizer
                                                      ) -> None:
    run = tmp_path / "run"
    record(run, [agent_loop("a", 2)], [EpisodeEnd("a", reward=1.0)])
    export_runs([run], tmp_path / "out", tok)
    with pytest.raises(ConfigError, match="already holds an export"):
        export_runs([run], tmp_path / "out", tok)
    with pytest.raises(ConfigError, match="advantage 'ppo'"):
        export_runs([run], tmp_path / "o2", tok, ExportOptions(advantage="ppo"))


def test_cli_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing: Any = tmp_path / "nope.json"
    missing.write_text("{\"not\": \"a trajectory\"}")
    assert main([str(missing), "--out", str(tmp_path / "o"), "--tokenizer",
                 str(QWEN_TOKENIZER), "--no-progress"]) == 1
    assert "agentcompact export: error:" in capsys.readouterr().err
    assert not math.isnan(0.0)


def test_read_rows_of_an_export_folder_is_its_segment_rows(tau_export: Path) -> None:
    rows = read_export(tau_export)
    assert len(rows) == 200 and read_rows(tau_export) == rows  # not the episode table too


def test_a_token_break_is_labelled_prefix_break_never_compacted(
        tmp_path: Path, tok: ChatTokenizer) -> None:
    from agentcompact import ModelCall

    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "go"}]
    reply = {"role": "assistant", "content": "ok"}
    calls = [
        ModelCall(episode_id="e", dialect="openai_chat", messages=history, response=[reply],
                  prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5],
                  response_logprobs=[-0.1, -0.2], group_id="g"),
        ModelCall(episode_id="e", dialect="openai_chat",
                  messages=[*history, reply, {"role": "user", "content": "more"}],
                  response=[reply], prompt_token_ids=[1, 2, 3, 4, 6, 7],
                  response_token_ids=[8], response_logprobs=[-0.3], group_id="g"),
    ]
    record(tmp_path / "run", [[("model_call", c) for c in calls]],
           [EpisodeEnd(episode_id="e", reward=1.0, group_id="g")])
    export_runs([tmp_path / "run"], tmp_path / "out", tok, ExportOptions(workers=1))
    rows = read_rows(tmp_path / "out")
    assert [r["stop_reason"] for r in rows] == ["prefix_break", "complete"]
    assert [r["segment_break"] for r in rows] == ["tokens", None]
    assert rows[0]["compaction_trigger"] == "none"
    assert rows[0]["sampling"]["logprobs_mode"] != "none"  # engine logprobs kept


def test_every_field_is_on_the_dataset_card_and_files_are_private(
        tmp_path: Path, tok: ChatTokenizer, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import os

    from agentcompact.rl import EPISODE_SCHEMA, SEGMENT_SCHEMA
    from agentcompact.rl._card import EPISODE_FIELDS, SEGMENT_FIELDS

    assert set(SEGMENT_FIELDS) == set(SEGMENT_SCHEMA.names)
    assert set(EPISODE_FIELDS) == set(EPISODE_SCHEMA.names)
    record(tmp_path / "run", [agent_loop("e0", 4, compact_at=2), agent_loop("e1", 2)],
           [EpisodeEnd(episode_id="e0", reward=1.0, group_id="task-0"),
            EpisodeEnd(episode_id="e1", reward=0.0, group_id="task-0", sample_index=1)])
    old = os.umask(0o022)
    try:
        with caplog.at_level(logging.WARNING):
            manifest = export_runs([tmp_path / "run"], tmp_path / "out", tok,
                                   ExportOptions(workers=1, advantage="gae-truncated"))
    finally:
        os.umask(old)
    card = (tmp_path / "out" / "README.md").read_text()
    assert all(f"| `{name}` |" in card for name in SEGMENT_SCHEMA.names)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()} == {0o600}
    # no critic: the truncated chain gives e0's first segment nothing to learn from
    assert manifest["counts"]["zero_advantage_loss_tokens"] > 0
    assert "advantage gae-truncated" in caplog.text and "will not be trained" in caplog.text


@needs_shared_data("trajectories", "claude-code")
def test_claude_code_compaction_summaries_train_in_their_own_context(
        tmp_path: Path, tok: ChatTokenizer) -> None:
    session = TRAJECTORIES / "claude-code" / "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl"
    summarizer = session.with_suffix("") / "subagents" / "agent-acompact-946d2b.jsonl"
    runs = [session, summarizer]
    plain = export_runs(runs, tmp_path / "plain", tok, ExportOptions(workers=1))
    trained = export_runs(runs, tmp_path / "trained", tok,
                          ExportOptions(workers=1, summary_trained=True))
    assert plain["counts"]["episodes"] == trained["counts"]["episodes"] == 1  # attached
    rows = read_rows(tmp_path / "trained")
    own = [r for r in rows if r["segment_break"] == "summary"]
    assert len(own) == 1 and plain["counts"]["segments"] + 1 == len(rows)
    text = tok.hf.decode(own[0]["prompt_ids"])
    assert "detailed summary of the conversation" in text  # the summary request, as asked
    assert text.endswith("<|im_start|>assistant\n")
    assert own[0]["summary_trained"] and set(own[0]["response_mask"]) == {1}
    assert tok.hf.decode(own[0]["response_ids"]).startswith("<analysis>")


@pytest.mark.parametrize("policy", ["mask", "drop"])
def test_overlong_episodes_are_masked_or_dropped_with_a_count_never_truncated(
        tmp_path: Path, tok: ChatTokenizer, policy: str) -> None:
    record(tmp_path / "run", [agent_loop("long", 6), agent_loop("short", 1)],
           [EpisodeEnd(episode_id="long", reward=1.0, group_id="task-0"),
            EpisodeEnd(episode_id="short", reward=0.0, group_id="task-0", sample_index=1)])
    full = read_rows_of(export_runs([tmp_path / "run"], tmp_path / "full", tok,
                                    ExportOptions(workers=1)), tmp_path / "full")
    sizes = {r["episode_id"]: len(r["prompt_ids"]) + len(r["response_ids"]) for r in full}
    limit = sizes["short"]
    assert sizes["long"] > limit
    manifest = export_runs([tmp_path / "run"], tmp_path / policy, tok,
                           ExportOptions(workers=1, max_tokens=limit, overlong=policy))
    rows = read_rows(tmp_path / policy)
    counts = manifest["counts"]
    if policy == "drop":
        assert [r["episode_id"] for r in rows] == ["short"]
        assert counts["episodes_overlong_dropped"] == 1 and counts["episodes"] == 1
    else:
        assert [r["episode_id"] for r in rows] == ["long", "short"]
        assert rows[0]["mask_episode"] and set(rows[0]["advantages"]) == {0.0}
        assert rows[0]["response_ids"] == full[0]["response_ids"]  # not truncated
        assert counts["episodes_overlong_masked"] == 1


def read_rows_of(manifest: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    assert manifest["counts"]["segments"] >= 1
    return read_rows(out)


def test_cli_reports_a_malformed_event_by_file_and_line_without_content(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = record(tmp_path / "run", [agent_loop("e0", 2)],
                    [EpisodeEnd(episode_id="e0", reward=1.0, group_id="task-0")])
    lines = events.read_bytes().splitlines(keepends=True)
    lines.insert(2, b'{"kind": "model_call", "data": {"messages": "SECRET-CONTENT\n')
    events.write_bytes(b"".join(lines))
    code = main([str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--tokenizer",
                 str(QWEN_TOKENIZER), "--no-progress", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"agentcompact export: error: {events}:3: not a JSON line")
    assert "Traceback" not in err and "SECRET" not in err and err.count("\n") == 1
    lines[2] = b'{"kind": "model_call", "data": {"episode_id": "e0", "messages": 7}}\n'
    events.write_bytes(b"".join(lines))
    code = main([str(tmp_path / "run"), "--out", str(tmp_path / "out2"), "--tokenizer",
                 str(QWEN_TOKENIZER), "--no-progress", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 1 and f"{events}:3: malformed model_call event" in err
    assert "Traceback" not in err
