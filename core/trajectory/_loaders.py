"""Read agent runs from files into one value, :class:`Trajectory`.

Supported formats (``Trajectory.format``) and the dialect of their ``messages``:

========================  ===================  =============================================
format                    dialect              file
========================  ===================  =============================================
``claude_code``           ``anthropic``        Claude Code session ``*.jsonl``
``mini_swe_agent``        ``openai_chat``      mini-swe-agent ``*.traj.json``
``swe_agent``             ``openai_chat``      SWE-agent ``*.traj``
``tau_bench``             ``openai_chat``      tau-bench results ``*.json`` (one run per entry)
``openai_chat``,          itself               a plain ``*.json`` message list, or
``anthropic``,                                 ``{"messages": [...], "system": ...}``, or
``openai_responses``                           ``{"input": [...], "instructions": ...}``
========================  ===================  =============================================

Messages are kept as native dicts of their dialect; only keys that are not part of the wire
message are removed (Claude Code's line envelope, SWE-agent's ``thought``/``action``,
mini-swe-agent's ``extra``). Content blocks are never rewritten.

Decisions on ambiguous data:

* Claude Code: file order is the conversation order (the ``parentUuid`` links only fan out
  for the parallel tool calls of one response). ``progress``, ``system``,
  ``file-history-snapshot``, ``queue-operation`` and ``summary`` lines are dropped.
  ``isMeta`` user lines are *kept*: they are hidden in the UI but sent to the model (skill
  bodies, hook ``<system-reminder>`` text, the local-command caveat). ``isSidechain`` lines
  are dropped from a main session and kept in a subagent transcript (a file whose first
  message is a sidechain). Lines sharing ``message.id`` are one API response: their blocks
  are merged in order into one assistant message. Consecutive user lines are merged into one
  user message with its ``tool_result`` blocks first (the API requires them to lead).
* Claude Code compaction: ``messages`` is the whole uncompacted history; the summary user
  line (``isCompactSummary``) is left out and recorded in a :class:`CompactionMark` with the
  index where the post-compaction conversation resumes. :meth:`Trajectory.final_context`
  rebuilds what the model saw at the end (summary, then the rest).
* mini-swe-agent: the final ``role: exit`` item is dropped (its content goes to
  ``metadata["exit"]``); the unanswered submit tool call before it stays, as the model sent it.
* SWE-agent: ``history`` is stored before SWE-agent's history processors (which may elide
  old observations when sending); a single-id ``tool_call_ids`` becomes ``tool_call_id``.
  ``task_id`` is the file stem (SWE-agent names the file after the instance id).
* A plain list of text-only ``user``/``assistant`` messages is valid in both chat dialects
  and is read as ``openai_chat`` unless ``dialect=`` says otherwise.
* OpenHands event streams are recognised and skipped: they hold actions and observations,
  not the messages the model saw.
* ``reward`` comes from tau-bench ``reward`` or a SWE ``info["resolved"]`` when present.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Union

import orjson

from ..errors import ConfigError, TornLineError, TrajectoryError

__all__ = [
    "DIALECTS",
    "FORMATS",
    "UNSUPPORTED_FORMATS",
    "CompactionMark",
    "SkipHandler",
    "Trajectory",
    "detect_format",
    "group_by_task",
    "iter_trajectories",
    "load",
    "tau_bench_groups",
]

logger = logging.getLogger("agentcompact.trajectory")

PathArg = Union[str, "os.PathLike[str]"]
Message = dict[str, Any]
#: ``on_skip(path, reason)``: told about every file :func:`iter_trajectories` leaves out.
SkipHandler = Callable[[Path, str], None]

DIALECTS = ("anthropic", "openai_chat", "openai_responses")
FORMATS = ("claude_code", "mini_swe_agent", "swe_agent", "tau_bench", *DIALECTS)
#: formats that :func:`detect_format` recognises but :func:`load` cannot read, with why.
UNSUPPORTED_FORMATS = {
    "openhands": "OpenHands event stream (actions and observations, not the messages the "
    "model saw); the chat cannot be rebuilt from it",
}
_CANDIDATE_SUFFIXES = (".jsonl", ".json", ".traj")
_CC_TYPES = frozenset(
    {"user", "assistant", "system", "progress", "summary", "file-history-snapshot",
     "queue-operation", "attachment"}
)
_OPENAI_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_OPENAI_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content",
                "refusal", "function_call", "audio")
_ANTHROPIC_PARTS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking",
                              "image", "document", "server_tool_use"})
_RESPONSES_PARTS = frozenset({"input_text", "output_text", "input_image", "input_file"})
_OPENAI_PARTS = frozenset({"image_url", "input_audio"})


@dataclass(frozen=True, slots=True)
class CompactionMark:
    """Where the harness itself compacted the conversation (Claude Code ``compact_boundary``).

    ``messages[:index]`` of the trajectory were replaced by ``summary`` (a user message);
    the model then saw the summary followed by ``messages[index:]``. ``trigger`` is
    ``auto`` or ``manual``; ``pre_tokens`` the context size Claude Code reported before;
    ``line`` the 1-based JSONL line of the boundary.
    """

    index: int
    summary: str
    trigger: str | None = None
    pre_tokens: int | None = None
    line: int | None = None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One agent run: native messages of one dialect plus what the file says about the run.

    ``source`` is the file path, with ``#<n>`` for the n-th run of a multi-run file.
    ``system`` is set only when the format keeps the system prompt out of the messages.
    ``task_id`` groups runs of one task (GRPO group); ``sample_index`` is the trial.
    """

    source: str
    format: str
    dialect: str
    messages: list[Message]
    system: str | None = None
    reward: float | None = None
    task_id: str | None = None
    sample_index: int = 0
    compactions: list[CompactionMark] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def final_context(self) -> list[Message]:
        """The messages as the model saw them at the end of the run.

        Without compactions this is ``messages``; after one, the last summary as a user
        message followed by the messages that came after it.
        """
        if not self.compactions:
            return list(self.messages)
        mark = self.compactions[-1]
        rest = self.messages[mark.index :]
        summary: Message = {"role": "user", "content": mark.summary}
        if rest and rest[0].get("role") == "user":
            return [_merge_user(summary, rest[0]), *rest[1:]]
        return [summary, *rest]


