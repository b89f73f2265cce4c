"""Export on Ray Data: the episodes of pass 2 read, segmented, templated and tokenized by
a pool of Ray actors (extra ``ray``), the rows written by this process in the same order.

The export is ``export.export_runs`` itself — the same index pass, advantages, writer and
manifest — with its episode runner swapped for :class:`RayEpisodes`: the episodes become
a Ray dataset of jobs (``ray.data.from_items``, order preserved), each actor holds one
export context (the tokenizer shipped once by pickling, as to spawned worker processes)
and runs ``export._run_job`` on each job, results come back pickled in order. The files
are byte-identical to a local export of the same input.

The actors open the run logs by path (the jobs carry byte offsets, not events): on a
cluster, the logs must be on storage every node mounts at the same path, as for Ray's own
``read_*`` functions. The shards are written by the driver.

    export_runs_ray(["run/events.jsonl"], "out", "Qwen/Qwen2.5-0.5B-Instruct",
                    address="auto")
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from . import export as _export
from ._tokenize import ChatTokenizer

__all__ = ["RayEpisodes", "export_runs_ray"]

logger = logging.getLogger(__name__)


class _EpisodeActor:
    """One Ray actor's export context; a batch of pickled jobs → pickled results."""

    def __init__(self, logs: list[Path], tok: ChatTokenizer, opts: _export.ExportOptions,
                 levels: dict[str, int], disable: int) -> None:
        _export._init_worker(logs, tok, opts, levels, disable)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = []
        for raw in batch["job"]:
            try:
                result: Any = (True, _export._run_job(pickle.loads(raw)))
            except Exception as exc:  # brought back and raised by the exporting process
                result = (False, exc)
            out.append(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        return {"done": np.array(out, dtype=object)}


class RayEpisodes:
    """An ``export_runs`` runner: the episodes exported by Ray actors, in order.

    :param workers: actors (``ExportOptions.workers`` when set, else the cluster's CPUs).
    :param batch_size: episodes per actor call.
    :param keep_events: as for ``export_runs`` (trajectory files converted to events).
    """

    def __init__(self, ctx: Any, workers: int, start_method: str, *,
                 batch_size: int = 4) -> None:
        self.ctx, self.batch_size = ctx, batch_size
        self._requested = ctx.opts.workers
        self._workers = workers

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
                fn_constructor_args=(ctx.logs, ctx.tok, ctx.opts, _export._log_levels(),
                                     logging.root.manager.disable),
                compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=1)
            for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
                for raw in batch["done"]:
                    ok, value = pickle.loads(raw)
                    if not ok:
                        raise value
                    future: Future[Any] = Future()
                    future.set_result(value)
                    yield _export._Episodes._take(future)  # its log records, as a worker's
        finally:
            (data.execution_options.preserve_order, data.enable_progress_bars,
             data.print_on_execution_start) = saved


def export_runs_ray(
    runs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: ChatTokenizer | str | os.PathLike[str],
    options: _export.ExportOptions | None = None,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    batch_size: int = 4,
    keep_events: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """``export_runs`` with the episodes exported on Ray (the same files).

    :param address: the Ray cluster (``auto``, ``ray://host:10001``); ``None``: the one
        this process is connected to, else ``RAY_ADDRESS``, else a local Ray started for
        this export (with ``num_cpus``) and shut down after it.
    :param batch_size: episodes per actor call.
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
        return _export.export_runs(runs, out_dir, tokenizer, options,
                                   runner=partial(RayEpisodes, batch_size=batch_size),
                                   keep_events=keep_events)
    finally:
        if started:
            ray.shutdown()
