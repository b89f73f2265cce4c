"""verl / TRL / SkyRL layouts and the JSONL → Parquet → tensors bit-exact round trip."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from agentcompact.errors import ExportError
from agentcompact.rl import assign_advantages
from agentcompact.rl._schema import (
    SEGMENT_SCHEMA,
    read_jsonl,
    read_parquet,
    to_float32,
    validate_rows,
    write_jsonl,
    write_parquet,
)
from agentcompact.rl.adapters import (
    to_skyrl,
    to_trl_rollout,
    to_trl_sft,
    to_verl,
    to_verl_parquet,
)
from agentcompact.rl.torch_data import collate

from .rowkit import make_episode, make_row

PAD = 99_999


def group_rows() -> list[dict]:
    """Example 3's group (E1 won in 3 segments, E2 lost in 1) plus a masked episode."""
    rows = (
        make_episode("E1", [[1, 1], [0, 1, 1], [1, 0, 1]], reward=1.0, seed=1)
        + make_episode("E2", [[1, 0, 1]], reward=0.0, sample_index=1, seed=2)
        + make_episode("M", [[1, 1, 0]], group_id="g1", reward=1.0, mask_episode=True, seed=3)
    )
    return assign_advantages(rows)


def test_to_verl_padding_and_alignment() -> None:
    rows = group_rows()
    out = to_verl(rows, pad_token_id=PAD)
    p = max(len(r["prompt_ids"]) for r in rows)
    r_len = max(len(r["response_ids"]) for r in rows)
    assert out["prompts"].shape == (5, p) and out["responses"].shape == (5, r_len)
    for b, row in enumerate(rows):
        n_p, n_r = len(row["prompt_ids"]), len(row["response_ids"])
        assert out["prompts"][b, p - n_p:].tolist() == row["prompt_ids"]  # left-padded
        assert out["prompts"][b, :p - n_p].tolist() == [PAD] * (p - n_p)
        assert out["responses"][b, :n_r].tolist() == row["response_ids"]  # right-padded
        assert out["responses"][b, n_r:].tolist() == [PAD] * (r_len - n_r)
        real = out["input_ids"][b][out["attention_mask"][b] == 1].tolist()
        assert real == row["prompt_ids"] + row["response_ids"]
        assert out["position_ids"][b][out["attention_mask"][b] == 1].tolist() == list(
            range(n_p + n_r))
        masked = row["mask_episode"]
        assert out["response_mask"][b, :n_r].tolist() == (
            [0] * n_r if masked else row["response_mask"])
    assert out["rollout_log_probs"].dtype == torch.float32
    assert list(out["uid"]) == ["g0"] * 4 + ["g1"]
    assert out["uid"].dtype == object and list(out["segment_index"]) == [0, 1, 2, 0, 0]
    assert list(out["episode_id"]) == ["E1", "E1", "E1", "E2", "M"]


def test_to_verl_reward_on_the_last_mask1_token_of_the_last_segment() -> None:
    rows = group_rows()
    scores = to_verl(rows, pad_token_id=PAD)["rm_scores"]
    assert scores[0].sum() == 0 and scores[1].sum() == 0  # E1's early segments
    assert scores[2].tolist() == [0.0, 0.0, 1.0]  # E1's last segment: mask [1, 0, 1]
    assert scores[4].tolist() == [0.0, 1.0, 0.0]  # masked episode: still its last mask-1 token


def test_row_level_grpo_on_rm_scores_is_wrong_so_advantages_are_shipped() -> None:
    rows = group_rows()[:4]
    out = to_verl(rows, pad_token_id=PAD)
    row_scores = out["rm_scores"].sum(-1).tolist()  # what a row-level GRPO would group by uid
    mean, sd = statistics.mean(row_scores), statistics.stdev(row_scores)
    naive = [(s - mean) / sd for s in row_scores]
    assert naive == pytest.approx([-0.5, -0.5, 1.5, -0.5])  # RL_EXPORT.md Example 3 "wrong"
    first_token_adv = out["advantages"][:, 0].tolist()  # rows 0 and 3 start on a mask-1 token
    assert first_token_adv[0] == pytest.approx(0.7071, abs=1e-4)
    assert first_token_adv[3] == pytest.approx(-0.7071, abs=1e-4)


def test_to_verl_limits_raise_instead_of_truncating() -> None:
    rows = group_rows()
    with pytest.raises(ExportError, match="response_ids"):
        to_verl(rows, pad_token_id=PAD, max_response_len=2)
    padded = to_verl(rows, pad_token_id=PAD, max_prompt_len=8, max_response_len=6)
    assert padded["input_ids"].shape == (5, 14)


