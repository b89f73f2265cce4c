"""Helpers that build recorded runs for the trajectory tests (real Recorder, real events)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentcompact import CompactionEvent, EpisodeEnd, ModelCall, SummaryCall, new_plugin_manager
from agentcompact.plugins.recorder import Recorder

__all__ = ["Recorder", "agent_loop", "assistant", "record", "tool", "user"]

SYSTEM = {"role": "system", "content": "You are a careful coding agent."}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, call: str | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if call:
        msg["tool_calls"] = [{"id": call, "type": "function",
                              "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]
    return msg


def tool(call: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call, "content": text}


def agent_loop(episode: str, turns: int, *, compact_at: int | None = None,
               trained_summary: bool = False, group: str = "task-0",
               ) -> list[tuple[str, Any]]:
    """Events of one OpenAI-chat episode: a tool loop of ``turns`` calls, optionally
    compacted (history replaced by a summary) before call ``compact_at``."""
    history: list[dict[str, Any]] = [SYSTEM, user(f"Fix bug {episode}.")]
    events: list[tuple[str, Any]] = []
    for t in range(turns):
        if compact_at is not None and t == compact_at:
            summary = f"Summary: explored {t} files for {episode}."
            events.append(("summary_call", SummaryCall(
                episode_id=episode, strategy="summary",
                prompt=[{"role": "system", "content": "Summarize."},
                        {"role": "user", "content": "Summarize the work so far."}],
                output=summary, trained=trained_summary)))
            events.append(("compaction", CompactionEvent(
                strategy="summary", dialect="openai_chat", tokens_before=900,
                tokens_after=100, messages_before=len(history), messages_after=3,
                head_len=2, cut=len(history) - 1, episode_id=episode)))
            history = [SYSTEM, user(f"Fix bug {episode}."), user(summary)]
        last = t == turns - 1
        response = assistant(f"Done with {episode}." if last else f"Step {t}: listing.",
                             None if last else f"c{t}")
        events.append(("model_call", ModelCall(
            episode_id=episode, dialect="openai_chat", messages=list(history),
            response=[response], group_id=group, request={"temperature": 1.0})))
        history = [*history, response]
        if not last:
            history.append(tool(f"c{t}", f"file_{t}.py\nREADME.md"))
    return events


def record(run_dir: Path, episodes: list[list[tuple[str, Any]]],
           ends: list[EpisodeEnd]) -> Path:
    """Write events through a real Recorder registered on a fresh plugin manager;
    returns the events.jsonl path."""
    pm = new_plugin_manager()
    rec = Recorder(run_dir)
    pm.register(rec)
    try:
        for events, end in zip(episodes, ends, strict=True):
            for kind, value in events:
                if kind == "model_call":
                    pm.hook.agentcompact_log_model_call(call=value)
                elif kind == "summary_call":
                    pm.hook.agentcompact_log_summary_call(call=value)
                else:
                    pm.hook.agentcompact_on_compaction(event=value)
            pm.hook.agentcompact_log_episode_end(episode=end)
    finally:
        rec.close()
    return run_dir / "events.jsonl"
