"""Export throughput on Ray Data vs the local export, on this machine.

The tau-bench file (200 real episodes; ``--copies`` replicates it under new ids), the
Qwen2.5 fast tokenizer, all in one run, best of ``--repeat`` each:

- local, ``workers=1`` (all in this process) and ``workers=2`` (two forked workers);
- Ray (``ray.init(num_cpus=2)``, started once; its start-up time printed apart) with one
  and with two actors, the shards written by Ray tasks (the default), and with two actors
  the rows sent back to the driver, which writes them (``workers_write=False``).

Every export's files are checked byte-identical to the local one's. Episodes/s and the
ratio to local ``workers=1`` are printed. "Per added worker, on paper", from CPU times
(less disturbed by a loaded machine than wall times) of a one-process export: the time
inside the episodes' work (read, segment, template, tokenize: what the actors do) and the
rest (index pass, writing: what the driver does); with the two pipelined, n workers give
episodes / max(rest, work / n). Actor start-up (once per export), unpickling the rows on
the driver and a cluster's network transfer of them are not in it.

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/ray_export_throughput.py
        [--copies 1] [--repeat 2] [--rows-per-shard 10000]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_throughput import QWEN, TAU, make_run  # noqa: E402 - the sibling benchmark


def data_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


def best(fn: Callable[[Path], Any], repeat: int, tmp: Path, reference: dict[str, bytes] | None
         ) -> tuple[float, float, dict[str, bytes]]:
    """Best wall and CPU seconds (this process only) of ``repeat`` runs, and the files."""
    times, cpus, files = [], [], {}
    for r in range(repeat):
        out = tmp / f"out{time.monotonic_ns()}"
        t0, c0 = time.perf_counter(), time.process_time()
        fn(out)
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        files = data_files(out)
        shutil.rmtree(out)
        if reference is not None and files != reference:
            raise SystemExit(f"export differs from the local one (repeat {r})")
    return min(times), min(cpus), files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--rows-per-shard", type=int, default=10_000,
                    help="segment rows per shard (fewer: more shards for the Ray tasks)")
    args = ap.parse_args(argv)
    import ray

    from agentcompact.trajectory import _export_pool
    from agentcompact.trajectory._tokenize import ChatTokenizer
    from agentcompact.trajectory.export import ExportOptions, export_runs
    from agentcompact.trajectory.ray_export import export_runs_ray

    tok = ChatTokenizer.from_pretrained(QWEN)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        events = tmp / "events.jsonl"
        make_run(TAU, events, args.copies)
        episodes = 200 * args.copies

        def local(workers: int) -> Callable[[Path], Any]:
            return lambda out: export_runs([events], out, tok, ExportOptions(
                workers=workers, rows_per_shard=args.rows_per_shard))

        def on_ray(workers: int, workers_write: bool = True) -> Callable[[Path], Any]:
            return lambda out: export_runs_ray([events], out, tok,
                                               ExportOptions(workers=workers, rows_per_shard=
                                                             args.rows_per_shard),
                                               workers_write=workers_write)

        rows: list[tuple[str, float]] = []
        work_s = [0.0]
        episode = _export_pool.export_episode

        def timed_episode(ctx: Any, job: Any) -> Any:  # in-process (workers=1) only
            c0 = time.process_time()
            try:
                return episode(ctx, job)
            finally:
                work_s[0] += time.process_time() - c0

        _export_pool.export_episode = timed_episode
        t1, cpu1, reference = best(local(1), 1, tmp, None)
        _export_pool.export_episode = episode
        work = work_s[0]
        t1, cpu1, reference = best(local(1), args.repeat, tmp, None)
        rows.append(("local, workers=1", t1))
        rows.append(("local, workers=2", best(local(2), args.repeat, tmp, reference)[0]))
        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)
        start = time.perf_counter() - t0
        try:
            r1, _, _ = best(on_ray(1), args.repeat, tmp, reference)
            r2, driver, _ = best(on_ray(2), args.repeat, tmp, reference)
            d2, driver_writes, _ = best(on_ray(2, False), args.repeat, tmp, reference)
        finally:
            ray.shutdown()
        rows += [("ray, 1 actor", r1), ("ray, 2 actors", r2),
                 ("ray, 2, driver writes", d2)]
    shards = sum(1 for name in reference if name.startswith("segments-"))
    print(f"{episodes} tau-bench episodes, {shards} shards, best of {args.repeat}, "
          f"load {os.getloadavg()[0]:.1f}; every export byte-identical to local workers=1")
    print(f"{'export':<24}{'s':>8}{'episodes/s':>12}{'vs local w=1':>14}")
    for name, t in rows:
        print(f"{name:<24}{t:>8.2f}{episodes / t:>12.1f}{t1 / t:>14.2f}")
    print(f"ray.init(num_cpus=2), once: {start:.1f} s (not in the times above)")
    serial = cpu1 - work
    print(f"CPU of local workers=1: {cpu1:.2f} s, of which episodes {work:.2f} s "
          f"({work / episodes * 1000:.1f} ms each) and the rest (index pass, writing) "
          f"{serial:.2f} s; the Ray driver's process: {driver:.2f} s with the workers writing "
          f"the shards, {driver_writes:.2f} s writing them itself (Ray's threads included)")
    print(f"  the Ray driver's measured CPU bounds any number of workers at "
          f"{episodes / driver:.1f} episodes/s ({cpu1 / driver:.1f}x local workers=1)")
    for n in (2, 4, 8, 16, 32):
        t = max(serial, work / n)
        print(f"  on paper, {n:>2} workers: {episodes / t:8.1f} episodes/s "
              f"({cpu1 / t:.1f}x local workers=1 on an idle core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