def test_to_verl_parquet_loads_with_pyarrow_and_datasets(tmp_path: Path) -> None:
    from datasets import Dataset

    prompt = [{"role": "system", "content": "S"}, {"role": "user", "content": "fix it"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "c1", "type": "function",
                   "function": {"name": "bash", "arguments": {"cmd": "ls"}}}],
               "cache_hint": 3},
              {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a"}]}]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    rows = [dict(r, prompt_json=json.dumps(prompt), tools_json=json.dumps(tools))
            for r in group_rows()]
    to_verl_parquet(rows, tmp_path / "verl.parquet")
    table = pq.read_table(tmp_path / "verl.parquet")
    for col in ("data_source", "prompt", "tools", "ability", "reward_model", "extra_info", "uid",
                "prompt_ids", "response_ids", "response_mask", "rollout_log_probs",
                "advantages"):
        assert col in table.column_names
    ds = Dataset.from_parquet(str(tmp_path / "verl.parquet"), cache_dir=str(tmp_path / "c"))
    assert len(ds) == 5
    first = ds[0]
    got = first["prompt"]
    assert [m["role"] for m in got] == ["system", "user", "assistant", "tool"]
    assert got[1]["content"] == "fix it" and got[3]["tool_call_id"] == "c1"
    assert got[2]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"cmd": "ls"}'}
    assert json.loads(got[2]["extra_json"]) == {"cache_hint": 3}  # kept, not dropped
    assert json.loads(got[3]["content"]) == [{"type": "text", "text": "a"}]
    assert json.loads(first["tools"]) == tools
    assert first["extra_info"]["prompt_tokens"] == len(rows[0]["prompt_ids"])
    assert first["uid"] == "g0" and first["extra_info"]["episode_id"] == "E1"
    assert first["response_ids"] == rows[0]["response_ids"]
    assert ds[4]["response_mask"] == [0, 0, 0]  # masked episode
    with pytest.raises(ExportError, match="segment 0 has no prompt_json"):
        to_verl_parquet(group_rows(), tmp_path / "no.parquet")


def test_trl_rollout_and_sft() -> None:
    rows = group_rows()
    roll = to_trl_rollout(rows)
    assert set(roll) == {"prompt_ids", "completion_ids", "logprobs", "env_mask"}
    assert roll["completion_ids"][1] == rows[1]["response_ids"]
    assert roll["env_mask"][1] == [0, 1, 1] and roll["env_mask"][4] == [0, 0, 0]
    assert roll["logprobs"][2] == rows[2]["rollout_logprobs"]
    sft = to_trl_sft(rows)
    row = rows[2]  # mask [1, 0, 1]
    p = len(row["prompt_ids"])
    assert sft["input_ids"][2] == row["prompt_ids"] + row["response_ids"]
    assert sft["completion_mask"][2] == [0] * p + [1, 0, 1]
    ids = row["response_ids"]
    assert sft["labels"][2] == [-100] * p + [ids[0], -100, ids[2]]
    assert set(sft["labels"][4]) == {-100}


def test_skyrl_generator_output_is_step_wise() -> None:
    rows = group_rows()
    out = to_skyrl(rows)
    assert out["is_last_step"] == [False, False, True, True, True]
    assert out["trajectory_ids"][3] == {"instance_id": "g0", "repetition_id": 1}
    assert out["rewards"][0] == [0.0, 0.0] and out["rewards"][2] == [0.0, 0.0, 1.0]
    assert out["loss_masks"][1] == [0, 1, 1] and out["loss_masks"][4] == [0, 0, 0]
    assert out["prompt_token_ids"][0] == rows[0]["prompt_ids"]
    assert len(out["rollout_logprobs"]) == len(out["response_ids"]) == 5


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


def test_round_trip_jsonl_parquet_tensors_is_bit_exact(tmp_path: Path) -> None:
    from datasets import Dataset

    rng = np.random.default_rng(7)
    rows = group_rows()
    for row in rows:  # float64 logprobs as an engine reports them
        row["rollout_logprobs"] = [-float(rng.uniform(0, 5)) if m else 0.0
                                   for m in row["response_mask"]]
    rows[0]["returns"] = [0.1, 1 / 3]
    rows = to_float32(rows)
    validate_rows(rows)
    write_jsonl(rows, tmp_path / "s.jsonl")
    from_jsonl = read_jsonl(tmp_path / "s.jsonl")
    write_parquet(from_jsonl, tmp_path / "s.parquet")
    from_parquet = read_parquet(tmp_path / "s.parquet")
    from_datasets = Dataset.from_parquet(str(tmp_path / "s.parquet"),
                                         cache_dir=str(tmp_path / "c")).to_list()
    for field in SEGMENT_SCHEMA.names:
        want = [r.get(field) for r in rows]
        assert [r.get(field) for r in from_jsonl] == want, field
        assert [r.get(field) for r in from_parquet] == want, field
        assert [r.get(field) for r in from_datasets] == want, field
    stages = [rows, from_jsonl, from_parquet, from_datasets]
    for make in (lambda rs: collate(rs, pad_token_id=PAD), lambda rs: to_verl(rs, PAD)):
        tensors = [make(rs) for rs in stages]
        for key, ref in tensors[0].items():
            if isinstance(ref, torch.Tensor):
                for other in tensors[1:]:
                    assert torch.equal(bits(other[key]), bits(ref)), key
    # float32 tensors hold exactly the float32-rounded values of the original float64s.
    lp = to_verl(from_parquet, PAD)["rollout_log_probs"]
    assert lp[0, 0].item() == float(np.float32(rows[0]["rollout_logprobs"][0]))


def test_rows_without_returns_or_messages_round_trip(tmp_path: Path) -> None:
    rows = to_float32([make_row()])
    write_parquet(rows, tmp_path / "one.parquet")
    (back,) = read_parquet(tmp_path / "one.parquet")
    assert back["returns"] is None and back["messages_json"] is None
    assert {k: v for k, v in back.items() if k != "returns"} == rows[0]
