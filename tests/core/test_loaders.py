"""Tests of the trajectory loaders on the shared real data and on malformed files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentcompact import validate
from agentcompact.dialects import AnthropicDialect, OpenAIChatDialect
from agentcompact.errors import ConfigError, TornLineError, TrajectoryError
from agentcompact.trajectory import (
    Trajectory,
    detect_format,
    group_by_task,
    iter_trajectories,
    load,
    tau_bench_groups,
)
from tests.conftest import TRAJECTORIES, needs_shared_data

CLAUDE = TRAJECTORIES / "claude-code"
COMPACTED_SESSIONS = [
    "258c7280-ae70-4798-800f-63464d01a85d.jsonl",
    "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl",
    "fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl",
]
TAU = TRAJECTORIES / "tau-bench" / "historical_trajectories" / "gpt-4o-airline.json"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _jsonl(*records: Any) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _tool_ids(message: dict[str, Any], kind: str, key: str) -> list[str]:
    content = message["content"]
    if not isinstance(content, list):
        return []
    return [b[key] for b in content if isinstance(b, dict) and b.get("type") == kind]


def _texts(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content if b.get("type") == "text"]


def _assert_valid_anthropic(traj: Trajectory) -> None:
    messages = traj.messages
    assert messages[0]["role"] == "user"
    for index, message in enumerate(messages):
        assert set(message) == {"role", "content"}
        if index:
            assert message["role"] != messages[index - 1]["role"], (traj.source, index)
        uses = _tool_ids(message, "tool_use", "id") if message["role"] == "assistant" else []
        if uses and index + 1 < len(messages):
            answered = _tool_ids(messages[index + 1], "tool_result", "tool_use_id")
            assert set(uses) == set(answered), (traj.source, index)


def _unanswered_openai_calls(messages: list[dict[str, Any]]) -> int:
    """Tool messages must answer the latest assistant's calls; returns calls left open."""
    open_ids: set[str] = set()
    unanswered = 0
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_ids
            open_ids.discard(message["tool_call_id"])
            continue
        unanswered += len(open_ids)
        open_ids = {c["id"] for c in message.get("tool_calls", [])}
    return unanswered + len(open_ids)


@pytest.fixture(scope="module")
def shared_runs() -> list[Trajectory]:
    return list(iter_trajectories(TRAJECTORIES))


# --- every shared file -------------------------------------------------------------------


@needs_shared_data("trajectories")
def test_every_shared_file_loads_or_is_skipped_with_a_reason() -> None:
    skipped: dict[Path, str] = {}
    runs = list(iter_trajectories(TRAJECTORIES, on_skip=skipped.__setitem__))
    loaded = {Path(t.source.split("#")[0]) for t in runs}
    files = {p for p in TRAJECTORIES.rglob("*") if p.is_file()}
    assert loaded | set(skipped) == files
    assert not loaded & set(skipped)
    assert [p.relative_to(TRAJECTORIES).parts[0] for p in skipped] == ["openhands"]
    assert all("OpenHands" in reason for reason in skipped.values())
    assert Counter(t.format for t in runs) == {
        "claude_code": 14, "mini_swe_agent": 21, "swe_agent": 22, "tau_bench": 200,
    }


@needs_shared_data("trajectories")
def test_every_loaded_run_passes_the_dialect_validator(shared_runs: list[Trajectory]) -> None:
    dialects = {"anthropic": AnthropicDialect(), "openai_chat": OpenAIChatDialect()}
    for traj in shared_runs:
        # a run may end on a call never run (mini-swe-agent's submit): allow_pending
        validate(traj.messages, dialects[traj.dialect], allow_pending=True)
        validate(traj.final_context(), dialects[traj.dialect], allow_pending=True)


@needs_shared_data("trajectories")
@pytest.mark.parametrize(
    ("folder", "fmt"),
    [("claude-code", "claude_code"), ("mini-swe-agent-pr816-deepseek", "mini_swe_agent"),
     ("mini-swe-agent-main", "mini_swe_agent"), ("swe-agent", "swe_agent"),
     ("tau-bench", "tau_bench"), ("openhands", "openhands")],
)
def test_detect_format_by_folder(folder: str, fmt: str) -> None:
    files = [p for p in (TRAJECTORIES / folder).rglob("*") if p.is_file()]
    assert files
    assert {detect_format(p) for p in files} == {fmt}


