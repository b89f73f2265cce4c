"""Export on Ray Data: the episodes of pass 2 read, segmented, templated and tokenized by
a pool of Ray actors (extra ``ray``), and the segment shards written by Ray workers.

The export is ``export.export_runs`` itself — the same index pass, advantages, shard cuts
and manifest — with its episode runner swapped for :class:`RayEpisodes`: the episodes
become a Ray dataset of jobs (``ray.data.from_items``, order preserved), each actor holds
one export context (the tokenizer shipped once by pickling, as to spawned worker
processes), runs ``_export_pool.run_job`` on each job and applies the length policy and
the counts to it (``_export_policy.accept_episode``). The rows stay on the workers: each
batch's rows go to a spill file in the output folder, and only the episode's table row,
counts and log records come back to the exporting process (the driver). The driver cuts
shards at group boundaries exactly as the local export does (it knows every episode's row
count) and, as soon as a shard is complete, a Ray task writes it from the spill files
(``_write_shard``: the local ``ExportWriter``, for one shard), several shards at once. The
driver writes the small episode table and the manifest. The files are byte-identical to
a local export of the same input; the spill folder is removed at the end.

The actors open the run logs by path (the jobs carry byte offsets, not events), and the
shard tasks write into the output folder: on a cluster, both must be on storage every node
mounts at the same path, as for Ray's own ``read_*`` and ``write_*`` functions. With
``recompute_logprobs`` (a model on the driver's device) the rows come back to the driver
and it writes the shards, as before.

    export_runs_ray(["run/events.jsonl"], "out", "Qwen/Qwen2.5-0.5B-Instruct",
                    address="auto")
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ._export_options import ExportOptions
from ._export_policy import ExportCounts, accept_episode
from ._export_pool import init_worker, log_levels, replay_records, run_job
from ._export_writer import ExportWriter, Writer, private_files
from ._tokenize import ChatTokenizer
from .export import export_runs

__all__ = ["RayEpisodes", "export_runs_ray"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Spilled:
    """Where an episode's rows are: entry ``index`` of the spill file ``path`` (a pickled
    list of the batch's row lists); ``len()`` is its row count."""

    path: str
    index: int
    rows: int

    def __len__(self) -> int:
        return self.rows


