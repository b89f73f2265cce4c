"""The trajectory recorder: an append-only, crash-safe event log of a run.

Register a ``Recorder`` with the plugin manager and every model call, summarizer call,
compaction and episode end reported through the RL logging hooks becomes one JSON line of
``run_dir/events.jsonl``::

    {"kind": "model_call", "data": {...ModelCall.to_dict()...}}

Crash safety: each line is written by a single ``os.write`` of the whole encoded line on a
file descriptor opened with ``O_APPEND``, under a lock, so concurrent threads never
interleave and a process killed at any instant leaves every earlier line intact and at
most the line being written cut short. ``agentcompact.trajectory.read_events``
reports such a torn last line instead of failing. There is no user-space buffer to flush;
``fsync=True`` additionally forces every line to stable storage (survives a power loss,
costs a disk round trip per event).

Resuming after a crash: when the log does not end with a newline (the killed writer's torn
line), the new recorder first writes a newline, so its ``run_start`` starts a line of its
own; the reader skips a torn line that a ``run_start`` follows.

Privacy: the folder is created ``0700`` and the log ``0600`` (an existing log is narrowed
to ``0600``); every event is passed through :func:`agentcompact._redact.redact` (secret-keyed
fields such as ``api_key``, ``authorization``, ``account_id`` are replaced) before it is
written.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from agentcompact import CompactionEvent, EpisodeEnd, ModelCall, SummaryCall, hookimpl, redact
from agentcompact.errors import TrajectoryError
from agentcompact.extending import new_id

__all__ = ["EVENTS_FILE", "EVENTS_FORMAT", "Recorder"]

#: name of the event log inside a run directory
EVENTS_FILE = "events.jsonl"
#: format tag written in the ``run_start`` line
EVENTS_FORMAT = "agentcompact-events/1"


def _private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) ``0700``; a folder this call created is
    narrowed to ``0700`` whatever the umask."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for created in missing:
        os.chmod(created, 0o700)


class Recorder:
    """Append every RL logging hook call to ``run_dir/events.jsonl``.

    :param run_dir: directory of the run (created if missing). An existing log is
        appended to (a resumed run adds a second ``run_start`` line).
    :param run_id: id of the run, written in the ``run_start`` line (random if omitted).
    :param fsync: ``os.fsync`` after every line (power-loss safety; slower).
    :param metadata: JSON-able values stored in the ``run_start`` line (model, sampling
        parameters, tokenizer, git commit...); the exporter copies them to its manifest.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        run_id: str | None = None,
        *,
        fsync: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        _private_dir(self.run_dir)
        self.path = self.run_dir / EVENTS_FILE
        self.run_id = run_id or new_id()
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = os.open(
            self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
            0o600,
        )
        os.fchmod(self._fd, 0o600)
        self._end_torn_line()
        self.write(
            "run_start",
            {
                "run_id": self.run_id,
                "format": EVENTS_FORMAT,
                "pid": os.getpid(),
                "started": time.time(),
                "metadata": dict(metadata or {}),
            },
        )

    # --- hooks -----------------------------------------------------------------------
    @hookimpl
    def agentcompact_log_model_call(self, call: ModelCall) -> None:
        self.write("model_call", call.to_dict())

    @hookimpl
    def agentcompact_log_summary_call(self, call: SummaryCall) -> None:
        self.write("summary_call", call.to_dict())

    @hookimpl
    def agentcompact_on_compaction(self, event: CompactionEvent) -> None:
        self.write("compaction", event.to_dict())

    @hookimpl
    def agentcompact_log_episode_end(self, episode: EpisodeEnd) -> None:
        self.write("episode_end", episode.to_dict())

    # --- writing ---------------------------------------------------------------------
    def _end_torn_line(self) -> None:
        """A log left by a killed writer may end inside a line: end it, so the next line
        (this run's ``run_start``) is whole."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            os.write(self._fd, b"\n")

    def write(self, kind: str, data: dict[str, Any]) -> None:
        """Append one ``{"kind", "data"}`` line atomically (one ``os.write``), redacted."""
        try:
            line = orjson.dumps({"kind": kind, "data": redact(data)}) + b"\n"
        except TypeError as exc:  # orjson names the type only, never the value
            raise TrajectoryError(
                f"{self.path}: cannot record {kind} event, a value is not JSON-able: {exc}"
            ) from None
        with self._lock:
            if self._fd is None:
                raise TrajectoryError(f"{self.path}: recorder is closed")
            view = memoryview(line)
            # A regular-file write is complete unless the disk is full or a signal lands;
            # finish a short write so the line is never left torn by a live process.
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        """Close the log; later hook calls raise ``TrajectoryError``."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Recorder({str(self.run_dir)!r}, run_id={self.run_id!r})"
