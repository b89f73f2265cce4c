"""Export with worker processes: the same files as in-process, errors and log records
brought back as in-process, the tokenizer sent to spawned workers by pickling."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from agentcompact import EpisodeEnd
from agentcompact.errors import ConfigError, TrajectoryError
from agentcompact.trajectory._export_cli import main
from agentcompact.trajectory._tokenize import ChatTokenizer
from agentcompact.trajectory.export import ExportOptions, export_runs, read_export
from tests.conftest import QWEN_TOKENIZER, needs_shared_data
from tests.trajectory.runs import agent_loop, record

pytestmark = needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer.from_pretrained(QWEN_TOKENIZER)


def qwen3ish(tok: ChatTokenizer) -> ChatTokenizer:
    """The Qwen tokenizer with a template that shows reasoning on the last turn only (not
    loadable by name: a worker must get it by pickling)."""
    hf = pickle.loads(pickle.dumps(tok.hf))
    hf.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and m.reasoning_content and loop.last %}"
        "<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return ChatTokenizer(hf, "qwen3ish")


def unstable_summaries(tok: ChatTokenizer) -> ChatTokenizer:
    """qwen3ish, whose render of the summarizer's chat with the summary is not an extension
    of its render with the generation prompt: each trained summary gets a warning (logged
    where the episode is built: in a worker when there are workers)."""
    custom = qwen3ish(tok)
    hf = pickle.loads(pickle.dumps(custom.hf))
    hf.chat_template = ("{% if messages[0].content == 'Summarize.' and not "
                        "add_generation_prompt %}!{% endif %}" + hf.chat_template)
    return ChatTokenizer(hf, "unstable-summaries")


def many_runs(base: Path) -> list[Path]:
    """Two logs, 14 episodes in 4 groups whose episodes are interleaved in the logs,
    with compactions (trained summaries or not), reasoning, a token-level break and
    different lengths, so that rows out of order or mixed up would show."""
    logs = []
    for part in range(2):
        episodes, ends = [], []
        for n in range(7):
            eid = f"p{part}e{n}"
            turns = 2 + (2 * n + part) % 5
            at = 1 + n % (turns - 1) if turns > 2 and n % 2 == 0 else None
            events = agent_loop(eid, turns, compact_at=at, trained_summary=n % 4 == 0,
                                group=f"g{(n + part) % 4}")
            calls = [v for k, v in events if k == "model_call"]
            if n % 3 == 1:
                calls[0].response[0]["reasoning_content"] = f"thinking {n}"
            if n == 5 and turns >= 3:  # leading newlines: a token-level break
                calls[0].response[0]["content"] = "\n\nStep 0: listing."
                for c in calls[1:]:
                    c.messages[2] = calls[0].response[0]
            episodes.append(events)
            ends.append(EpisodeEnd(eid, reward=float(n % 3) / 2, group_id=f"g{(n + part) % 4}",
                                   sample_index=n + 7 * part,
                                   stop_reason="context_length" if n == 6 else "complete"))
        logs.append(record(base / f"run{part}", episodes, ends))
    return logs


def files_of(out: Path) -> dict[str, Any]:
    """Every file of an export: segment rows and episode rows as read back, the manifest
    without its timestamp, and the raw bytes of the data files."""
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.pop("created")
    episodes = out / manifest["files"]["episodes"]["path"]
    table = (pq.read_table(episodes).to_pylist() if episodes.suffix == ".parquet"
             else [json.loads(line) for line in episodes.read_text().splitlines()])
    return {"names": sorted(p.name for p in out.iterdir()), "manifest": manifest,
            "rows": read_export(out), "episodes": table,
            "bytes": {p.name: p.read_bytes() for p in sorted(out.iterdir())
                      if p.name != "manifest.json"}}


@pytest.mark.parametrize(("fmt", "advantage"), [("parquet", "grpo"), ("jsonl", "gae-chain")])
def test_two_workers_write_the_same_files_as_one(tmp_path: Path, tok: ChatTokenizer,
                                                 fmt: str, advantage: str) -> None:
    logs = many_runs(tmp_path)
    outs = {}
    for workers in (1, 2):
        outs[workers] = tmp_path / f"w{workers}"
        export_runs(logs, outs[workers], tok, ExportOptions(
            fmt=fmt, advantage=advantage, rows_per_shard=5, keep_messages=True,
            workers=workers))
    one, two = files_of(outs[1]), files_of(outs[2])
    assert len(one["rows"]) > 14 and len(one["names"]) > 4  # several shards, compactions
    assert one["manifest"]["counts"]["breaks"].get("compaction")
    assert [(r["episode_id"], r["segment_index"]) for r in two["rows"]] == [
        (r["episode_id"], r["segment_index"]) for r in one["rows"]]
    assert two["rows"] == one["rows"]
    assert two["episodes"] == one["episodes"]
    assert two["manifest"] == one["manifest"]
    assert two["bytes"] == one["bytes"]


def test_spawned_workers_get_a_pickled_tokenizer(tmp_path: Path, tok: ChatTokenizer) -> None:
    custom = qwen3ish(tok)
    back = pickle.loads(pickle.dumps(custom))
    assert back.info() == custom.info() and back.name == "qwen3ish"
    chat = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yes", "reasoning_content": "hmm"}]
    assert back.render(chat) == custom.render(chat) != tok.render(chat)
    logs = many_runs(tmp_path)
    export_runs(logs, tmp_path / "w1", custom, ExportOptions(workers=1, rows_per_shard=4))
    export_runs(logs, tmp_path / "w2", custom, ExportOptions(workers=2, rows_per_shard=4,
                                                              start_method="spawn"))
    one, two = files_of(tmp_path / "w1"), files_of(tmp_path / "w2")
    assert one["manifest"]["counts"]["breaks"].get("template")  # the template mattered
    assert two == one


def test_worker_errors_and_log_records_are_the_exporters(
        tmp_path: Path, tok: ChatTokenizer, caplog: pytest.LogCaptureFixture) -> None:
    logs = many_runs(tmp_path)
    messages = {}
    for workers in (1, 2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agentcompact"):
            export_runs(logs, tmp_path / f"ok{workers}", unstable_summaries(tok),
                        ExportOptions(workers=workers, summary_trained=True))
        messages[workers] = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert any("not prefix-stable" in m for _, _, m in messages[1])  # from build_segments
    assert messages[2] == messages[1]
    # a model_call the decoder refuses, in the 12th line of the second log
    lines = logs[1].read_bytes().splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if b'"model_call"' in line][6]
    lines[at] = lines[at].replace(b'"dialect":', b'"no_such_field":1,"dialect":')
    logs[1].write_bytes(b"".join(lines))
    errors = []
    for workers in (1, 2):
        with pytest.raises(TrajectoryError) as info:
            export_runs(logs, tmp_path / f"bad{workers}", tok, ExportOptions(workers=workers))
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert errors[0].startswith(f"{logs[1]}:{at + 1}: malformed model_call event")


def test_workers_option_checked_and_on_the_cli(tmp_path: Path, tok: ChatTokenizer) -> None:
    logs = many_runs(tmp_path)
    with pytest.raises(ConfigError, match="workers must be >= 1"):
        export_runs(logs, tmp_path / "o", tok, ExportOptions(workers=0))
    with pytest.raises(ConfigError, match="start_method 'thread'"):
        export_runs(logs, tmp_path / "o", tok, ExportOptions(start_method="thread"))
    export_runs(logs, tmp_path / "lib", tok, ExportOptions(workers=1))
    assert main([*map(str, logs), "--out", str(tmp_path / "cli"), "--tokenizer",
                 str(QWEN_TOKENIZER), "--no-progress", "--workers", "3"]) == 0
    assert files_of(tmp_path / "cli")["rows"] == files_of(tmp_path / "lib")["rows"]
