"""Property tests: exporter invariants on random recorded runs."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcompact import EpisodeEnd
from agentcompact.rl import validate_rows
from agentcompact.trajectory._tokenize import ChatTokenizer
from agentcompact.trajectory.export import ExportOptions, export_runs, read_export
from tests.conftest import QWEN_TOKENIZER, needs_shared_data
from tests.trajectory.runs import agent_loop, record

pytestmark = needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")

_TOK: list[ChatTokenizer] = []


def _tok() -> ChatTokenizer:
    if not _TOK:
        _TOK.append(ChatTokenizer.from_pretrained(QWEN_TOKENIZER))
    return _TOK[0]


episode_spec = st.tuples(
    st.integers(1, 5),                       # turns
    st.one_of(st.none(), st.integers(1, 4)),  # compact before this call
    st.booleans(),                            # summary written by the policy
    st.sampled_from([0.0, 1.0, 0.5]),         # reward
    st.sampled_from(["complete", "complete", "max_turns", "context_length", "error"]),
    st.integers(0, 2),                        # group
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(episode_spec, min_size=1, max_size=6),
       advantage=st.sampled_from(["grpo", "drgrpo", "rloo", "gae-chain", "gae-truncated",
                                  "none"]),
       rows_per_shard=st.integers(1, 8))
def test_random_runs_export_valid_rows(specs: list[tuple[int, int | None, bool, float, str, int]],
                                       advantage: str, rows_per_shard: int) -> None:
    episodes, ends = [], []
    compactions = {}
    for n, (turns, compact_at, trained, reward, stop, group) in enumerate(specs):
        at = compact_at if compact_at is not None and compact_at < turns else None
        compactions[f"e{n}"] = (at, trained)
        episodes.append(agent_loop(f"e{n}", turns, compact_at=at, trained_summary=trained,
                                   group=f"g{group}"))
        ends.append(EpisodeEnd(f"e{n}", reward=reward, stop_reason=stop, group_id=f"g{group}",
                               sample_index=n))
    with tempfile.TemporaryDirectory() as tmp:
        record(Path(tmp) / "run", episodes, ends)
        manifest = export_runs([Path(tmp) / "run"], Path(tmp) / "out", _tok(),
                               ExportOptions(advantage=advantage, rows_per_shard=rows_per_shard))
        rows = read_export(Path(tmp) / "out")
    validate_rows(rows)  # every invariant of RL_EXPORT.md
    assert manifest["counts"]["episodes"] == len(specs)
    for eid, (at, trained) in compactions.items():
        mine = [r for r in rows if r["episode_id"] == eid]
        assert len(mine) == (1 if at is None else 3 if trained else 2)
        if at is not None:
            first = mine[0]
            assert first["stop_reason"] == "compacted"
            assert first["compaction_trigger"] == "token_budget"
            assert first["summary_span"] == [] and not first["summary_trained"]
            if trained:  # the summary in its own context, right after the segment it ends
                own = mine[1]
                assert own["summary_trained"] and own["summary_span"] == [
                    0, len(own["response_ids"])]
                assert own["stop_reason"] == "compacted"
        assert mine[-1]["compaction_trigger"] == "none"
    masked = {r["episode_id"] for r in rows if r["mask_episode"]}
    expect = {f"e{n}" for n, s in enumerate(specs) if s[4] in ("context_length", "error")}
    assert masked == expect


@pytest.mark.parametrize("turns", [1, 3])
def test_single_episode_group_is_valid(tmp_path: Path, turns: int) -> None:
    record(tmp_path / "run", [agent_loop("solo", turns)], [EpisodeEnd("solo", reward=1.0)])
    export_runs([tmp_path / "run"], tmp_path / "out", _tok())
    rows = read_export(tmp_path / "out")
    # singleton group: mean 0, std 1 -> advantage = R / (1 + eps)
    assert rows[0]["group_id"] == "task-0"
    assert max(rows[0]["advantages"]) == pytest.approx(1.0, rel=1e-5)


_TEXT = st.lists(st.sampled_from(list("ab Z9'\n\r\t.,<>{}\"") + ["é", "e\u0301", "\u00a0", "的",
                                                               "<tool_call>", "'s", "\u3000"]),
                max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(head=_TEXT, first=st.characters(min_codepoint=0x21, max_codepoint=0x7E), rest=_TEXT)
def test_a_piece_after_a_newline_encodes_as_on_its_own(head: str, first: str, rest: str) -> None:
    """``joins``: what lets a sampled piece skip its joint encode is exact on any text."""
    tok = _tok()
    tail, piece = head + "\n", first + rest
    if any(t in tail for t in tok._added):  # an added token in the tail: not claimed
        assert not tok.joins(tail, piece)
        return
    assert tok.joins(tail, piece)
    assert tok.encode(tail + piece) == tok.encode(tail) + tok.encode(piece)
