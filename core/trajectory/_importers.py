"""Existing trajectory files (Claude Code, SWE-agent, mini-swe-agent, tau-bench, plain
message lists) as recorder event logs, so they export like a recorded run.

Each assistant message becomes one ``model_call`` whose context is every message the model
saw before it and whose response is that message. A Claude Code ``compact_boundary`` becomes
a ``compaction`` event; the calls after it see the summary (a user message) followed by the
later messages, so the exporter starts a new segment there. The file's reward, task id and
trial become the ``episode_end`` (``group_id`` = task id, ``sample_index`` = trial).

Claude Code writes the summarizer run of each compaction as a subagent transcript
(``subagents/agent-acompact-*.jsonl``: the summary request and the summary Claude wrote).
When its session is imported too, that transcript is not an episode of its own: it becomes
a ``summary_call`` of the session's compaction, whose prompt is what the summarizer saw —
the session's context at the compaction followed by the transcript's own messages — and
whose output is the summary. It is trained (a segment of its own, in that context) when
the export is asked to (``--summary-trained``), since Claude Code's summarizer is the
session's own model; otherwise it is recorded and left out of the loss.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from .._events import CompactionEvent, EpisodeEnd, ModelCall, SummaryCall
from ._loaders import Trajectory, iter_trajectories
from ._tokenize import to_chat_messages

__all__ = ["import_trajectories", "is_event_log", "stop_reason", "trajectory_events"]


def is_event_log(path: str | os.PathLike[str]) -> bool:
    """True for a run directory holding ``events.jsonl`` or a file whose first line is a
    recorder event (``{"kind": ..., "data": {...}}``)."""
    p = Path(path)
    if p.is_dir():
        return (p / "events.jsonl").is_file()
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        first = f.readline()
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and set(obj) == {"kind", "data"}


def _context(traj: Trajectory, index: int) -> tuple[list[Any], int]:
    """The messages the model saw before ``messages[index]``, and which compaction (count of
    compactions in force) they follow."""
    marks = [m for m in traj.compactions if m.index <= index]
    if not marks:
        return list(traj.messages[:index]), 0
    mark = marks[-1]
    rest = traj.messages[mark.index : index]
    view = Trajectory(traj.source, traj.format, traj.dialect, [*traj.messages[: mark.index],
                      *rest], compactions=[mark])
    return view.final_context(), len(marks)


def _request(traj: Trajectory) -> dict[str, Any]:
    return {"system": traj.system} if traj.system else {}


def stop_reason(traj: Trajectory) -> str:
    """The episode's stop reason from what its file says (``metadata["exit_status"]`` of
    SWE-agent / mini-swe-agent): ``submitted`` (or nothing said) → ``complete``; a status
    naming a context limit → ``context_length``; a step, turn or cost limit → ``max_turns``;
    a timeout → ``timeout``; any other status (``InternalServerError``, ``FormatError``,
    exceptions...) → ``error``, which the exporter masks by default."""
    status = traj.metadata.get("exit_status")
    if not isinstance(status, str) or not status.strip():
        return "complete"
    s = status.strip().lower().replace("_", "").replace(" ", "")
    if s in ("submitted", "completed", "complete", "success", "done", "finished"):
        return "complete"
    if "context" in s:
        return "context_length"
    if "timeout" in s or "timedout" in s:
        return "timeout"
    if "limit" in s or "maxsteps" in s or "maxturns" in s:
        return "max_turns"
    return "error"


def _is_compaction_summarizer(traj: Trajectory) -> bool:
    agent = traj.metadata.get("agent_id")
    return traj.format == "claude_code" and isinstance(agent, str) and agent.startswith(
        "acompact")


def _summary_of(traj: Trajectory, index: int, summarizer: Trajectory) -> dict[str, Any]:
    """The ``summary_call`` of the compaction at ``messages[index]`` of ``traj`` written by
    the ``summarizer`` transcript (its last assistant message is the summary)."""
    from .._pluginmanager import get_dialect

    dialect = get_dialect(traj.dialect)
    context, _ = _context(traj, index)
    asked = summarizer.messages
    last = max((i for i, m in enumerate(asked) if m.get("role") == "assistant"), default=None)
    answer = asked[last] if last is not None else {"content": ""}
    prompt = to_chat_messages([*context, *asked[:last]], dialect, traj.system)
    output = "".join(p.text for p in dialect.parts(answer) if p.kind == "text")
    return SummaryCall(
        episode_id=traj.source, strategy="claude_code_compact", prompt=prompt,
        output=output.strip(), model=(summarizer.metadata.get("models") or [None])[0],
        trained=False, call_id=f"{summarizer.source}@summary",
    ).to_dict()


def trajectory_events(
    traj: Trajectory, summarizers: list[Trajectory] | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(kind, data)`` events of one trajectory, in the order a recorder would log them.

    :param summarizers: Claude Code compaction transcripts of this session, in the order of
        its compactions (each becomes the ``summary_call`` of one).
    """
    episode = traj.source
    summarizers = list(summarizers or [])
    group = str(traj.task_id) if traj.task_id is not None else episode
    model = (traj.metadata.get("models") or [None])[0]
    in_force = 0
    for i, message in enumerate(traj.messages):
        if message.get("role") != "assistant":
            continue
        context, marks = _context(traj, i)
        while in_force < marks:
            mark = traj.compactions[in_force]
            in_force += 1
            if in_force <= len(summarizers):
                yield "summary_call", _summary_of(traj, mark.index, summarizers[in_force - 1])
            yield "compaction", CompactionEvent(
                strategy=traj.format, dialect=traj.dialect, tokens_before=mark.pre_tokens or 0,
                tokens_after=0, messages_before=mark.index, messages_after=1, head_len=0,
                cut=mark.index, reason="forced" if mark.trigger == "manual" else "trigger",
                episode_id=episode,
            ).to_dict()
        yield "model_call", ModelCall(
            episode_id=episode, dialect=traj.dialect, messages=context, response=[message],
            request=_request(traj), model=model if isinstance(model, str) else None,
            call_id=f"{episode}@{i}", group_id=group, compacted=marks > 0,
        ).to_dict()
    yield "episode_end", EpisodeEnd(
        episode_id=episode, reward=traj.reward, stop_reason=stop_reason(traj), group_id=group,
        sample_index=traj.sample_index,
        metadata={"source": traj.source, "format": traj.format,
                  "reward_in_file": traj.reward is not None,
                  "exit_status": traj.metadata.get("exit_status")},
    ).to_dict()