class _EpisodeActor:
    """One Ray actor's export context; a batch of pickled jobs → pickled results: the
    rows spilled into ``spill`` (``None``: sent back whole)."""

    def __init__(self, logs: list[Path], tok: ChatTokenizer, opts: ExportOptions,
                 levels: dict[str, int], disable: int, spill: str | None) -> None:
        init_worker(logs, tok, opts, levels, disable)
        self.opts, self.spill = opts, spill

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: list[bytes] = []
        spilled: list[list[dict[str, Any]]] = []
        path = None if self.spill is None else os.path.join(self.spill, uuid.uuid4().hex)
        for raw in batch["job"]:
            try:
                done = run_job(pickle.loads(raw))
                if path is not None:
                    done.counted = ExportCounts()
                    done.kept = accept_episode(done, self.opts, done.counted, None)
                    rows, done.rows = done.rows, []
                    if done.kept:
                        done.rows = _Spilled(path, len(spilled), len(rows))  # type: ignore[assignment]
                        spilled.append(rows)
                result: Any = (True, done)
            except Exception as exc:  # brought back and raised by the exporting process
                result = (False, exc)
            out.append(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        if path is not None and spilled:
            with private_files(), open(path, "wb") as f:
                pickle.dump(spilled, f, protocol=pickle.HIGHEST_PROTOCOL)
        return {"done": np.array(out, dtype=object)}


def _write_shard(out: str, opts: ExportOptions, number: int,
                 episodes: list[_Spilled]) -> None:
    """On a Ray worker: shard ``number`` of the export, its episodes' rows read from the
    spill files, written by the local export's writer (the same bytes)."""
    loaded: dict[str, list[Any]] = {}
    with private_files():
        writer = ExportWriter(Path(out), opts, episodes=False, first_shard=number)
        try:
            for spilled in episodes:
                if spilled.path not in loaded:
                    with open(spilled.path, "rb") as f:
                        loaded = {spilled.path: pickle.load(f)}  # the previous one is done
                writer.add(loaded[spilled.path][spilled.index], {})
        finally:
            writer.close()


class _RayWriter(ExportWriter):
    """The driver's writer: the episode table, and the shard cuts; each complete shard is
    written by a Ray task (``_write_shard``), up to ``parallel`` at once."""

    def __init__(self, out: Path, opts: ExportOptions, spill: Path,
                 parallel: int) -> None:
        super().__init__(out, opts)
        self.spill, self.parallel = spill, parallel
        self._current: list[_Spilled] | None = None
        self._tasks: list[Any] = []

    def add(self, rows: list[dict[str, Any]], episode: dict[str, Any]) -> None:
        spilled: Any = rows
        if self._current is None:
            self.files.append({"path": self.shard_name(len(self.files)), "rows": 0})
            self._current = []
        self.files[-1]["rows"] += len(spilled)
        self._current.append(spilled)
        self.add_episode(episode)

    def end_group(self) -> None:
        if self._current is not None and self.files[-1]["rows"] >= self.opts.rows_per_shard:
            self._submit()

    def _submit(self) -> None:
        import ray

        assert self._current is not None
        while len(self._tasks) >= self.parallel:  # at most ``parallel`` shards at once
            ready, self._tasks = ray.wait(self._tasks, num_returns=1)
            ray.get(ready)  # a task's exception is raised here
        # no CPU reserved: the episode actors hold the CPUs until the last episode is
        # taken, and a shard must not wait for them (the driver waits for the shard)
        task = ray.remote(num_cpus=0)(_write_shard).remote(
            str(self.out), self.opts, len(self.files) - 1, self._current)
        self._tasks.append(task)
        self._current = None

    def close(self) -> None:
        import ray

        try:
            if self._current is not None:
                self._submit()
            ray.get(self._tasks)  # a task's exception is raised here
            super().close()  # the episode table
        finally:
            shutil.rmtree(self.spill, ignore_errors=True)


class RayEpisodes:
    """An ``export_runs`` runner: the episodes exported by Ray actors, in order.

    :param workers: actors (``ExportOptions.workers`` when set, else the cluster's CPUs).
    :param batch_size: episodes per actor call.
    :param keep_events: as for ``export_runs`` (trajectory files converted to events).
    """

    def __init__(self, ctx: Any, workers: int, start_method: str, *,
                 batch_size: int = 4, workers_write: bool = True) -> None:
        self.ctx, self.batch_size, self.workers_write = ctx, batch_size, workers_write
        self._requested = ctx.opts.workers
        self._workers = workers
        self._spill: Path | None = None

    def writer(self, out: Path, opts: ExportOptions) -> Writer:
        """``export_runs`` asks its runner for the writer: shards written by Ray tasks
        (the driver's own writer when logprobs are recomputed on the driver)."""
        if opts.recompute_logprobs is not None or not self.workers_write:
            return ExportWriter(out, opts)
        import ray

        self._spill = out / f".ray-spill-{uuid.uuid4().hex}"
        with private_files():
            self._spill.mkdir()
        cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]  # ray: no annotations
        return _RayWriter(out, opts, self._spill, max(1, self._requested or cpus))

    def __enter__(self) -> RayEpisodes:
        return self

    def __exit__(self, *_: object) -> None:
        self.ctx.close()

    def run(self, jobs: Iterator[Any]) -> Iterator[Any]:
        import ray
        import ray.data

        items = [{"job": pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)} for job in jobs]
        if not items:
            return
        cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]  # ray: no annotations
        actors = max(1, min(self._requested or cpus, len(items)))
        data = ray.data.DataContext.get_current()
        saved = (data.execution_options.preserve_order, data.enable_progress_bars,
                 data.print_on_execution_start)
        data.execution_options.preserve_order = True  # rows in job order: the same files
        data.enable_progress_bars = data.print_on_execution_start = False
        blocks = max(1, min(len(items), actors * 4))
        ctx = self.ctx
        try:
            dataset = ray.data.from_items(items, override_num_blocks=blocks).map_batches(
                _EpisodeActor, batch_size=self.batch_size, batch_format="numpy",
                fn_constructor_args=(ctx.logs, ctx.tok, ctx.opts, log_levels(),
                                     logging.root.manager.disable,
                                     None if self._spill is None else str(self._spill)),
                compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=1)
            for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
                for raw in batch["done"]:
                    ok, value = pickle.loads(raw)
                    if not ok:
                        raise value
                    yield replay_records(value)  # its log records, as a worker's
        finally:
            (data.execution_options.preserve_order, data.enable_progress_bars,
             data.print_on_execution_start) = saved


def export_runs_ray(
    runs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: ChatTokenizer | str | os.PathLike[str],
    options: ExportOptions | None = None,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    batch_size: int = 4,
    workers_write: bool = True,
    keep_events: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """``export_runs`` with the episodes exported on Ray (the same files).

    :param address: the Ray cluster (``auto``, ``ray://host:10001``); ``None``: the one
        this process is connected to, else ``RAY_ADDRESS``, else a local Ray started for
        this export (with ``num_cpus``) and shut down after it.
    :param batch_size: episodes per actor call.
    :param workers_write: Ray tasks write the shards (``False``: the rows come back to
        this process, which writes them; the same files).
    :param keep_events: as for ``export_runs`` (trajectory files converted to events).
    """
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - the extra is missing
        raise ConfigError("export on Ray needs the 'ray' extra: "
                          "pip install 'agentcompact[ray]'") from exc
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or None, include_dashboard=False,
                 num_cpus=None if address else num_cpus,  # a cluster has its own
                 logging_level=logging.WARNING, log_to_driver=False)
    try:
        return export_runs(runs, out_dir, tokenizer, options,
                                   runner=partial(RayEpisodes, batch_size=batch_size,
                                                  workers_write=workers_write),
                                   keep_events=keep_events)
    finally:
        if started:
            ray.shutdown()
