"""Export recorded runs as segment rows for GPU RL training (``agentcompact-traj/1``).

Two passes over the event logs keep memory bounded by one episode (plus one Parquet row
group and a small per-episode index):

1. *index*: every line is read once; per episode, the byte spans of its events, its group,
   its ``episode_end`` (reward, stop reason, trial). Group statistics for GRPO / Dr.GRPO /
   RLOO are computed here, over episodes (``agentcompact.rl._advantages``).
2. *stream*: group by group, episode by episode, the episode's events are read back by
   offset, cut into segments (``segments.build_segments``), turned into rows, given
   advantages and written. Segments of an episode and episodes of a group are contiguous,
   and a shard is only cut at a group boundary, so every shard can be read on its own.

With ``ExportOptions(workers=N)`` the episodes of pass 2 are read, segmented and turned
into rows by N worker processes, a few episodes per worker sent ahead of the one being
written, and written by this process in the same order: the output does not depend on N.

Output folder: ``segments-NNNNN.parquet`` (or ``.jsonl``), ``episodes.parquet`` (or
``.jsonl``) and ``manifest.json``; ``validate_export(folder)`` re-reads and checks it.

This module wires the passes together and writes the manifest; the concerns are beside it:
``_export_options`` (``ExportOptions``), ``_export_index`` (pass 1: index, outcomes,
``unrewarded`` policy, group advantages), ``_export_rows`` (pass 2: one episode's rows),
``_export_policy`` (length policy, recomputation, counts), ``_export_writer`` (the
``Writer`` seam and the local writer) and ``_export_pool`` (worker processes).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from ..errors import ConfigError, ExportError
from ..rl._card import dataset_card
from ..rl._schema import EPISODE_SCHEMA, SCHEMA_VERSION
from ._export_index import LogIndex, apply_unrewarded, episode_advantages, index_logs, read_outcomes
from ._export_options import ADVANTAGES, DEFAULT_MASKED_STOP_REASONS, UNREWARDED, ExportOptions
from ._export_policy import (
    ExportCounts,
    accept_episode,
    logprob_recomputer,
    warn_critic_free_gae,
    warn_zero_advantages,
)
from ._export_pool import (
    MAX_AUTO_WORKERS,
    ProcessEpisodes,
    available_cpus,
    default_start_method,
    worker_count,
)
from ._export_rows import EpisodeJob, ExportContext
from ._export_writer import ExportWriter, Writer, private_files
from ._tokenize import ChatTokenizer

__all__ = [
    "ADVANTAGES",
    "DEFAULT_MASKED_STOP_REASONS",
    "UNREWARDED",
    "MAX_AUTO_WORKERS",
    "ExportOptions",
    "available_cpus",
    "default_start_method",
    "export_runs",
    "iter_export_rows",
    "read_export",
    "validate_export",
]

logger = logging.getLogger(__name__)


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("export"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[segments]} segments"), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=not enabled, transient=True)


def export_runs(
    runs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: ChatTokenizer | str | os.PathLike[str],
    options: ExportOptions | None = None,
    *,
    keep_events: str | os.PathLike[str] | None = None,
    runner: Any = None,
) -> dict[str, Any]:
    """Export runs to ``out_dir``: what ``agentcompact export`` accepts.

    :param runs: recorded runs (folders holding ``events.jsonl``, or such files) and
        trajectory files / folders the loaders read (Claude Code, SWE-agent,
        mini-swe-agent, tau-bench, message lists), converted to events first
        (``agentcompact.trajectory._importers``); an episode may not span two logs.
    :param out_dir: created if missing; existing segment files in it are an error.
    :param tokenizer: the trainer's tokenizer (name, path, or a ``ChatTokenizer``).
    :param keep_events: a folder to keep the events converted from trajectory files in
        (default: a temporary folder, removed afterwards).
    :param runner: what exports the episodes, ``(context, workers, start_method)`` → a
        context manager with ``run(jobs)`` yielding their results in order, and optionally
        ``writer(out, opts)`` giving the ``_export_writer.Writer`` the rows are written with
        (default: this process or its worker processes, and ``ExportWriter``;
        ``ray_export`` passes a Ray Data one whose Ray tasks write the shards).
    :returns: the manifest (also written to ``out_dir/manifest.json``).
    """
    from ._importers import is_event_log

    logs = [r for r in runs if is_event_log(r)]
    files = [r for r in runs if not is_event_log(r)]
    with private_files():
        if not files:
            return _export_logs(logs, out_dir, tokenizer, options, runner)
        return _import_and_export(logs, files, out_dir, tokenizer, options, keep_events,
                                  runner)


def _import_and_export(
    logs: list[str | os.PathLike[str]],
    files: list[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: ChatTokenizer | str | os.PathLike[str],
    options: ExportOptions | None,
    keep_events: str | os.PathLike[str] | None,
    runner: Any,
) -> dict[str, Any]:
    from ._importers import import_trajectories

    with tempfile.TemporaryDirectory(prefix="agentcompact-import-") as tmp:
        folder = Path(keep_events) if keep_events is not None else Path(tmp)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        events = folder / "events.jsonl"
        count = import_trajectories(files, events)
        logger.info("converted %d trajectories to %s", count, events)
        return _export_logs([*logs, events], out_dir, tokenizer, options, runner)



def _export_logs(
    runs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: ChatTokenizer | str | os.PathLike[str],
    options: ExportOptions | None = None,
    runner: Any = None,
) -> dict[str, Any]:
    opts = options or ExportOptions()
    opts.check()
    tok = tokenizer if isinstance(tokenizer, ChatTokenizer) else (
        ChatTokenizer.from_pretrained(tokenizer))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("segments-*")) or (out / "manifest.json").exists():
        raise ConfigError(f"{out}: already holds an export; choose an empty folder")
    index = index_logs(runs)
    outcomes = read_outcomes(index.groups())
    groups, unrewarded = apply_unrewarded(index.groups(), outcomes, opts)
    episode_adv = episode_advantages(groups, outcomes, opts)
    counts = ExportCounts(groups=len(groups), episodes_without_calls=sum(
        1 for ep in index.episodes.values() if not ep.calls), **vars(unrewarded))
    total = sum(len(eps) for eps in groups.values())
    start_method = opts.start_method or default_start_method()
    recompute = logprob_recomputer(opts)
    episodes = (runner or ProcessEpisodes)(ExportContext(index.logs, tok, opts),
                                     worker_count(opts, total, start_method), start_method)
    with episodes:  # worker processes (if any) start before the writer opens files
        # the runner's writer, if it has one (Ray: its tasks write the shards)
        writer: Writer = getattr(episodes, "writer", ExportWriter)(out, opts)
        try:
            with _progress(opts.progress) as bar:
                task = bar.add_task("export", total=total, segments=0)
                sizes = [len(eps) for eps in groups.values()]
                jobs = (EpisodeJob(ep.episode_id, ep.group_id, ep.spans, outcomes[ep.episode_id],
                             episode_adv.get(ep.episode_id))
                        for eps in groups.values() for ep in eps)
                results = episodes.run(jobs)
                for size in sizes:
                    for _ in range(size):
                        done = next(results)
                        if done.counted is not None:  # counted by the worker
                            counts.merge(done.counted)
                        elif not accept_episode(done, opts, counts, recompute):
                            continue
                        if not done.kept:
                            continue
                        writer.add(done.rows, done.episode)
                        bar.update(task, advance=1, segments=counts.segments)
                    writer.end_group()
        finally:
            writer.close()
    manifest = _manifest(index, tok, opts, counts, writer)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out / "README.md").write_text(dataset_card(manifest))
    warn_zero_advantages(opts, counts)
    warn_critic_free_gae(opts.advantage)
    if opts.validate:
        validate_export(out)
    return manifest



def _manifest(index: LogIndex, tok: ChatTokenizer, opts: ExportOptions, counts: ExportCounts,
              writer: Writer) -> dict[str, Any]:
    meta = [r.get("metadata") or {} for r in index.runs]
    return {
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "format": opts.fmt,
        "tokenizer": tok.info(),
        "model": next((m["model"] for m in meta if m.get("model")), None),
        "sampling": next((m["sampling"] for m in meta if m.get("sampling")), None),
        "advantage": {"mode": opts.advantage, "eps": opts.eps, "gamma": opts.gamma,
                      "lam": opts.lam, "values": "zero (no critic)"
                      if opts.advantage.startswith("gae") else None},
        "summary_trained_override": opts.summary_trained,
        "logprobs": {"recomputed_with": opts.recompute_logprobs},
        "mask_stop_reasons": sorted(opts.mask_stop_reasons),
        "length": {"max_tokens": opts.max_tokens, "overlong": opts.overlong},
        "unrewarded": opts.unrewarded,
        "counts": {k: v for k, v in vars(counts).items()},
        "files": writer.written(),
        "sources": {"logs": [str(p) for p in index.logs], "runs": index.runs,
                    "torn_tails": index.torn},
    }


def iter_export_rows(out_dir: str | os.PathLike[str]) -> Iterator[list[dict[str, Any]]]:
    """The segment rows of an export, one shard at a time (in manifest order)."""
    from ..rl._schema import read_rows

    out = Path(out_dir)
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["files"]["segments"]:
        yield read_rows(out / entry["path"])


def read_export(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All segment rows of an export, in order (small exports and tests; use
    ``iter_export_rows`` or read ``segments-*.parquet`` directly for large ones)."""
    return [row for shard in iter_export_rows(out_dir) for row in shard]