def import_trajectories(
    sources: Iterable[str | os.PathLike[str]], events_path: str | os.PathLike[str]
) -> int:
    """Convert every trajectory under ``paths`` into one event log; returns how many runs.

    Runs without a reward in their file get ``reward: null`` (the exporter masks them).
    """
    paths = [str(p) for p in sources]
    trajectories = list(iter_trajectories(paths))
    sessions = {t.metadata.get("session_id"): t for t in trajectories
                if t.format == "claude_code" and not t.metadata.get("is_sidechain")}
    attached: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        parent = sessions.get(t.metadata.get("session_id"))
        if _is_compaction_summarizer(t) and parent is not None and parent.compactions:
            attached.setdefault(parent.source, []).append(t)
    used = {id(t) for group in attached.values() for t in group}
    count = 0
    with open(events_path, "ab") as out:
        start = {"run_id": "imported", "format": "agentcompact-events/1",
                 "metadata": {"imported_from": paths,
                              "compaction_summaries_attached": len(used)}}
        out.write(orjson.dumps({"kind": "run_start", "data": start}) + b"\n")
        for traj in trajectories:
            if id(traj) in used:
                continue
            for kind, data in trajectory_events(traj, sorted(attached.get(traj.source, []),
                                                             key=lambda t: t.source)):
                out.write(orjson.dumps({"kind": kind, "data": data}) + b"\n")
            count += 1
    return count