# --- public API -----------------------------------------------------------------------


def detect_format(path: PathArg) -> str:
    """The format of the file at ``path``, found from its content (and name).

    Returns one of :data:`FORMATS` or of :data:`UNSUPPORTED_FORMATS`; raises
    ``TrajectoryError`` naming the file when the content is not a known trajectory.
    """
    p = Path(path)
    return _sniff(p, _read(p))


def load(path: PathArg, dialect: str | None = None) -> list[Trajectory]:
    """Every run in the file at ``path`` (tau-bench files hold many, others one).

    :param dialect: force the dialect of a plain message file; for the other formats it
        must match the format's own dialect.
    :raises TrajectoryError: the file is unreadable, malformed or of an unsupported format.
    """
    if dialect is not None and dialect not in DIALECTS:
        raise ConfigError(f"unknown dialect {dialect!r}; expected one of {DIALECTS}")
    p = Path(path)
    doc = _read(p)
    fmt = _sniff(p, doc)
    if fmt in UNSUPPORTED_FORMATS:
        raise _Unsupported(p, fmt)
    if fmt in DIALECTS:
        return [_load_plain(p, doc, dialect or fmt)]
    if dialect not in (None, _FIXED_DIALECT[fmt]):
        raise TrajectoryError(f"{p}: a {fmt} file holds {_FIXED_DIALECT[fmt]}, not {dialect}")
    return _LOADERS[fmt](p, doc)


