"""Rows in memory equal the export's: the same hook calls go to a Recorder (its file is
exported) and to an EpisodeCollector (turned into rows with no file), and the two give the
same rows, field for field, the same episode table and the same counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from agentcompact import EpisodeEnd, new_plugin_manager
from agentcompact.errors import ExportError
from agentcompact.plugins.recorder import Recorder
from agentcompact.rl import validate_rows
from agentcompact.trajectory import (
    EpisodeCollector,
    episode_rows,
    group_advantages,
    rows_from_events,
)
from agentcompact.trajectory._tokenize import ChatTokenizer
from agentcompact.trajectory.export import ExportOptions, export_runs, read_export
from tests.conftest import QWEN_TOKENIZER, needs_shared_data
from tests.trajectory.runs import agent_loop

pytestmark = needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer.from_pretrained(QWEN_TOKENIZER)


def _report(pm: Any, events: list[tuple[str, Any]]) -> None:
    for kind, value in events:
        if kind == "model_call":
            pm.hook.agentcompact_log_model_call(call=value)
        elif kind == "summary_call":
            pm.hook.agentcompact_log_summary_call(call=value)
        else:
            pm.hook.agentcompact_on_compaction(event=value)


def _run(tmp_path: Path) -> EpisodeCollector:
    """Two groups: a compacted episode with a trained summary, plain ones, a repeated
    sample index, a crash without an end, an episode without a reward (group b) and one
    that timed out; reported once, to both a Recorder and a collector."""
    pm = new_plugin_manager()
    collector = EpisodeCollector()
    pm.register(collector)
    recorder = Recorder(tmp_path / "run")
    pm.register(recorder)
    plan = [
        (agent_loop("a0", 5, compact_at=2, trained_summary=True, group="a"),
         EpisodeEnd(episode_id="a0", reward=1.0, group_id="a", sample_index=0)),
        (agent_loop("a1", 3, group="a"),
         EpisodeEnd(episode_id="a1", reward=0.0, group_id="a", sample_index=0)),
        (agent_loop("a2", 4, compact_at=1, group="a"),
         EpisodeEnd(episode_id="a2", reward=0.5, group_id="a", sample_index=2,
                    stop_reason="timeout")),
        (agent_loop("b0", 2, group="b"),
         EpisodeEnd(episode_id="b0", reward=1.0, group_id="b")),
        (agent_loop("b1", 3, group="b"),
         EpisodeEnd(episode_id="b1", reward=None, group_id="b", sample_index=1)),
        (agent_loop("c0", 3, group="c"), None),  # crashed: no end
    ]
    for events, end in plan:
        _report(pm, events)
        if end is not None:
            pm.hook.agentcompact_log_episode_end(episode=end)
    recorder.close()
    return collector


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("options", [
    {}, {"unrewarded": "drop-episode"}, {"advantage": "rloo"},
    {"advantage": "gae-chain", "gamma": 0.9, "lam": 0.8}, {"max_tokens": 200},
    {"summary_trained": False, "keep_messages": True},
], ids=["grpo", "drop-episode", "rloo", "gae-chain", "overlong", "messages"])
def test_rows_in_memory_are_the_exported_rows(tmp_path: Path, tok: ChatTokenizer,
                                              options: dict[str, Any]) -> None:
    collector = _run(tmp_path)
    opts = ExportOptions(workers=1, **options)
    manifest = export_runs([tmp_path / "run"], tmp_path / "out", tok, opts)
    exported = read_export(tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / "episodes.parquet").to_pylist()
    batch = rows_from_events(collector.episodes(), tok, opts)
    assert len(batch.rows) == len(exported) > 0
    for mine, theirs in zip(batch.rows, exported, strict=True):
        mine = _plain(mine)
        assert mine.keys() == theirs.keys()
        for name in theirs:
            assert mine[name] == theirs[name], (name, mine["episode_id"],
                                                mine["segment_index"])
    assert [_plain(e) for e in batch.episodes] == table
    assert batch.counts == {k: v for k, v in manifest["counts"].items()}
    validate_rows(batch.rows)


def test_episodes_become_rows_as_they_finish_then_a_batch_gets_its_groups(
        tmp_path: Path, tok: ChatTokenizer) -> None:
    """The online seam: rows per episode while others still run, group statistics once
    the batch is in; the same rows as all at once."""
    collector = _run(tmp_path)
    whole = rows_from_events(collector.episodes(), tok)
    first = collector.finished()  # every ended episode; c0 (no end) stays
    assert [e.episode_id for e in first] == ["a0", "a1", "a2", "b0", "b1"] and len(collector) == 1
    crashed = collector.take("c0")
    assert crashed.end is None and len(collector) == 0
    built = [episode_rows(e, tok) for e in [*first, crashed]]
    assert [e.reward for e in built] == [1.0, 0.0, 0.5, 1.0, None, None]
    assert all(a == 0.0 for e in built for r in e.rows for a in r["advantages"])
    batch = group_advantages(built)
    assert [_plain(r) for r in batch.rows] == [_plain(r) for r in whole.rows]
    with pytest.raises(ExportError, match="given twice"):
        group_advantages([built[0], built[0]])


def test_the_collector_copies_what_it_is_given() -> None:
    pm = new_plugin_manager()
    collector = EpisodeCollector()
    pm.register(collector)
    [(_, call)] = [e for e in agent_loop("e", 1) if e[0] == "model_call"]
    call.request["api_key"] = "sk-secret"
    pm.hook.agentcompact_log_model_call(call=call)
    call.messages.append({"role": "user", "content": "changed later"})
    [(_, kept)] = collector.episodes()[0].items
    assert kept.request["api_key"] == "[redacted]"  # as the recorder writes it
    assert len(kept.messages) == len(call.messages) - 1
