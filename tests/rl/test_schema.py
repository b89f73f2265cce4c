"""The segment-row schema, its validator (every RL_EXPORT.md invariant) and file round trips."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentcompact.errors import ExportError, TrajectoryError
from agentcompact.rl._schema import (
    EPISODE_SCHEMA,
    SCHEMA_VERSION,
    SEGMENT_SCHEMA,
    SegmentRowError,
    check_rows,
    read_jsonl,
    read_parquet,
    read_rows,
    rows_to_table,
    to_float32,
    validate_rows,
    write_jsonl,
    write_parquet,
)

from .rowkit import make_episode, make_row

Rows = list[dict[str, Any]]


def good_rows() -> Rows:
    return (
        make_episode("e1", [[1, 1, 0], [0, 1], [1, 0, 1]], reward=1.0, seed=1)
        + make_episode("e2", [[1, 1]], reward=0.0, sample_index=1, seed=2)
        + make_episode("e3", [[1, 0]], group_id="g1", reward=0.0, mask_episode=True, seed=3)
    )


def test_good_rows_are_valid_and_the_schema_names_the_table_fields() -> None:
    validate_rows(good_rows())
    names = set(SEGMENT_SCHEMA.names)
    assert set(make_row()) <= names
    assert SEGMENT_SCHEMA.field("rollout_logprobs").type == pa.list_(pa.float32())
    assert SEGMENT_SCHEMA.field("response_mask").type == pa.list_(pa.int8())
    assert SCHEMA_VERSION == "agentcompact-traj/1"


def edit(pos: int, **fields: Any) -> Callable[[Rows], Rows]:
    def apply(rows: Rows) -> Rows:
        rows[pos] = dict(rows[pos], **fields)
        return rows
    return apply


BREAKAGES: dict[str, tuple[Callable[[Rows], Rows], str, str]] = {
    # name: (mutation, field named in the error, episode named in the error)
    "length": (edit(0, rollout_logprobs=[-0.1, -0.1]), "rollout_logprobs", "e1"),
    "positive logprob": (edit(3, rollout_logprobs=[-0.5, 0.25]), "rollout_logprobs", "e2"),
    "logprob on mask 0": (edit(0, rollout_logprobs=[-0.1, -0.1, -0.1]), "rollout_logprobs",
                          "e1"),
    "mask value": (edit(3, response_mask=[1, 2]), "response_mask", "e2"),
    "advantage on mask 0": (edit(0, advantages=[0.5, 0.5, 0.5]), "advantages", "e1"),
    "advantage in masked episode": (edit(4, advantages=[0.5, 0.0]), "advantages", "e3"),
    "segment gap": (lambda r: r[:1] + r[2:], "segment_index", "e1"),
    "segment order": (lambda r: [r[1], r[0], *r[2:]], "segment_index", "e1"),
    "two last segments": (edit(0, is_last_segment=True), "is_last_segment", "e1"),
    "num_segments": (edit(3, num_segments=2, episode_num_segments=2, is_last_segment=False),
                     "num_segments", "e2"),
    "is_last_segment": (edit(3, num_segments=2, episode_num_segments=2), "is_last_segment",
                        "e2"),
    "reward differs": (edit(1, episode_reward=0.5), "episode_reward", "e1"),
    "group differs": (edit(1, group_id="g9"), "group_id", "e1"),
    "mask_episode differs": (edit(1, mask_episode=True), "mask_episode", "e1"),
    "loss tokens": (lambda r: [dict(x, episode_num_loss_tokens=4) if x["episode_id"] == "e1"
                               else x for x in r], "episode_num_loss_tokens", "e1"),
    "last token mask 0": (edit(3, response_mask=[1, 0], rollout_logprobs=[-0.5, 0.0],
                               episode_num_loss_tokens=1), "response_mask", "e2"),
    "summary mask": (edit(0, summary_span=[0, 3], summary_trained=True), "summary_span", "e1"),
    "summary external": (edit(2, summary_span=[0, 1], summary_trained=False), "summary_span",
                         "e1"),
    "summary span bounds": (edit(0, summary_span=[2, 9]), "summary_span", "e1"),
    "not contiguous": (lambda r: [r[0], r[3], r[1], r[2], r[4]], "episode_id", "e1"),
    "group not contiguous": (lambda r: [r[4], *r[:4]] + [dict(r[4], episode_id="e4",
                                                              sample_index=1)],
                             "group_id", "e4"),
    "sample index reused": (edit(3, sample_index=0), "sample_index", "e2"),
    "tokenizer mismatch": (edit(3, tokenizer_sha256="c" * 64), "tokenizer_sha256", "e2"),
    "schema version": (edit(3, schema_version="agentcompact-traj/0"), "schema_version", "e2"),
    "stop reason": (edit(3, stop_reason="bored"), "stop_reason", "e2"),
    "trigger": (edit(3, compaction_trigger="vibes"), "compaction_trigger", "e2"),
    "missing field": (lambda r: [{k: v for k, v in r[0].items() if k != "advantages"},
                                 *r[1:]], "advantages", "e1"),
    "nan reward": (lambda r: [dict(x, episode_reward=float("nan")) if x["episode_id"] == "e2"
                              else x for x in r], "episode_reward", "e2"),
    "empty prompt": (edit(3, prompt_ids=[]), "prompt_ids", "e2"),
    "sampling keys": (edit(3, sampling={"temperature": 1.0}), "sampling", "e2"),
}


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_each_invariant_is_enforced_and_named(name: str) -> None:
    mutate, field, episode = BREAKAGES[name]
    rows = mutate(good_rows())
    with pytest.raises(SegmentRowError) as info:
        validate_rows(rows)
    assert isinstance(info.value, ExportError)
    hits = [p for p in info.value.problems if p.field == field and p.episode_id == episode]
    assert hits, info.value.problems
    assert field in str(info.value) and episode in str(info.value)


def test_masked_episode_may_end_on_mask0() -> None:
    rows = make_episode("m", [[1, 0]], mask_episode=True)
    assert check_rows(rows) == []
    unmasked = make_episode("u", [[1, 0]])
    assert [p.field for p in check_rows(unmasked)] == ["response_mask"]


def test_summary_span_with_the_right_mask_is_valid() -> None:
    trained = make_episode("t", [[0, 1, 1, 1]])[0] | {"summary_span": [1, 4],
                                                      "summary_trained": True}
    external = make_episode("x", [[1, 0, 0, 1]], sample_index=1)[0] | {
        "summary_span": [1, 3], "summary_trained": False}
    validate_rows([trained, external])


def test_expected_tokenizer_hash_is_checked() -> None:
    rows = good_rows()
    validate_rows(rows, tokenizer_sha256="a" * 64, chat_template_sha256="b" * 64)
    with pytest.raises(SegmentRowError, match="chat_template_sha256"):
        validate_rows(rows, chat_template_sha256="f" * 64)


def test_jsonl_and_parquet_round_trip_exactly(tmp_path) -> None:
    rows = to_float32(good_rows())
    rows[0]["rollout_logprobs"] = [-0.1, 0.0, -1 / 3]  # float64: not float32-representable
    rows = to_float32(rows)
    assert rows[0]["rollout_logprobs"][2] != -1 / 3
    write_jsonl(rows, tmp_path / "s.jsonl")
    back = read_jsonl(tmp_path / "s.jsonl")
    write_parquet(back, tmp_path / "s.parquet")
    again = read_parquet(tmp_path / "s.parquet")
    expected = [dict(r, returns=None) for r in rows]
    assert [dict(r, returns=r.get("returns")) for r in back] == expected
    assert again == expected
    assert pq.read_schema(tmp_path / "s.parquet").field("rollout_logprobs").type == pa.list_(
        pa.float32())
    assert read_rows(tmp_path / "s.jsonl") == back and read_rows(tmp_path / "s.parquet") == again


def test_parquet_shards_directory(tmp_path) -> None:
    rows = to_float32(good_rows())
    write_parquet(rows[:3], tmp_path / "part-000.parquet")
    write_parquet(rows[3:], tmp_path / "part-001.parquet")
    got = read_rows(tmp_path)
    assert [r["episode_id"] for r in got] == [r["episode_id"] for r in rows]
    validate_rows(got)


def test_file_errors_name_the_file_and_line(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(make_row()) + "\n{not json\n")
    with pytest.raises(TrajectoryError, match="bad.jsonl:2"):
        read_jsonl(path)
    with pytest.raises(TrajectoryError, match="unknown"):
        read_rows(tmp_path / "x.csv")
    with pytest.raises(ExportError, match="SEGMENT_SCHEMA"):
        rows_to_table([make_row(prompt_ids="oops")])


def test_episode_schema_accepts_an_episode_row() -> None:
    table = pa.Table.from_pylist([{
        "schema_version": SCHEMA_VERSION, "group_id": "g0", "episode_id": "e1",
        "sample_index": 0, "episode_reward": 1.0, "stop_reason": "complete",
        "mask_episode": False, "num_segments": 3, "num_compactions": 2, "num_loss_tokens": 5,
        "num_response_tokens": 8, "max_working_context": 900, "policy_version": 7,
    }], schema=EPISODE_SCHEMA)
    assert table.num_rows == 1
    assert {"episode_reward", "num_compactions", "max_working_context"} <= set(
        EPISODE_SCHEMA.names)


def _as_arrays(row: dict[str, Any]) -> dict[str, Any]:
    types = {"prompt_ids": np.int32, "response_ids": np.int32, "response_mask": np.int8,
             "summary_span": np.int32, "rollout_logprobs": np.float32,
             "advantages": np.float32}
    return {k: np.asarray(v, dtype=types[k]) if k in types else v for k, v in row.items()}


def test_rows_of_numpy_arrays_give_the_same_table() -> None:
    rows = to_float32(good_rows())
    from_arrays = rows_to_table([_as_arrays(r) for r in rows])
    assert from_arrays.equals(rows_to_table(rows), check_metadata=True)
    assert to_float32([_as_arrays(r) for r in rows])[0]["advantages"].dtype == np.float32


def test_array_rows_that_do_not_fit_are_rejected() -> None:
    rows = [_as_arrays(r) for r in to_float32(good_rows())]
    rows[1]["response_ids"] = rows[1]["response_ids"].astype(np.int64) + 2**40
    with pytest.raises(ExportError, match="do not fit SEGMENT_SCHEMA"):
        rows_to_table(rows)


def test_read_rows_of_an_export_folder_reads_only_the_segment_shards(tmp_path: Any) -> None:
    rows = to_float32(good_rows())
    write_parquet(rows[:3], tmp_path / "segments-00000.parquet")
    write_parquet(rows[3:], tmp_path / "segments-00001.parquet")
    episodes = [{"schema_version": SCHEMA_VERSION, "group_id": "g", "episode_id": "e1",
                 "sample_index": 0, "episode_reward": 1.0, "stop_reason": "complete",
                 "mask_episode": False, "num_segments": 3, "num_compactions": 2,
                 "num_loss_tokens": 5, "num_response_tokens": 8, "max_working_context": 9,
                 "policy_version": 0}]
    pq.write_table(pa.Table.from_pylist(episodes, schema=EPISODE_SCHEMA),
                   tmp_path / "episodes.parquet")
    want = read_parquet(tmp_path / "segments-00000.parquet") + read_parquet(
        tmp_path / "segments-00001.parquet")
    assert len(want) == len(rows)
    assert read_rows(tmp_path) == want and read_parquet(tmp_path) == want
    write_jsonl(rows[:2], tmp_path / "segments-00002.jsonl")  # one format per folder
    with pytest.raises(TrajectoryError, match="both Parquet and JSONL segment shards"):
        read_rows(tmp_path)
    for p in tmp_path.glob("segments-*.parquet"):
        p.unlink()
    assert read_rows(tmp_path) == read_jsonl(tmp_path / "segments-00002.jsonl")
    assert len(read_rows(tmp_path)) == 2