@needs_shared_data("trajectories", "openhands")
def test_openhands_event_stream_is_refused_by_load() -> None:
    path = next((TRAJECTORIES / "openhands").rglob("*.json"))
    with pytest.raises(TrajectoryError, match="OpenHands event stream"):
        load(path)


# --- Claude Code --------------------------------------------------------------------------


@needs_shared_data("trajectories", "claude-code")
def test_claude_code_sessions_are_valid_anthropic_conversations(
    shared_runs: list[Trajectory],
) -> None:
    sessions = [t for t in shared_runs if t.format == "claude_code"]
    assert len(sessions) == 14
    for traj in sessions:
        assert traj.dialect == "anthropic" and traj.system is None
        _assert_valid_anthropic(traj)
        _assert_valid_anthropic(replace_messages(traj, traj.final_context()))


def replace_messages(traj: Trajectory, messages: list[dict[str, Any]]) -> Trajectory:
    return Trajectory(traj.source, traj.format, traj.dialect, messages)


@needs_shared_data("trajectories", "claude-code")
@pytest.mark.parametrize("name", [*COMPACTED_SESSIONS, "tool_heavy.jsonl", "subagent.jsonl"])
def test_claude_code_responses_are_merged_by_message_id(name: str) -> None:
    path = CLAUDE / name
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assistant_lines = [r for r in lines if r.get("type") == "assistant"]
    (traj,) = load(path)
    assistants = [m for m in traj.messages if m["role"] == "assistant"]
    assert len(assistants) == len({r["message"]["id"] for r in assistant_lines})
    blocks = sum(len(r["message"]["content"]) for r in assistant_lines)
    assert sum(len(m["content"]) for m in assistants) == blocks
    results = sum(len(_tool_ids(m, "tool_result", "tool_use_id")) for m in traj.messages)
    assert results == sum(len(_tool_ids(m, "tool_use", "id")) for m in assistants) > 0


@needs_shared_data("trajectories", "claude-code")
@pytest.mark.parametrize("name", COMPACTED_SESSIONS)
def test_claude_code_compact_boundary_is_recorded_with_its_summary(name: str) -> None:
    (traj,) = load(CLAUDE / name)
    (mark,) = traj.compactions
    assert mark.summary.startswith("This session is being continued from a previous conver")
    assert mark.trigger in {"auto", "manual"}
    assert mark.pre_tokens is not None and mark.pre_tokens > 100_000
    assert 0 < mark.index < len(traj.messages)
    assert all(mark.summary not in _texts(m) for m in traj.messages)
    final = traj.final_context()
    assert final[0]["role"] == "user"
    assert _texts(final[0])[0] == mark.summary
    assert final[-1] is traj.messages[-1]
    resumes_with_user = traj.messages[mark.index]["role"] == "user"
    assert len(final) == len(traj.messages) - mark.index + (not resumes_with_user)


@needs_shared_data("trajectories", "claude-code")
def test_claude_code_keeps_thinking_signatures_and_meta_lines() -> None:
    (traj,) = load(CLAUDE / "258c7280-ae70-4798-800f-63464d01a85d.jsonl")
    thinking = [b for m in traj.messages if m["role"] == "assistant" for b in m["content"]
                if b["type"] == "thinking"]
    assert thinking and all(b["signature"] for b in thinking)
    (heavy,) = load(CLAUDE / "tool_heavy.jsonl")
    assert "<local-command-caveat>" in json.dumps(heavy.messages)
    assert heavy.metadata["dropped_records"]["progress"] == 10


@needs_shared_data("trajectories", "claude-code")
def test_claude_code_subagent_transcripts_are_loaded() -> None:
    for path in CLAUDE.glob("*/subagents/agent-*.jsonl"):
        (traj,) = load(path)
        assert traj.metadata["is_sidechain"] is True
        assert traj.metadata["agent_id"] == path.stem.removeprefix("agent-")
        assert traj.messages[-1]["role"] == "assistant"