def validate_export(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Re-read an export and check it; returns the manifest.

    Each shard must pass ``agentcompact.rl._schema.validate_rows`` with the manifest's
    tokenizer and template hashes; no episode or group may span two shards; row, episode and
    token counts must match the manifest; every episode row must agree with its segments.

    :raises SegmentRowError: a row breaks an invariant (names row, episode, field).
    :raises ExportError: the files disagree with the manifest or with each other.
    """
    from ..rl._schema import validate_rows

    out = Path(out_dir)
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ExportError(f"{out}/manifest.json: unreadable: {exc}") from exc
    tok = manifest["tokenizer"]
    seen_groups: set[str] = set()
    episodes: dict[str, tuple[int, float, str]] = {}
    n_rows = n_loss = 0
    for entry, rows in zip(manifest["files"]["segments"], iter_export_rows(out), strict=True):
        if len(rows) != entry["rows"]:
            raise ExportError(f"{entry['path']}: {len(rows)} rows, manifest says "
                                  f"{entry['rows']}")
        validate_rows(rows, tokenizer_sha256=tok["tokenizer_sha256"],
                      chat_template_sha256=tok["chat_template_sha256"])
        groups = {r["group_id"] for r in rows}
        if groups & seen_groups:
            raise ExportError(f"{entry['path']}: groups {sorted(groups & seen_groups)[:3]} "
                                  "also appear in an earlier shard")
        seen_groups |= groups
        for r in rows:
            episodes[r["episode_id"]] = (r["num_segments"], r["episode_reward"], r["group_id"])
            n_loss += sum(r["response_mask"])
        n_rows += len(rows)
    _check_counts(manifest, n_rows, len(episodes), n_loss)
    _check_episode_table(out / manifest["files"]["episodes"]["path"], episodes)
    return manifest  # type: ignore[no-any-return]  # parsed JSON object


def _check_counts(manifest: Mapping[str, Any], rows: int, episodes: int, loss: int) -> None:
    counts = manifest["counts"]
    for name, found in (("segments", rows), ("episodes", episodes), ("loss_tokens", loss)):
        if counts[name] != found:
            raise ExportError(f"manifest counts {counts[name]} {name}, files hold {found}")


def _check_episode_table(path: Path, episodes: Mapping[str, tuple[int, float, str]]) -> None:
    if path.suffix == ".parquet":
        table = pq.read_table(str(path), schema=EPISODE_SCHEMA).to_pylist()
    else:
        table = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    if len(table) != len(episodes):
        raise ExportError(f"{path}: {len(table)} episode rows for {len(episodes)} episodes")
    for row in table:
        want = episodes.get(row["episode_id"])
        got = (row["num_segments"], row["episode_reward"], row["group_id"])
        if want != got:
            raise ExportError(f"{path}: episode {row['episode_id']!r} has (num_segments, "
                                  f"reward, group) {got}, its segments say {want}")
