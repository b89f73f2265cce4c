"""Codex CLI rollout files (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) as trajectories.

Two layouts are read:

* envelope lines ``{"timestamp", "type", "payload"}`` (Codex ≥ 0.4x): ``response_item``
  payloads are Responses API items (``message``, ``reasoning``, ``function_call``,
  ``function_call_output``, ``custom_tool_call``…), ``session_meta`` carries
  ``instructions``, ``turn_context`` the model, ``compacted`` marks where Codex compacted
  (its summary in ``payload.message``); ``event_msg`` lines (UI events) are skipped;
* older files: a first line with ``id`` and ``timestamp`` (the session), then the items
  themselves; ``record_type: "state"`` lines are skipped.

The items are kept as they are (dialect ``openai_responses``); item types the Responses
API does not accept as input (``ghost_snapshot`` and other client-side records) are left
out. Like Claude Code files, a rollout holds the whole uncompacted history, so a replay
sees every call as the agent made it before its own compaction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..errors import TrajectoryError
from ..trajectory._loaders import CompactionMark, Trajectory

__all__ = ["ITEM_TYPES", "is_codex_rollout", "load_codex_rollout"]

#: Responses input item types kept from a rollout
ITEM_TYPES = frozenset({
    "message", "reasoning", "function_call", "function_call_output", "custom_tool_call",
    "custom_tool_call_output", "local_shell_call", "local_shell_call_output",
    "web_search_call",
})
_ENVELOPES = frozenset({"session_meta", "response_item", "turn_context", "event_msg",
                        "compacted"})


def _records(path: Path) -> list[Any]:
    try:
        lines = path.read_bytes().splitlines()
        return [orjson.loads(line) for line in lines if line.strip()]
    except (OSError, orjson.JSONDecodeError) as exc:
        raise TrajectoryError(f"{path}: not a Codex rollout: {exc}") from exc


def is_codex_rollout(path: str | Path) -> bool:
    """True when the first line of ``path`` looks like a Codex rollout record."""
    p = Path(path)
    if p.suffix != ".jsonl":
        return False
    try:
        with p.open("rb") as f:
            first = orjson.loads(f.readline() or b"null")
    except (OSError, orjson.JSONDecodeError):
        return False
    if not isinstance(first, dict):
        return False
    if first.get("type") in _ENVELOPES and "payload" in first:
        return True
    return "id" in first and "timestamp" in first and "role" not in first


def load_codex_rollout(path: str | Path) -> Trajectory:
    """The session in a Codex rollout file."""
    p = Path(path)
    items: list[dict[str, Any]] = []
    marks: list[CompactionMark] = []
    meta: dict[str, Any] = {}
    models: list[str] = []
    for number, record in enumerate(_records(p), start=1):
        if not isinstance(record, dict):
            continue
        kind = record.get("type")
        payload = record.get("payload")
        if kind in _ENVELOPES and isinstance(payload, dict):
            if kind == "response_item" and payload.get("type", "message") in ITEM_TYPES:
                items.append(payload)
            elif kind == "session_meta":
                meta = payload
            elif kind == "turn_context" and payload.get("model"):
                models.append(str(payload["model"]))
            elif kind == "compacted":
                marks.append(CompactionMark(len(items), str(payload.get("message", "")),
                                            line=number))
        elif number == 1 and "id" in record and "timestamp" in record:
            meta = record
        elif record.get("record_type") is None and record.get("type", "message") in ITEM_TYPES:
            items.append(record)
    if not items:
        raise TrajectoryError(f"{p}: Codex rollout without response items")
    instructions = meta.get("instructions")
    return Trajectory(
        source=str(p), format="codex", dialect="openai_responses", messages=items,
        system=instructions if isinstance(instructions, str) and instructions else None,
        task_id=str(meta["id"]) if meta.get("id") else None, compactions=marks,
        metadata={"session_id": meta.get("id"), "cwd": meta.get("cwd"),
                  "cli_version": meta.get("cli_version"), "models": sorted(set(models))})