def test_claude_code_interleaved_parallel_tool_calls_merge(tmp_path: Path) -> None:
    def line(kind: str, content: Any, mid: str | None = None, **extra: Any) -> dict[str, Any]:
        message: dict[str, Any] = {"role": kind, "content": content}
        if mid:
            message |= {"id": mid, "model": "m", "usage": {}}
        return {"type": kind, "isSidechain": False, "message": message, **extra}

    def use(i: str) -> dict[str, Any]:
        return {"type": "tool_use", "id": i, "name": "Bash", "input": {}}

    def result(i: str) -> dict[str, Any]:
        return {"type": "tool_result", "tool_use_id": i, "content": "ok"}

    path = _write(tmp_path, "s.jsonl", _jsonl(
        line("user", "go"),
        {"type": "progress", "data": {}},
        line("assistant", [{"type": "text", "text": "two calls"}], "r1"),
        line("assistant", [use("a")], "r1"),
        line("user", [result("a")]),
        line("assistant", [use("b")], "r1"),
        line("user", "<system-reminder>hook</system-reminder>", isMeta=True),
        line("user", [result("b")]),
        line("assistant", [{"type": "text", "text": "done"}], "r2"),
    ))
    (traj,) = load(path)
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "user", "assistant"]
    assert [b["type"] for b in traj.messages[1]["content"]] == ["text", "tool_use", "tool_use"]
    assert [b["type"] for b in traj.messages[2]["content"]] == [
        "tool_result", "tool_result", "text"]


# --- tau-bench ---------------------------------------------------------------------------


@needs_shared_data("trajectories", "tau-bench")
def test_tau_bench_runs_rewards_and_groups() -> None:
    runs = load(TAU)
    assert len(runs) == 200
    assert {r.reward for r in runs} == {0.0, 1.0}
    assert runs[7].source == f"{TAU}#7"
    groups = tau_bench_groups(runs)
    assert len(groups) == 50
    assert all([r.sample_index for r in g] == [0, 1, 2, 3] for g in groups.values())
    assert all(r.task_id == key for key, g in groups.items() for r in g)
    for run in runs:
        assert run.dialect == "openai_chat" and run.messages[0]["role"] == "system"
        _unanswered_openai_calls(run.messages)


def test_group_by_task_ignores_runs_without_a_task() -> None:
    runs = [Trajectory("a", "openai_chat", "openai_chat", [], task_id=t, sample_index=i)
            for i, t in [(1, "x"), (0, "x"), (0, None)]]
    assert [r.sample_index for r in group_by_task(runs)["x"]] == [0, 1]
    assert list(group_by_task(runs)) == ["x"]
    assert tau_bench_groups(runs) == {}


# --- mini-swe-agent and SWE-agent ----------------------------------------------------------


@needs_shared_data("trajectories", "mini-swe-agent-pr816-deepseek")
def test_mini_swe_agent_exit_dropped_and_tool_pairs_intact(
    shared_runs: list[Trajectory],
) -> None:
    runs = [t for t in shared_runs if t.format == "mini_swe_agent" and t.task_id]
    assert len(runs) == 20
    for traj in runs:
        roles = {m["role"] for m in traj.messages}
        assert roles == {"system", "user", "assistant", "tool"}
        assert traj.metadata["exit"] is not None
        assert traj.metadata["exit_status"] in {"Submitted", "InternalServerError"}
        assert _unanswered_openai_calls(traj.messages) <= 2  # the final submit, a bad call
        for message in traj.messages:
            assert not {"extra", "provider_specific_fields", "function_call"} & set(message)
            assert all(set(c) == {"id", "type", "function"} for c in message.get("tool_calls", []))
    assert any("reasoning_content" in m for t in runs for m in t.messages)


@needs_shared_data("trajectories", "mini-swe-agent-main")
def test_mini_swe_agent_plain_message_list() -> None:
    (traj,) = load(next((TRAJECTORIES / "mini-swe-agent-main").rglob("*.traj.json")))
    assert traj.format == "mini_swe_agent" and traj.task_id is None
    assert all(set(m) == {"role", "content"} for m in traj.messages)


@needs_shared_data("trajectories", "swe-agent")
def test_swe_agent_history_keeps_wire_fields_only(shared_runs: list[Trajectory]) -> None:
    runs = [t for t in shared_runs if t.format == "swe_agent"]
    for traj in runs:
        assert traj.messages[0]["role"] == "system"
        assert _unanswered_openai_calls(traj.messages) == 0
        for message in traj.messages:
            assert set(message) <= {"role", "content", "tool_calls", "tool_call_id"}
    tools = [m for t in runs for m in t.messages if m["role"] == "tool"]
    assert tools and all(m["tool_call_id"] for m in tools)
    assert {t.task_id for t in runs} >= {"pydicom__pydicom-1458"}


# --- plain message files ------------------------------------------------------------------


