"""Writing an export's files: the ``Writer`` seam and the local ``ExportWriter``.

``export_runs`` hands every kept episode to a :class:`Writer` in export order —
``add(rows, episode)`` per episode, ``end_group()`` after the last episode of each group,
``close()`` once — and puts what ``written()`` returns into the manifest's ``files``. Its
runner may supply the writer (a ``writer(out, opts)`` method: ``ray_export`` has Ray tasks
write the shards); otherwise :class:`ExportWriter` writes them in this process. Any writer
must give the same files for the same calls: shards cut only at a group boundary once they
hold ``rows_per_shard`` rows, named ``segments-NNNNN.<fmt>``, and the episode table.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from ..rl._schema import EPISODE_SCHEMA, rows_to_table, to_float32
from ._export_options import ExportOptions

_ROW_GROUP_TOKENS = 1 << 20  # flush a Parquet row group at about this many tokens


class Writer(Protocol):
    """What an export's rows are written with (see the module docstring)."""

    def add(self, rows: list[dict[str, Any]], episode: dict[str, Any]) -> None:
        """One episode: its segment rows (token fields as NumPy arrays) and its
        episode-table row."""

    def end_group(self) -> None:
        """The group of the episodes added so far is complete: a shard may be cut here."""

    def close(self) -> None:
        """Finish every file (also on error: the files written so far are closed)."""

    def written(self) -> dict[str, Any]:
        """The manifest's ``files``: ``{"segments": [{"path", "rows"}, ...], "episodes":
        {"path", "rows"}}`` (paths relative to the output folder)."""
        ...


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Files the export writes are ``0600`` and folders ``0700`` (umask 077 meanwhile)."""
    saved = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(saved)


def _lists(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with its arrays as lists (JSON floats as Python writes the float32 values)."""
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in row.items()}


class ExportWriter:
    """The local :class:`Writer`: segment shards (cut at group boundaries) and the episode
    table, written by this process. ``files`` (``[{"path", "rows"}]``), ``episodes_path``
    and ``episode_rows`` are what it wrote so far; ``written()`` the same for a manifest.

    A writer that writes the shards elsewhere (``ray_export``) subclasses it for the episode
    table (``add_episode``) and the shard names (``shard_name``), or writes one shard with
    ``ExportWriter(out, opts, episodes=False, first_shard=n)``.

    :param episodes: write the episode table (``False``: segment shards only).
    :param first_shard: the number of the first shard written (a worker writing one shard
        of an export, ``ray_export``).
    """

    def __init__(self, out: Path, opts: ExportOptions, *, episodes: bool = True,
                 first_shard: int = 0) -> None:
        self.out, self.opts = out, opts
        self.with_episodes, self.first_shard = episodes, first_shard
        self.files: list[dict[str, Any]] = []
        self._shard: Any = None
        self._buffer: list[dict[str, Any]] = []
        self._tokens = 0
        self._episodes: list[dict[str, Any]] = []
        self._ep_writer: Any = None
        self.episode_rows = 0
        ext = "parquet" if opts.fmt == "parquet" else "jsonl"
        self.episodes_path = out / f"episodes.{ext}"
        if opts.fmt == "jsonl" and episodes:
            self._ep_writer = open(self.episodes_path, "wb")  # noqa: SIM115 - closed in close()

    def shard_name(self, number: int) -> str:
        """The file name of segment shard ``number`` (``segments-00000.parquet``)."""
        return f"segments-{number:05d}.{self.opts.fmt}"

    def _open_shard(self) -> None:
        name = self.shard_name(self.first_shard + len(self.files))
        self.files.append({"path": name, "rows": 0})
        path = self.out / name
        if self.opts.fmt == "parquet":
            from ..rl._schema import SEGMENT_SCHEMA

            self._shard = pq.ParquetWriter(str(path), SEGMENT_SCHEMA)
        else:
            self._shard = open(path, "wb")  # noqa: SIM115 - closed in _close_shard()

    def add(self, rows: list[dict[str, Any]], episode: dict[str, Any]) -> None:
        if self._shard is None:
            self._open_shard()
        rows = to_float32(rows)
        self.files[-1]["rows"] += len(rows)
        if self.opts.fmt == "jsonl":
            self._shard.write(b"".join(orjson.dumps(_lists(r)) + b"\n" for r in rows))
        else:
            self._buffer.extend(rows)
            self._tokens += sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
            if self._tokens >= _ROW_GROUP_TOKENS or len(self._buffer) >= self.opts.rows_per_shard:
                self._flush()
        self.add_episode(episode)

    def add_episode(self, episode: dict[str, Any]) -> None:
        """One row of the episode table (nothing when the table is not written)."""
        if not self.with_episodes:
            return
        self.episode_rows += 1
        episode = dict(episode, episode_reward=float(np.float32(episode["episode_reward"])))
        if self.opts.fmt == "jsonl":
            self._ep_writer.write(orjson.dumps(episode) + b"\n")
            return
        self._episodes.append(episode)
        if len(self._episodes) >= 4096:
            self._flush_episodes()

    def _flush_episodes(self) -> None:
        if not self._episodes:
            return
        table = pa.Table.from_pylist(self._episodes, schema=EPISODE_SCHEMA)
        if self._ep_writer is None:
            self._ep_writer = pq.ParquetWriter(str(self.episodes_path), EPISODE_SCHEMA)
        self._ep_writer.write_table(table)
        self._episodes = []

    def _flush(self) -> None:
        if self._buffer:
            self._shard.write_table(rows_to_table(self._buffer))
        self._buffer, self._tokens = [], 0

    def written(self) -> dict[str, Any]:
        return {"segments": self.files,
                "episodes": {"path": self.episodes_path.name, "rows": self.episode_rows}}

    def end_group(self) -> None:
        if self._shard is not None and self.files[-1]["rows"] >= self.opts.rows_per_shard:
            self._close_shard()

    def _close_shard(self) -> None:
        if self.opts.fmt == "parquet":
            self._flush()
        self._shard.close()
        self._shard = None

    def close(self) -> None:
        if self._shard is not None:
            self._close_shard()
        if not self.with_episodes:
            return
        if self.opts.fmt == "parquet":
            self._flush_episodes()
            if self._ep_writer is None:  # no episodes: still write an empty table
                pq.write_table(EPISODE_SCHEMA.empty_table(), str(self.episodes_path))
        if self._ep_writer is not None:
            self._ep_writer.close()

