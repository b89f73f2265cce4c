"""Export throughput and memory of ``agentcompact export``.

Exports the tau-bench file (200 real episodes, real rewards) with the Qwen2.5 fast
tokenizer and compares it with that tokenizer's raw throughput on exactly the exported
text: the text of every exported row (its ids decoded; re-encoding it must give the same
number of tokens) through each batch call the tokenizer has -- ``tokenizer(texts)`` (the
transformers call), ``backend_tokenizer.encode_batch`` and ``encode_batch_fast`` (no
character offsets), ids taken out as Python lists -- best time of ``--repeat`` runs each;
the fastest call is the reference. The export is also timed without its reuse of the ids
of repeated text (the system prompt every episode starts with), which the raw calls
tokenize again for every row. Both are reported in segments/s and tokens/s, with the
CPU time (the tokenizer's batch calls run on several threads: on a loaded machine they
lose that advantage, so the load average is printed too). The export runs with the
default number of worker processes (``ExportOptions(workers=None)``: the available CPUs,
capped) and with ``workers=1`` (all in one process); its CPU time counts the workers'.
Then N and 4N episodes (the file replicated under new episode ids) are exported in fresh
processes with the default workers, and the peak memory of the whole process tree (the
exporter and its workers) printed, which should stay flat: each process holds a few
episodes at a time. It is sampled every 10 ms from /proc: the sum of the processes' RSS
(counting pages a forked worker shares with its parent once per process) and of their
PSS (shared pages split between the processes sharing them).

    python benchmarks/export_throughput.py [--tokenizer PATH] [--data TAU_JSON]
                                           [--copies 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
TAU = SHARED / "trajectories" / "tau-bench" / "historical_trajectories" / "gpt-4o-airline.json"
QWEN = SHARED / "tokenizers" / "qwen2.5-coder-0.5b-instruct"


def make_run(data: Path, events: Path, copies: int) -> None:
    """``copies`` × the tau-bench runs as one event log (new episode and group ids)."""
    import orjson

    from agentcompact.trajectory import import_trajectories

    with tempfile.TemporaryDirectory() as tmp:
        once = Path(tmp) / "events.jsonl"
        import_trajectories([data], once)
        lines = once.read_bytes().splitlines()
    with open(events, "wb") as out:
        for c in range(copies):
            for line in lines:
                ev = orjson.loads(line)
                d = ev["data"]
                if "episode_id" in d:
                    d["episode_id"] = f"{d['episode_id']}/copy{c}"
                if d.get("group_id") is not None:
                    d["group_id"] = f"{d['group_id']}/copy{c}"
                out.write(orjson.dumps(ev) + b"\n")


def _cpu() -> float:
    """CPU seconds of this process and of its children that have been waited for (the
    export's workers, once it has shut its pool down)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], list[float], Any]:
    """Wall and CPU seconds (worker processes included) of ``repeat`` calls of ``fn``, and
    its last result."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), _cpu()
        result = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
    return walls, cpus, result


def export_runs_timed(events: Path, tokenizer: str, out: Path, repeat: int,
                      reuse: bool = True, workers: int | None = None) -> dict[str, Any]:
    """Export ``repeat`` times (fresh folders, the tokenizer loaded once, outside the clock;
    worker processes started inside it). ``reuse=False``: without the reuse of repeated
    chunks' ids (``ChatTokenizer``). ``workers``: ``ExportOptions.workers``."""
    from agentcompact.trajectory._tokenize import ChatTokenizer
    from agentcompact.trajectory.export import ExportOptions, export_runs

    tok = ChatTokenizer.from_pretrained(tokenizer)
    if not reuse:
        tok._reuse = False
    runs = iter(range(repeat))
    tag = f"{'' if reuse else '-noreuse'}-w{workers}"

    def once() -> dict[str, Any]:
        tok.clear_reuse()  # every run starts cold, as one `agentcompact export` does
        manifest: dict[str, Any] = export_runs([events], out / f"run{next(runs)}{tag}", tok,
                                               ExportOptions(validate=False, workers=workers))
        return manifest

    walls, cpus, manifest = _timed(once, repeat)
    c = manifest["counts"]
    return {"walls": walls, "cpus": cpus, "segments": c["segments"], "episodes": c["episodes"],
            "tokens": c["prompt_tokens"] + c["response_tokens"],
            "out": out / f"run{repeat - 1}{tag}"}


def default_workers(episodes: int) -> int:
    """How many workers ``ExportOptions(workers=None)`` uses for ``episodes`` here."""
    from agentcompact.trajectory._export_pool import worker_count
    from agentcompact.trajectory.export import ExportOptions, default_start_method

    return int(worker_count(ExportOptions(), episodes, default_start_method()))


def raw_tokenizer(out: Path, tokenizer: str, repeat: int) -> dict[str, Any]:
    """The tokenizer's batch calls on the exported text (see the module docstring)."""
    from transformers import AutoTokenizer

    from agentcompact.trajectory.export import iter_export_rows

    hf = AutoTokenizer.from_pretrained(tokenizer)
    backend = hf.backend_tokenizer
    ids = [list(r["prompt_ids"]) + list(r["response_ids"])
           for shard in iter_export_rows(out) for r in shard]
    texts = backend.decode_batch(ids, skip_special_tokens=False)
    calls: dict[str, Callable[[], list[list[int]]]] = {
        "tokenizer(texts)": lambda: hf(texts, add_special_tokens=False)["input_ids"],
        "encode_batch": lambda: [e.ids for e in backend.encode_batch(
            texts, add_special_tokens=False)],
    }
    if hasattr(backend, "encode_batch_fast"):
        calls["encode_batch_fast"] = lambda: [e.ids for e in backend.encode_batch_fast(
            texts, add_special_tokens=False)]
    results = {}
    for name, fn in calls.items():
        walls, cpus, enc = _timed(fn, repeat)
        results[name] = {"walls": walls, "cpus": cpus, "tokens": sum(len(x) for x in enc),
                         "same_ids": enc == ids}
    return {"rows": len(ids), "calls": results}


def child(events: str, tokenizer: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stats = export_runs_timed(Path(events), tokenizer, Path(tmp), 1)
    print(json.dumps({"episodes": stats["episodes"], "segments": stats["segments"],
                      "workers": default_workers(stats["episodes"]),
                      "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "max_child_rss_mib":
                          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def _rss_pss_kib(pid: int) -> tuple[int, int]:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line and "-" not in line)
    except OSError:  # gone
        return 0, 0
    return int(fields["Rss"].split()[0]), int(fields["Pss"].split()[0])


def memory(data: Path, tokenizer: str, copies: int) -> dict[str, float]:
    """Export in a fresh process; its tree's peak summed RSS and PSS, sampled every 10 ms."""
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        make_run(data, events, copies)
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(events), tokenizer],
                                stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        peak_rss = peak_pss = procs = 0
        while proc.poll() is None:
            pids = _tree(proc.pid)
            sizes = [_rss_pss_kib(p) for p in pids]
            peak_rss = max(peak_rss, sum(r for r, _ in sizes))
            peak_pss = max(peak_pss, sum(p for _, p in sizes))
            procs = max(procs, len(pids))
            time.sleep(0.01)
        stdout = proc.stdout.read() if proc.stdout else ""
        if proc.returncode:
            raise RuntimeError(f"memory child failed ({proc.returncode})")
    result: dict[str, float] = json.loads(stdout.strip().splitlines()[-1])
    return {**result, "tree_rss_mib": peak_rss / 1024, "tree_pss_mib": peak_pss / 1024,
            "processes": procs}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _span(values: list[float]) -> str:
    return f"{min(values):.2f} s (runs {min(values):.2f}-{max(values):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", default=str(QWEN))
    p.add_argument("--data", type=Path, default=TAU)
    p.add_argument("--copies", type=int, default=1, help="N = copies x 200 episodes")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each measurement")
    p.add_argument("--no-memory", action="store_true", help="skip the N / 4N memory runs")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    print(f"{os.cpu_count()} CPUs, load average {_load()} (1, 5, 15 min)")
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        make_run(args.data, events, args.copies)
        ex = export_runs_timed(events, args.tokenizer, Path(tmp), args.repeat)
        one = export_runs_timed(events, args.tokenizer, Path(tmp), args.repeat, workers=1)
        plain = export_runs_timed(events, args.tokenizer, Path(tmp), args.repeat, reuse=False)
        raw = raw_tokenizer(ex["out"], args.tokenizer, args.repeat)
    n_seg, n_tok = ex["segments"], ex["tokens"]
    best = min(ex["walls"])
    print(f"export ({default_workers(ex['episodes'])} workers, the default): "
          f"{ex['episodes']} episodes, {n_seg} segments, {n_tok} tokens in "
          f"{_span(ex['walls'])}, CPU {min(ex['cpus']):.2f} s -> {n_seg / best:.1f} "
          f"segments/s, {n_tok / best:,.0f} tokens/s")
    print(f"export in one process (workers=1): {_span(one['walls'])}, CPU "
          f"{min(one['cpus']):.2f} s -> {n_seg / min(one['walls']):.1f} segments/s, "
          f"{n_tok / min(one['walls']):,.0f} tokens/s")
    print(f"export without reusing the ids of repeated text (the system prompt every "
          f"episode starts with): {_span(plain['walls'])}, CPU {min(plain['cpus']):.2f} s -> "
          f"{n_tok / min(plain['walls']):,.0f} tokens/s")
    fastest = None
    for name, r in raw["calls"].items():
        t = min(r["walls"])
        same = "" if r["tokens"] == n_tok and r["same_ids"] else " (DIFFERENT ids!)"
        print(f"raw {name:<18} on the exported text: {r['tokens']} tokens in {_span(r['walls'])}"
              f", CPU {min(r['cpus']):.2f} s -> {raw['rows'] / t:.1f} segments/s, "
              f"{r['tokens'] / t:,.0f} tokens/s, ratio export/raw {t / best:.2f}{same}")
        if fastest is None or t < min(raw["calls"][fastest]["walls"]):
            fastest = name
    assert fastest is not None
    ref = raw["calls"][fastest]
    print(f"ratio export / raw tokenizer (fastest batch call, {fastest}): "
          f"{min(ref['walls']) / best:.2f} tokens/s (target >= 0.5); CPU time ratio "
          f"{min(ref['cpus']) / min(ex['cpus']):.2f}; workers=1 "
          f"{min(ref['walls']) / min(one['walls']):.2f} (CPU "
          f"{min(ref['cpus']) / min(one['cpus']):.2f}); without reuse "
          f"{min(ref['walls']) / min(plain['walls']):.2f} (CPU "
          f"{min(ref['cpus']) / min(plain['cpus']):.2f}); load average now {_load()}")
    if args.no_memory:
        return
    small = memory(args.data, args.tokenizer, args.copies)
    big = memory(args.data, args.tokenizer, 4 * args.copies)
    for name, key in (("summed RSS", "tree_rss_mib"), ("summed PSS", "tree_pss_mib"),
                      ("exporting process's max RSS", "max_rss_mib"),
                      ("largest worker's max RSS", "max_child_rss_mib")):
        print(f"peak memory, {name}: N={small['episodes']:.0f} episodes "
              f"({small['workers']:.0f} workers, {small['processes']:.0f} processes) "
              f"{small[key]:.0f} MiB; 4N={big['episodes']:.0f} episodes "
              f"({big['workers']:.0f} workers, {big['processes']:.0f} processes) "
              f"{big[key]:.0f} MiB (ratio {big[key] / max(small[key], 1e-9):.2f})")


if __name__ == "__main__":
    main()