def test_plain_dialects_are_detected(tmp_path: Path) -> None:
    anthropic = {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    openai = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    responses = [{"role": "user", "content": "hi"},
                 {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]
    cases = {"a.json": (anthropic, "anthropic"), "o.json": (openai, "openai_chat"),
             "r.json": (responses, "openai_responses")}
    for name, (doc, dialect) in cases.items():
        path = _write(tmp_path, name, json.dumps(doc))
        assert detect_format(path) == dialect
        (traj,) = load(path)
        assert (traj.format, traj.dialect) == (dialect, dialect)
    assert load(tmp_path / "a.json")[0].system == "be brief"


def test_plain_dialect_can_be_forced(tmp_path: Path) -> None:
    path = _write(tmp_path, "m.json", json.dumps([{"role": "user", "content": "hi"}]))
    assert load(path)[0].dialect == "openai_chat"
    assert load(path, dialect="anthropic")[0].dialect == "anthropic"
    with pytest.raises(ConfigError, match="unknown dialect"):
        load(path, dialect="gemini")


# --- malformed input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("bad.jsonl", '{"type": "user"}\n{oops\n{"type": "user"}\n', r"bad\.jsonl:2: not valid"),
        ("bad.json", '[{"role": "user", "content": "x"}', r"bad\.json: not valid JSON"),
        ("shape.json", '{"foo": 1}', r"shape\.json: unknown trajectory format"),
        ("empty.json", "[]", r"empty\.json: unknown trajectory format"),
        ("blank.jsonl", "\n\n", r"blank\.jsonl: empty file"),
        ("norole.json", '[{"content": "x"}]', r"norole\.json: message 0 has no 'role'"),
        ("norole.jsonl", _jsonl({"type": "user", "message": {"content": "x"}}),
         r"norole\.jsonl:1: message without a user/assistant role"),
        ("notype.jsonl", _jsonl({"type": "user", "message": {"role": "user", "content": "x"}},
                                {"uuid": "u"}), r"notype\.jsonl:2: not a Claude Code record"),
        ("nomsg.jsonl", _jsonl({"type": "file-history-snapshot"}), r"nomsg\.jsonl: no user"),
        ("mixed.json", json.dumps([{"role": "system", "content": "s"}, {
            "role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}]), "mix dialect"),
        ("tau.json", json.dumps([{"task_id": 1, "reward": 1, "trial": 0,
                                  "traj": [{"content": "x"}]}]), r"tau\.json#0: message 0"),
        ("swe.traj", json.dumps({"history": [{"content": "x"}]}), r"swe\.traj: message 0"),
        ("role.traj.json", json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
         "unknown role 'robot'"),
    ],
)
def test_malformed_files_raise_naming_the_file(
    tmp_path: Path, name: str, text: str, match: str
) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(TrajectoryError, match=match):
        load(path)


def test_torn_last_line_is_reported_as_such(tmp_path: Path) -> None:
    path = _write(tmp_path, "torn.jsonl", '{"type": "user"}\n{"type": "assi')
    with pytest.raises(TornLineError, match=r"torn\.jsonl:2"):
        load(path)


def test_fixed_dialect_formats_refuse_another_dialect(tmp_path: Path) -> None:
    path = _write(tmp_path, "x.traj", json.dumps({"history": [{"role": "user", "content": "x"}]}))
    with pytest.raises(TrajectoryError, match="swe_agent file holds openai_chat"):
        load(path, dialect="anthropic")


def test_iter_trajectories_strict_and_lenient(tmp_path: Path) -> None:
    _write(tmp_path, "good.json", json.dumps([{"role": "user", "content": "hi"}]))
    _write(tmp_path, "bad.json", "{")
    _write(tmp_path, "notes.txt", "not a candidate")
    with pytest.raises(TrajectoryError, match=r"bad\.json"):
        list(iter_trajectories(tmp_path))
    skipped: list[tuple[Path, str]] = []
    runs = list(iter_trajectories([tmp_path], strict=False,
                                  on_skip=lambda p, r: skipped.append((p, r))))
    assert [Path(t.source).name for t in runs] == ["good.json"]
    assert [p.name for p, _ in skipped] == ["bad.json"]
    with pytest.raises(TrajectoryError, match="no such file"):
        list(iter_trajectories(tmp_path / "missing"))


def test_claude_code_is_recognised_past_an_unknown_first_record(tmp_path: Path) -> None:
    user = {"type": "user", "sessionId": "s", "message": {"role": "user", "content": "hi"}}
    path = _write(tmp_path, "s.jsonl", _jsonl({"type": "custom-title", "title": "t"}, user))
    assert detect_format(path) == "claude_code"
    (traj,) = load(path)
    assert traj.messages == [{"role": "user", "content": "hi"}]
    assert traj.metadata["session_id"] == "s"
