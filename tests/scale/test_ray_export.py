"""Export on Ray Data (a local Ray, two CPUs): the same files, byte for byte, as the
local export of the same input; errors and log records come back as from local workers."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcompact.errors import TrajectoryError
from agentcompact.trajectory._tokenize import ChatTokenizer
from agentcompact.trajectory.export import ExportOptions, export_runs
from tests.conftest import QWEN_TOKENIZER, needs_shared_data
from tests.trajectory.test_export_workers import files_of, many_runs

ray = pytest.importorskip("ray", reason="the 'ray' extra is not installed")

from agentcompact.trajectory.ray_export import export_runs_ray  # noqa: E402 - after the skip

pytestmark = [needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct"),
              # Ray's own deprecation notices (DataContext defaults), not ours
              pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer.from_pretrained(QWEN_TOKENIZER)


@pytest.mark.parametrize(("fmt", "workers_write"),
                         [("parquet", True), ("jsonl", True), ("jsonl", False)])
def test_ray_export_is_byte_identical_to_the_local_one(
        fmt: str, workers_write: bool, tmp_path: Path, tok: ChatTokenizer,
        local_ray: None) -> None:
    """The shards written by Ray tasks from the workers' spill files (or, with
    ``workers_write=False``, by the driver): the local export's files, nothing more."""
    logs = many_runs(tmp_path)
    # rows_per_shard=3: several shards, each cut at a group boundary
    local = export_runs(logs, tmp_path / "local", tok,
                        ExportOptions(fmt=fmt, rows_per_shard=3, workers=1))
    on_ray = export_runs_ray(logs, tmp_path / "ray", tok,
                             ExportOptions(fmt=fmt, rows_per_shard=3), batch_size=2,
                             workers_write=workers_write)
    assert len(local["files"]["segments"]) >= 3
    assert sorted(p.name for p in (tmp_path / "ray").iterdir()) == sorted(
        p.name for p in (tmp_path / "local").iterdir())  # the spill folder is gone
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "local")
    for name in [f["path"] for f in local["files"]["segments"]] + [f"episodes.{fmt}"]:
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    assert on_ray["counts"] == local["counts"]


def test_ray_export_raises_what_the_local_export_raises(
        tmp_path: Path, tok: ChatTokenizer, local_ray: None) -> None:
    logs = many_runs(tmp_path)
    raw = logs[1].read_bytes() if logs[1].is_file() else (logs[1] / "events.jsonl").read_bytes()
    path = logs[1] if logs[1].is_file() else logs[1] / "events.jsonl"
    lines = raw.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if b'"model_call"' in line)
    lines[at] = lines[at].replace(b'"messages"', b'"messagez"', 1)  # a bad model_call
    path.write_bytes(b"".join(lines))
    with pytest.raises(TrajectoryError) as local:
        export_runs(logs, tmp_path / "local", tok, ExportOptions(workers=1))
    with pytest.raises(TrajectoryError) as on_ray:
        export_runs_ray(logs, tmp_path / "ray", tok)
    assert str(on_ray.value) == str(local.value)


def test_export_cli_on_ray(tmp_path: Path, local_ray: None,
                           capsys: pytest.CaptureFixture[str]) -> None:
    from agentcompact.trajectory._export_cli import main

    logs = [str(p) for p in many_runs(tmp_path)]
    assert main([*logs, "--out", str(tmp_path / "ray"), "--tokenizer", str(QWEN_TOKENIZER),
                 "--ray", "--rows-per-shard", "4"]) == 0
    assert main([*logs, "--out", str(tmp_path / "local"), "--tokenizer", str(QWEN_TOKENIZER),
                 "--workers", "1", "--rows-per-shard", "4"]) == 0
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "local")
