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
lose that advantage, so the load average is printed too). Then N and 4N episodes (the
file replicated under new episode ids) are exported in fresh processes and their peak RSS
printed, which should stay flat: the exporter holds one episode at a time.

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

    from agentcompact.trajectory.importers import import_trajectories

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


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], list[float], Any]:
    """Wall and CPU seconds of ``repeat`` calls of ``fn``, and its last result."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return walls, cpus, result


def export_runs_timed(events: Path, tokenizer: str, out: Path, repeat: int,
                      reuse: bool = True) -> dict[str, Any]:
    """Export ``repeat`` times (fresh folders, the tokenizer loaded once, outside the clock).
    ``reuse=False``: without the reuse of repeated chunks' ids (``ChatTokenizer``)."""
    from agentcompact.trajectory.export import ExportOptions, export_runs
    from agentcompact.trajectory.tokenize import ChatTokenizer

    tok = ChatTokenizer.from_pretrained(tokenizer)
    if not reuse:
        tok._reuse = False
    runs = iter(range(repeat))
    tag = "" if reuse else "-noreuse"

    def once() -> dict[str, Any]:
        tok.clear_reuse()  # every run starts cold, as one `agentcompact export` does
        return export_runs([events], out / f"run{next(runs)}{tag}", tok,
                           ExportOptions(validate=False))

    walls, cpus, manifest = _timed(once, repeat)
    c = manifest["counts"]
    return {"walls": walls, "cpus": cpus, "segments": c["segments"], "episodes": c["episodes"],
            "tokens": c["prompt_tokens"] + c["response_tokens"],
            "out": out / f"run{repeat - 1}{tag}"}


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
                      "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def memory(data: Path, tokenizer: str, copies: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        make_run(data, events, copies)
        proc = subprocess.run([sys.executable, __file__, "--child", str(events), tokenizer],
                              capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


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
        plain = export_runs_timed(events, args.tokenizer, Path(tmp), args.repeat, reuse=False)
        raw = raw_tokenizer(ex["out"], args.tokenizer, args.repeat)
    n_seg, n_tok = ex["segments"], ex["tokens"]
    best = min(ex["walls"])
    print(f"export: {ex['episodes']} episodes, {n_seg} segments, {n_tok} tokens in "
          f"{_span(ex['walls'])}, CPU {min(ex['cpus']):.2f} s -> {n_seg / best:.1f} "
          f"segments/s, {n_tok / best:,.0f} tokens/s")
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
          f"{min(ref['cpus']) / min(ex['cpus']):.2f}; without reuse "
          f"{min(ref['walls']) / min(plain['walls']):.2f} (CPU "
          f"{min(ref['cpus']) / min(plain['cpus']):.2f}); load average now {_load()}")
    if args.no_memory:
        return
    small = memory(args.data, args.tokenizer, args.copies)
    big = memory(args.data, args.tokenizer, 4 * args.copies)
    print(f"peak RSS: N={small['episodes']:.0f} episodes {small['max_rss_mib']:.0f} MiB; "
          f"4N={big['episodes']:.0f} episodes {big['max_rss_mib']:.0f} MiB "
          f"(ratio {big['max_rss_mib'] / small['max_rss_mib']:.2f})")


if __name__ == "__main__":
    main()
