"""Export throughput and memory of ``agentcompact export``.

Exports the tau-bench file (200 real episodes, real rewards) with the Qwen2.5 fast
tokenizer, and compares with the tokenizer's raw batch throughput on the same text
(``tokenizer(texts)`` over the decoded text of every exported row). Then exports N and 4N
episodes (the file replicated under new episode ids) in fresh subprocesses and prints the
peak RSS, which should stay flat: the exporter holds one episode at a time.

    python benchmarks/export_throughput.py [--tokenizer PATH] [--data TAU_JSON] [--n 200]
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
from pathlib import Path

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


def export_once(events: Path, tokenizer: str, out: Path) -> dict[str, float]:
    from agentcompact.trajectory.export import ExportOptions, export_runs
    from agentcompact.trajectory.tokenize import ChatTokenizer

    tok = ChatTokenizer.from_pretrained(tokenizer)
    t0 = time.perf_counter()
    manifest = export_runs([events], out, tok, ExportOptions(validate=False))
    elapsed = time.perf_counter() - t0
    c = manifest["counts"]
    return {"seconds": elapsed, "segments": c["segments"], "episodes": c["episodes"],
            "tokens": c["prompt_tokens"] + c["response_tokens"]}


def raw_tokenizer(out: Path, tokenizer: str, repeat: int = 3) -> dict[str, float]:
    from transformers import AutoTokenizer

    from agentcompact.trajectory.export import read_export

    hf = AutoTokenizer.from_pretrained(tokenizer)
    texts = [hf.decode(r["prompt_ids"] + r["response_ids"]) for r in read_export(out)]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        enc = hf(texts)
        best = min(best, time.perf_counter() - t0)
    return {"seconds": best, "tokens": sum(len(x) for x in enc["input_ids"])}


def child(events: str, tokenizer: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stats = export_once(Path(events), tokenizer, Path(tmp) / "out")
    stats["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(stats))


def memory(data: Path, tokenizer: str, copies: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        make_run(data, events, copies)
        proc = subprocess.run([sys.executable, __file__, "--child", str(events), tokenizer],
                              capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", default=str(QWEN))
    p.add_argument("--data", type=Path, default=TAU)
    p.add_argument("--copies", type=int, default=1, help="N = copies x 200 episodes")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        make_run(args.data, events, args.copies)
        ex = export_once(events, args.tokenizer, Path(tmp) / "out")
        raw = raw_tokenizer(Path(tmp) / "out", args.tokenizer)
    ex_tps, raw_tps = ex["tokens"] / ex["seconds"], raw["tokens"] / raw["seconds"]
    print(f"export: {ex['episodes']:.0f} episodes, {ex['segments']:.0f} segments, "
          f"{ex['tokens']:.0f} tokens in {ex['seconds']:.2f} s -> "
          f"{ex['segments'] / ex['seconds']:.1f} segments/s, {ex_tps:,.0f} tokens/s")
    print(f"raw tokenizer(texts) on the same text: {raw['tokens']:.0f} tokens in "
          f"{raw['seconds']:.2f} s -> {raw_tps:,.0f} tokens/s")
    print(f"ratio export / raw tokenizer: {ex_tps / raw_tps:.2f} (target >= 0.5)")
    small = memory(args.data, args.tokenizer, args.copies)
    big = memory(args.data, args.tokenizer, 4 * args.copies)
    print(f"peak RSS: N={small['episodes']:.0f} episodes {small['max_rss_mib']:.0f} MiB; "
          f"4N={big['episodes']:.0f} episodes {big['max_rss_mib']:.0f} MiB "
          f"(ratio {big['max_rss_mib'] / small['max_rss_mib']:.2f})")


if __name__ == "__main__":
    main()