def iter_trajectories(
    paths: PathArg | Iterable[PathArg],
    *,
    dialect: str | None = None,
    strict: bool = True,
    on_skip: SkipHandler | None = None,
) -> Iterator[Trajectory]:
    """Trajectories from files and folders (folders are walked recursively, sorted).

    In a folder, files ending ``.jsonl``, ``.json`` or ``.traj`` are read; named files are
    always read. Files of an unsupported format are skipped and reported to ``on_skip``
    (default: logged). A malformed file raises ``TrajectoryError``, or with
    ``strict=False`` is reported to ``on_skip`` as well.
    """
    report = on_skip or _log_skip
    for file in _expand(paths):
        try:
            runs = load(file, dialect=dialect)
        except _Unsupported as exc:
            report(file, exc.reason)
            continue
        except TrajectoryError as exc:
            if strict:
                raise
            report(file, str(exc))
            continue
        yield from runs


def group_by_task(trajectories: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    """Runs with a ``task_id`` grouped by it (a GRPO group), each sorted by ``sample_index``."""
    groups: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        if traj.task_id is not None:
            groups.setdefault(traj.task_id, []).append(traj)
    for runs in groups.values():
        runs.sort(key=lambda t: t.sample_index)
    return groups


def tau_bench_groups(trajectories: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    """The tau-bench runs among ``trajectories`` grouped by task: the trials of each task."""
    return group_by_task(t for t in trajectories if t.format == "tau_bench")


# --- reading and sniffing ------------------------------------------------------------


class _Unsupported(TrajectoryError):
    """The file is of a known format that cannot be read as messages."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.reason = f"{fmt}: {UNSUPPORTED_FORMATS[fmt]}"
        super().__init__(f"{path}: {self.reason}")


@dataclass(frozen=True, slots=True)
class _Lines:
    """A JSON Lines document: ``(line number, value)`` for each non-blank line."""

    records: list[tuple[int, Any]]


def _read(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TrajectoryError(f"{path}: cannot read: {exc}") from exc
    if path.suffix == ".jsonl":
        return _parse_lines(path, data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if _first_line_is_object(data):
            return _parse_lines(path, data)
        raise TrajectoryError(f"{path}: not valid JSON: {exc}") from exc


def _first_line_is_object(data: bytes) -> bool:
    first = data.lstrip().split(b"\n", 1)[0]
    try:
        return isinstance(orjson.loads(first), dict)
    except orjson.JSONDecodeError:
        return False


def _parse_lines(path: Path, data: bytes) -> _Lines:
    lines = data.split(b"\n")
    records: list[tuple[int, Any]] = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            records.append((number, orjson.loads(raw)))
        except orjson.JSONDecodeError as exc:
            torn = number == len(lines) and not data.endswith(b"\n")
            error = TornLineError if torn else TrajectoryError
            raise error(f"{path}:{number}: not valid JSON: {exc}") from exc
    if not records:
        raise TrajectoryError(f"{path}: empty file")
    return _Lines(records)


def _sniff(path: Path, doc: Any) -> str:
    if isinstance(doc, _Lines):
        return _sniff_lines(path, doc)
    if isinstance(doc, dict):
        return _sniff_object(path, doc)
    if isinstance(doc, list) and doc:
        return _sniff_list(path, doc)
    raise TrajectoryError(f"{path}: unknown trajectory format (top level is {_kind(doc)})")


def _sniff_lines(path: Path, doc: _Lines) -> str:
    number, first = doc.records[0]
    if any(_is_claude_code_record(record) for _, record in doc.records[:20]):
        return "claude_code"
    if isinstance(first, dict) and ("role" in first or "type" in first):
        return _guess_dialect(path, [value for _, value in doc.records], None)
    raise TrajectoryError(
        f"{path}:{number}: unknown JSON Lines format (neither a Claude Code record nor a "
        f"message: {_kind(first)})"
    )


def _is_claude_code_record(record: Any) -> bool:
    if not isinstance(record, dict) or "role" in record:
        return False
    return "sessionId" in record or record.get("type") in _CC_TYPES


def _sniff_object(path: Path, doc: dict[str, Any]) -> str:
    if isinstance(doc.get("history"), list):
        return "swe_agent"
    if isinstance(doc.get("messages"), list):
        if "trajectory_format" in doc or path.name.endswith(".traj.json"):
            return "mini_swe_agent"
        return _guess_dialect(path, doc["messages"], doc.get("system"))
    if isinstance(doc.get("input"), list):
        return "openai_responses"
    keys = ", ".join(sorted(doc)[:8])
    raise TrajectoryError(f"{path}: unknown trajectory format (an object with keys {keys})")


def _sniff_list(path: Path, doc: list[Any]) -> str:
    first = doc[0]
    if isinstance(first, dict) and "traj" in first and "task_id" in first:
        return "tau_bench"
    if isinstance(first, dict) and "source" in first and ("action" in first
                                                          or "observation" in first):
        return "openhands"
    if path.name.endswith(".traj.json"):
        return "mini_swe_agent"
    return _guess_dialect(path, doc, None)


def _guess_dialect(path: Path, items: list[Any], system: Any) -> str:
    roles, types, parts, tool_calls = set(), set(), set(), False
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not ("role" in item or "type" in item):
            raise TrajectoryError(_no_role(str(path), index, item))
        roles.add(item.get("role"))
        types.add(item.get("type"))
        parts |= _part_types(item.get("content"))
        tool_calls = tool_calls or bool(item.get("tool_calls"))
    found = []
    if types - {None, "message"} or parts & _RESPONSES_PARTS:
        found.append("openai_responses")
    if parts & _ANTHROPIC_PARTS or (system is not None and "system" not in roles):
        found.append("anthropic")
    if tool_calls or roles & {"system", "developer", "tool", "function"} or parts & _OPENAI_PARTS:
        found.append("openai_chat")
    if len(found) > 1:
        raise TrajectoryError(f"{path}: messages mix dialects ({', '.join(found)})")
    return found[0] if found else "openai_chat"


def _part_types(content: Any) -> set[str]:
    if not isinstance(content, list):
        return set()
    return {p["type"] for p in content if isinstance(p, dict) and isinstance(p.get("type"), str)}


def _obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (for optional sections)."""
    return value if isinstance(value, dict) else {}


def _no_role(where: str, index: int, message: Any) -> str:
    if isinstance(message, dict):
        return f"{where}: message {index} has no 'role'"
    return f"{where}: message {index} is {_kind(message)}, not an object"


def _kind(value: Any) -> str:
    return "an empty list" if value == [] else f"a {type(value).__name__}"


def _expand(paths: PathArg | Iterable[PathArg]) -> Iterator[Path]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    for item in items:
        path = Path(item)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if _is_candidate(p))
        elif path.exists():
            yield path
        else:
            raise TrajectoryError(f"{path}: no such file or folder")


def _is_candidate(path: Path) -> bool:
    return path.is_file() and path.name.endswith(_CANDIDATE_SUFFIXES)


def _log_skip(path: Path, reason: str) -> None:
    logger.warning("skipped %s: %s", path, reason)


# --- Claude Code ---------------------------------------------------------------------


class _ClaudeCodeSession:
    """Folds the records of one Claude Code session file into Anthropic messages."""

    def __init__(self, path: Path, sidechain: bool) -> None:
        self.path = path
        self.sidechain = sidechain
        self.messages: list[Message] = []
        self.compactions: list[CompactionMark] = []
        self.pending: CompactionMark | None = None
        self.open_id: str | None = None
        self.open_index = -1
        self.models: dict[str, None] = {}
        self.dropped: dict[str, int] = {}

    def feed(self, number: int, record: Any) -> None:
        kind = record.get("type") if isinstance(record, dict) else None
        if not isinstance(kind, str):
            raise TrajectoryError(f"{self.path}:{number}: not a Claude Code record (no 'type')")
        if kind == "system" and record.get("subtype") == "compact_boundary":
            self._boundary(number, record)
        elif kind not in ("user", "assistant") or bool(record.get("isSidechain")) != (
            self.sidechain
        ):
            self.dropped[kind] = self.dropped.get(kind, 0) + 1
        elif record.get("isCompactSummary"):
            self._summary(number, _cc_message(self.path, number, record))
        elif kind == "assistant":
            self._assistant(_cc_message(self.path, number, record))
        else:
            self._user(_cc_message(self.path, number, record))

    def _assistant(self, message: Message) -> None:
        blocks = _blocks(message["content"])
        model = message.get("model")
        if isinstance(model, str):
            self.models[model] = None
        mid = message.get("id")
        if mid is not None and mid == self.open_id:
            self.messages[self.open_index]["content"].extend(blocks)
            return
        if self.messages and self.messages[-1]["role"] == "assistant":
            # a second response with no user line between: one turn keeps roles alternating
            self.messages[-1]["content"].extend(blocks)
        else:
            self.messages.append({"role": "assistant", "content": blocks})
        self.open_id, self.open_index = mid, len(self.messages) - 1

    def _user(self, message: Message) -> None:
        clean = {"role": "user", "content": message["content"]}
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages[-1] = _merge_user(self.messages[-1], clean)
        else:
            self.messages.append(clean)

    def _boundary(self, number: int, record: dict[str, Any]) -> None:
        meta = record.get("compactMetadata") or {}
        self._flush_pending()
        self.pending = CompactionMark(
            index=len(self.messages),
            summary="",
            trigger=meta.get("trigger"),
            pre_tokens=meta.get("preTokens"),
            line=number,
        )
        self.open_id = None

    def _summary(self, number: int, message: Message) -> None:
        mark = self.pending or CompactionMark(index=len(self.messages), summary="", line=number)
        self.compactions.append(replace(mark, summary=_text_of(message["content"])))
        self.pending = None

    def _flush_pending(self) -> None:
        if self.pending is not None:
            self.compactions.append(self.pending)
            self.pending = None

    def trajectory(self, first: dict[str, Any]) -> Trajectory:
        self._flush_pending()
        if not self.messages:
            raise TrajectoryError(f"{self.path}: no user or assistant messages")
        metadata = {
            "session_id": first.get("sessionId"),
            "agent_id": first.get("agentId"),
            "cwd": first.get("cwd"),
            "git_branch": first.get("gitBranch"),
            "version": first.get("version"),
            "is_sidechain": self.sidechain,
            "models": list(self.models),
            "dropped_records": dict(self.dropped),
        }
        return Trajectory(
            source=str(self.path),
            format="claude_code",
            dialect="anthropic",
            messages=self.messages,
            compactions=self.compactions,
            metadata=metadata,
        )


def _load_claude_code(path: Path, doc: Any) -> list[Trajectory]:
    records = doc.records
    first = _first_message_record(records)
    session = _ClaudeCodeSession(path, sidechain=bool(first.get("isSidechain")))
    for number, record in records:
        session.feed(number, record)
    return [session.trajectory(first)]


def _first_message_record(records: list[tuple[int, Any]]) -> dict[str, Any]:
    for _, record in records:
        if isinstance(record, dict) and record.get("type") in ("user", "assistant"):
            return record
    return {}


def _cc_message(path: Path, number: int, record: dict[str, Any]) -> Message:
    message = record.get("message")
    where = f"{path}:{number}"
    if not isinstance(message, dict):
        raise TrajectoryError(f"{where}: {record['type']} record has no 'message' object")
    if message.get("role") not in ("user", "assistant"):
        raise TrajectoryError(f"{where}: message without a user/assistant role")
    if not isinstance(message.get("content"), (str, list)):
        raise TrajectoryError(f"{where}: message content is neither text nor a block list")
    return message


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


def _merge_user(first: Message, second: Message) -> Message:
    blocks = _blocks(first["content"]) + _blocks(second["content"])
    results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
    others = [b for b in blocks if not (isinstance(b, dict) and b.get("type") == "tool_result")]
    return {"role": "user", "content": results + others}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"]
    return "\n".join(texts)


# --- OpenAI chat formats: mini-swe-agent, SWE-agent, tau-bench -------------------------


def _openai_messages(where: str, raw: Any, drop_roles: frozenset[str] = frozenset()) -> list[
    Message
]:
    if not isinstance(raw, list):
        raise TrajectoryError(f"{where}: messages are {_kind(raw)}, not a list")
    out = []
    for index, message in enumerate(raw):
        role = message.get("role") if isinstance(message, dict) else None
        if role in drop_roles:
            continue
        if not isinstance(role, str):
            raise TrajectoryError(_no_role(where, index, message))
        if role not in _OPENAI_ROLES:
            raise TrajectoryError(f"{where}: message {index} has unknown role {role!r}")
        out.append(_openai_message(message))
    return out


def _openai_message(message: dict[str, Any]) -> Message:
    out = {k: message[k] for k in _OPENAI_KEYS if message.get(k) is not None}
    if "content" in message and "content" not in out:
        out["content"] = None
    calls = out.get("tool_calls")
    if calls == []:
        del out["tool_calls"]
    elif isinstance(calls, list):
        out["tool_calls"] = [_tool_call(c) for c in calls]
    return {"role": out.pop("role"), **out}


def _tool_call(call: Any) -> Any:
    """A tool call without stream artefacts such as ``index``."""
    if not isinstance(call, dict):
        return call
    return {k: call[k] for k in ("id", "type", "function") if k in call}


def _swe_reward(info: dict[str, Any]) -> float | None:
    resolved = info.get("resolved")
    return None if resolved is None else float(bool(resolved))


def _load_mini_swe_agent(path: Path, doc: Any) -> list[Trajectory]:
    raw = doc if isinstance(doc, list) else doc.get("messages")
    top = _obj(doc)
    messages = _openai_messages(str(path), raw, frozenset({"exit"}))
    info = _obj(top.get("info"))
    exits = [m for m in raw if isinstance(m, dict) and m.get("role") == "exit"]
    metadata = {
        "trajectory_format": top.get("trajectory_format"),
        "mini_version": info.get("mini_version"),
        "model": _obj(_obj(info.get("config")).get("model")).get("model_name"),
        "exit_status": info.get("exit_status"),
        "submission": info.get("submission"),
        "exit": exits[-1].get("content") if exits else None,
    }
    return [_openai_trajectory(path, "mini_swe_agent", messages, top.get("instance_id"),
                               _swe_reward(info), metadata)]


def _load_swe_agent(path: Path, doc: dict[str, Any]) -> list[Trajectory]:
    history = doc["history"]
    agent = history[0].get("agent") if history and isinstance(history[0], dict) else None
    raw = [m for m in history if not isinstance(m, dict) or m.get("agent", agent) == agent]
    messages = _openai_messages(str(path), raw)
    info = _obj(doc.get("info"))
    metadata = {
        "agent": agent,
        "environment": doc.get("environment"),
        "exit_status": info.get("exit_status"),
        "submission": info.get("submission"),
        "demo_indices": [i for i, m in enumerate(raw) if m.get("is_demo")],
        "other_agent_messages": len(history) - len(raw),
    }
    task_id = path.name.removesuffix(".traj")
    return [_openai_trajectory(path, "swe_agent", messages, task_id, _swe_reward(info),
                               metadata, raw)]


def _openai_trajectory(
    path: Path,
    fmt: str,
    messages: list[Message],
    task_id: Any,
    reward: float | None,
    metadata: dict[str, Any],
    raw: list[Any] | None = None,
) -> Trajectory:
    if raw is not None:
        _attach_tool_call_ids(path, raw, messages)
    if not messages:
        raise TrajectoryError(f"{path}: no messages")
    return Trajectory(
        source=str(path),
        format=fmt,
        dialect="openai_chat",
        messages=messages,
        reward=reward,
        task_id=None if task_id is None else str(task_id),
        metadata=metadata,
    )


def _attach_tool_call_ids(path: Path, raw: list[Any], messages: list[Message]) -> None:
    """SWE-agent writes ``tool_call_ids`` (a list) on tool messages; the wire wants one id."""
    for index, (source, message) in enumerate(zip(raw, messages, strict=True)):
        ids = source.get("tool_call_ids")
        if message["role"] != "tool" or "tool_call_id" in message or not ids:
            continue
        if len(ids) != 1:
            raise TrajectoryError(f"{path}: message {index} answers {len(ids)} tool calls")
        message["tool_call_id"] = ids[0]


def _load_tau_bench(path: Path, doc: list[Any]) -> list[Trajectory]:
    return [_tau_run(path, index, run) for index, run in enumerate(doc)]


def _tau_run(path: Path, index: int, run: Any) -> Trajectory:
    source = f"{path}#{index}"
    if not isinstance(run, dict) or "traj" not in run:
        raise TrajectoryError(f"{source}: not a tau-bench run ({_kind(run)} without 'traj')")
    reward = run.get("reward")
    if reward is not None and not isinstance(reward, (int, float)):
        raise TrajectoryError(f"{source}: reward {reward!r} is not a number")
    return Trajectory(
        source=source,
        format="tau_bench",
        dialect="openai_chat",
        messages=_openai_messages(source, run["traj"]),
        reward=None if reward is None else float(reward),
        task_id=None if run.get("task_id") is None else str(run["task_id"]),
        sample_index=int(run.get("trial") or 0),
        metadata={"info": run.get("info")},
    )


# --- plain message files -------------------------------------------------------------


def _load_plain(path: Path, doc: Any, dialect: str) -> Trajectory:
    raw, system = _plain_parts(path, doc)
    if dialect == "openai_chat":
        messages = _openai_messages(str(path), raw)
    else:
        messages = [_plain_message(path, i, m, dialect) for i, m in enumerate(raw)]
    if not messages:
        raise TrajectoryError(f"{path}: no messages")
    return Trajectory(source=str(path), format=dialect, dialect=dialect, messages=messages,
                      system=system)


def _plain_parts(path: Path, doc: Any) -> tuple[list[Any], str | None]:
    if isinstance(doc, _Lines):
        return [value for _, value in doc.records], None
    if isinstance(doc, list):
        return doc, None
    raw = doc.get("messages", doc.get("input"))
    system = doc.get("system", doc.get("instructions"))
    if not isinstance(raw, list):
        raise TrajectoryError(f"{path}: 'messages' is {_kind(raw)}, not a list")
    if system is not None and not isinstance(system, (str, list)):
        raise TrajectoryError(f"{path}: 'system' is {_kind(system)}, not text")
    return raw, None if system is None else _text_of(system)


def _plain_message(path: Path, index: int, message: Any, dialect: str) -> Message:
    if not isinstance(message, dict):
        raise TrajectoryError(f"{path}: message {index} is {_kind(message)}, not an object")
    if dialect == "openai_responses":
        if "role" not in message and "type" not in message:
            raise TrajectoryError(f"{path}: item {index} has neither 'role' nor 'type'")
        return message
    if message.get("role") not in ("user", "assistant"):
        raise TrajectoryError(
            f"{path}: message {index} has role {message.get('role')!r}; anthropic messages "
            "are 'user' or 'assistant'"
        )
    return {"role": message["role"], "content": message.get("content")}


_FIXED_DIALECT = {
    "claude_code": "anthropic",
    "mini_swe_agent": "openai_chat",
    "swe_agent": "openai_chat",
    "tau_bench": "openai_chat",
}
_LOADERS: dict[str, Callable[[Path, Any], list[Trajectory]]] = {
    "claude_code": _load_claude_code,
    "mini_swe_agent": _load_mini_swe_agent,
    "swe_agent": _load_swe_agent,
    "tau_bench": _load_tau_bench,
}
