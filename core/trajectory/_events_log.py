"""Reading a recorder event log (``events.jsonl``) back.

Each line is ``{"kind": ..., "data": {...}}`` (see ``agentcompact.plugins.recorder``).
A process killed while writing leaves its last line cut short: that *torn tail* is
reported (``EventLog.torn_tail``, and a ``logging`` warning) and every complete line before
it is returned. A resumed run starts with a ``run_start`` line on a line of its own (the
recorder ends the torn line first), so a malformed line directly followed by a
``run_start`` is a torn line of the killed run too (``EventLog.torn_lines``). A malformed
line anywhere else is corruption, not a crash, and raises ``TrajectoryError`` naming the
file and the 1-based line number. No message names the line's content.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ..errors import TornLineError, TrajectoryError

__all__ = [
    "EVENT_KINDS",
    "Event",
    "EventLog",
    "EventReader",
    "TornTail",
    "read_event_at",
    "read_events",
    "resolve_events_path",
]

logger = logging.getLogger(__name__)

#: the kinds the recorder writes; other kinds are kept (forward compatibility) and ignored
EVENT_KINDS = frozenset({"run_start", "model_call", "summary_call", "compaction", "episode_end"})


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the log: its kind, payload, 1-based line number and byte span."""

    kind: str
    data: dict[str, Any]
    line: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class TornTail:
    """A line cut by a crash: where it is (``head`` is empty in what the reader reports:
    the content of a log line is never repeated in a message)."""

    line: int
    offset: int
    length: int
    head: bytes

    def describe(self, path: Path) -> str:
        return (
            f"{path}:{self.line}: torn line ({self.length} bytes at offset "
            f"{self.offset}) ignored: the writer was killed"
        )


@dataclass
class EventLog:
    """All complete events of a log, in file order, and the torn tail if any."""

    path: Path
    events: list[Event] = field(default_factory=list)
    torn_tail: TornTail | None = None
    #: torn lines of killed runs that a resumed run followed (not the last line)
    torn_lines: list[TornTail] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)


def resolve_events_path(path: str | os.PathLike[str]) -> Path:
    """``path`` itself when it is a file, ``path/events.jsonl`` for a run directory."""
    p = Path(path)
    if p.is_dir():
        p = p / "events.jsonl"
    if not p.is_file():
        raise TrajectoryError(f"{p}: no event log here")
    return p


def _parse(raw: bytes, path: Path, line: int) -> tuple[str, dict[str, Any]]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # its message may quote the line: not repeated
        raise TrajectoryError(f"{path}:{line}: not a JSON line (error at column "
                              f"{exc.colno})") from None
    if not isinstance(obj, dict):
        raise TrajectoryError(f"{path}:{line}: expected an object, got {type(obj).__name__}")
    kind, data = obj.get("kind"), obj.get("data")
    if not isinstance(kind, str) or not isinstance(data, dict):
        raise TrajectoryError(f'{path}:{line}: expected {{"kind": str, "data": object}}')
    return kind, data


class EventReader:
    """Stream the events of a log; ``torn_tail`` is set once iteration has finished.

    :param path: an ``events.jsonl`` file or a run directory holding one.
    :param kinds: only yield events of these kinds (others are still checked for shape).
    """

    def __init__(self, path: str | os.PathLike[str], kinds: frozenset[str] | None = None):
        self.path = resolve_events_path(path)
        self.kinds = kinds
        self.torn_tail: TornTail | None = None
        self.torn_lines: list[TornTail] = []

    def __iter__(self) -> Iterator[Event]:
        offset = 0
        bad: TornTail | None = None  # a malformed line: the torn tail if nothing follows
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                start, offset = offset, offset + len(raw)
                body = raw.rstrip(b"\r\n")
                if raw.endswith(b"\n") and not body.strip(b" \t"):
                    continue  # blank line
                try:
                    kind, data = _parse(body, self.path, number)
                except TrajectoryError:
                    if bad is not None:  # two malformed lines in a row: corruption
                        _parse(bad.head, self.path, bad.line)
                    bad = TornTail(number, start, len(raw), body)
                    continue
                if bad is not None:
                    if kind != "run_start":  # a malformed line inside a run: corruption
                        _parse(bad.head, self.path, bad.line)
                    self.torn_lines.append(TornTail(bad.line, bad.offset, bad.length, b""))
                    logger.warning("%s", self.torn_lines[-1].describe(self.path))
                    bad = None
                if self.kinds is None or kind in self.kinds:
                    yield Event(kind, data, number, start, len(raw))
        if bad is not None:
            self.torn_tail = TornTail(bad.line, bad.offset, bad.length, b"")
            logger.warning("%s", self.torn_tail.describe(self.path))


def read_events(path: str | os.PathLike[str], *, strict: bool = False) -> EventLog:
    """Read a whole event log.

    :param path: an ``events.jsonl`` file or a run directory.
    :param strict: raise ``TornLineError`` on a torn last line instead of reporting it.
    :returns: the ``EventLog``; ``torn_tail`` is set when the last line was cut.
    """
    reader = EventReader(path)
    log = EventLog(reader.path, list(reader))
    log.torn_tail, log.torn_lines = reader.torn_tail, reader.torn_lines
    if strict and log.torn_tail is not None:
        raise TornLineError(log.torn_tail.describe(log.path))
    return log


def read_event_at(f: BinaryIO, path: Path, offset: int, length: int, line: int) -> Event:
    """Read back the event at a byte span found by an earlier ``EventReader`` pass."""
    f.seek(offset)
    raw = f.read(length)
    kind, data = _parse(raw.rstrip(b"\r\n"), path, line)
    return Event(kind, data, line, offset, length)
