"""The writing seam of ``export_runs``: a runner's own ``Writer`` gets every episode in
export order with a group end after each group, and its ``written()`` is the manifest's
``files``; ``ExportWriter`` writing one shard alone (as a Ray task does) writes that
shard's bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentcompact.trajectory._export_pool import ProcessEpisodes
from agentcompact.trajectory._export_writer import ExportWriter, Writer
from agentcompact.trajectory._tokenize import ChatTokenizer
from agentcompact.trajectory.export import ExportOptions, export_runs
from tests.conftest import QWEN_TOKENIZER, needs_shared_data
from tests.trajectory.test_export_workers import files_of, many_runs

pytestmark = needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer.from_pretrained(QWEN_TOKENIZER)


class RecordingWriter(ExportWriter):
    """The local writer, noting each call (episode id and group, or a group end)."""

    def __init__(self, out: Path, opts: ExportOptions) -> None:
        super().__init__(out, opts)
        self.calls: list[tuple[str, ...]] = []
        self.rows: list[list[dict[str, Any]]] = []

    def add(self, rows: list[dict[str, Any]], episode: dict[str, Any]) -> None:
        self.calls.append(("add", episode["episode_id"], episode["group_id"]))
        self.rows.append(rows)
        super().add(rows, episode)

    def end_group(self) -> None:
        self.calls.append(("end_group",))
        super().end_group()


class RunnerWithWriter(ProcessEpisodes):
    made: list[RecordingWriter] = []

    def writer(self, out: Path, opts: ExportOptions) -> Writer:
        writer = RecordingWriter(out, opts)
        self.made.append(writer)
        return writer


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_runners_writer_writes_the_export(tmp_path: Path, tok: ChatTokenizer,
                                            fmt: str) -> None:
    logs = many_runs(tmp_path)
    opts = ExportOptions(fmt=fmt, advantage="grpo", rows_per_shard=5, workers=1)
    export_runs(logs, tmp_path / "plain", tok, opts)
    RunnerWithWriter.made = []
    manifest = export_runs(logs, tmp_path / "seam", tok, opts, runner=RunnerWithWriter)
    (writer,) = RunnerWithWriter.made
    assert files_of(tmp_path / "seam")["bytes"] == files_of(tmp_path / "plain")["bytes"]
    assert manifest["files"] == writer.written()
    assert json.loads((tmp_path / "seam" / "manifest.json").read_text())["files"] == (
        writer.written())
    # every episode once, its group's episodes together, a group end after each group
    groups: list[str] = []
    for call, after in zip(writer.calls, [*writer.calls[1:], None], strict=True):
        if call[0] == "add":
            assert after is not None
            if after[0] == "add":
                assert after[2] == call[2]  # the same group until its end
            groups.append(call[2])
    assert len({c[1] for c in writer.calls if c[0] == "add"}) == 14
    ends = sum(1 for c in writer.calls if c[0] == "end_group")
    assert ends == len(set(groups)) == 4
    assert writer.calls[-1] == ("end_group",)


def test_one_shard_written_alone_is_that_shard(tmp_path: Path, tok: ChatTokenizer) -> None:
    logs = many_runs(tmp_path)
    opts = ExportOptions(rows_per_shard=5, workers=1)
    RunnerWithWriter.made = []
    manifest = export_runs(logs, tmp_path / "full", tok, opts, runner=RunnerWithWriter)
    (writer,) = RunnerWithWriter.made
    shards = manifest["files"]["segments"]
    assert len(shards) >= 3
    # the episodes of shard 1 (shards hold whole groups, in order)
    rows_before = shards[0]["rows"]
    episodes, seen = [], 0
    for rows in writer.rows:
        if rows_before <= seen < rows_before + shards[1]["rows"]:
            episodes.append(rows)
        seen += len(rows)
    alone = tmp_path / "alone"
    alone.mkdir()
    one = ExportWriter(alone, opts, episodes=False, first_shard=1)
    for rows in episodes:
        one.add(rows, {})
    one.close()
    assert sorted(p.name for p in alone.iterdir()) == [shards[1]["path"]]
    assert one.files == [shards[1]]
    assert (alone / shards[1]["path"]).read_bytes() == (
        tmp_path / "full" / shards[1]["path"]).read_bytes()
