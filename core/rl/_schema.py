"""The segment-row schema (``agentcompact-traj/1``) and its validator.

A *segment row* is one working-context window of one episode, as a plain ``dict`` with the
fields of the table in docs/rl-math.md plus ``advantages`` (per response token, 0.0 where the
mask is 0) and the optional ``returns`` (GAE). This module owns:

* ``SEGMENT_SCHEMA`` / ``EPISODE_SCHEMA`` — the Arrow types used for Parquet;
* ``validate_rows(rows)`` — every invariant of docs/rl-math.md; the error names the row,
  episode, segment and field of each problem;
* ``rows_to_table`` / ``table_to_rows`` and JSONL/Parquet readers and writers whose round trip
  is bit-exact (float fields are float32 in Arrow; :func:`to_float32` makes Python rows agree).

Row problems raise :class:`SegmentRowError` (an :class:`agentcompact.errors.ExportError`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agentcompact.errors import ExportError, SegmentRowError, TrajectoryError

__all__ = [
    "COMPACTION_TRIGGERS",
    "EPISODE_SCHEMA",
    "FLOAT32_LIST_FIELDS",
    "SAMPLING_TYPE",
    "SCHEMA_VERSION",
    "SEGMENT_SCHEMA",
    "STOP_REASONS",
    "RowProblem",
    "SegmentRowError",
    "check_rows",
    "episodes_of",
    "read_jsonl",
    "read_parquet",
    "read_rows",
    "rows_to_table",
    "table_to_rows",
    "to_float32",
    "validate_rows",
    "write_jsonl",
    "write_parquet",
]

SCHEMA_VERSION = "agentcompact-traj/1"
COMPACTION_TRIGGERS = frozenset({"token_budget", "turn_limit", "model_initiated", "none"})
#: ``prefix_break``: a segment that ended because the next context does not extend its
#: tokens / template / messages although nothing was compacted (see ``segment_break``)
STOP_REASONS = frozenset(
    {"compacted", "prefix_break", "complete", "context_length", "max_turns", "timeout",
     "error"}
)

SAMPLING_TYPE = pa.struct(
    [
        pa.field("temperature", pa.float32()),
        pa.field("top_p", pa.float32()),
        pa.field("top_k", pa.int32()),
        pa.field("logprobs_mode", pa.string()),
    ]
)

SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("segment_index", pa.int32(), nullable=False),
        pa.field("num_segments", pa.int32(), nullable=False),
        pa.field("is_last_segment", pa.bool_(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("rollout_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("summary_span", pa.list_(pa.int32()), nullable=False),
        pa.field("summary_trained", pa.bool_(), nullable=False),
        pa.field("compaction_trigger", pa.string(), nullable=False),
        pa.field("episode_reward", pa.float32(), nullable=False),
        pa.field("segment_reward", pa.float32(), nullable=False),
        pa.field("stop_reason", pa.string(), nullable=False),
        pa.field("mask_episode", pa.bool_(), nullable=False),
        pa.field("loss_weight", pa.float32(), nullable=False),
        pa.field("episode_num_loss_tokens", pa.int32(), nullable=False),
        pa.field("episode_num_segments", pa.int32(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("tokenizer_name", pa.string(), nullable=False),
        pa.field("tokenizer_sha256", pa.string(), nullable=False),
        pa.field("chat_template_sha256", pa.string(), nullable=False),
        pa.field("sampling", SAMPLING_TYPE, nullable=False),
        pa.field("messages_json", pa.string(), nullable=True),
        pa.field("prompt_json", pa.string(), nullable=True),
        pa.field("tools_json", pa.string(), nullable=True),
        pa.field("segment_break", pa.string(), nullable=True),
        pa.field("advantages", pa.list_(pa.float32()), nullable=False),
        pa.field("returns", pa.list_(pa.float32()), nullable=True),
    ],
    metadata={"schema_version": SCHEMA_VERSION},
)

#: One row per rollout (episode); written beside the segment table.
EPISODE_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("episode_reward", pa.float32(), nullable=False),
        pa.field("stop_reason", pa.string(), nullable=False),
        pa.field("mask_episode", pa.bool_(), nullable=False),
        pa.field("num_segments", pa.int32(), nullable=False),
        pa.field("num_compactions", pa.int32(), nullable=False),
        pa.field("num_loss_tokens", pa.int32(), nullable=False),
        pa.field("num_response_tokens", pa.int32(), nullable=False),
        pa.field("max_working_context", pa.int32(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
    ],
    metadata={"schema_version": SCHEMA_VERSION},
)

FLOAT32_LIST_FIELDS = ("rollout_logprobs", "advantages", "returns")
_FLOAT32_SCALAR_FIELDS = ("episode_reward", "segment_reward", "loss_weight")
_TOKEN_LIST_FIELDS = ("response_ids", "response_mask", "rollout_logprobs", "advantages")
#: Fields that must hold one value across all segments of an episode.
_EPISODE_CONSTANT_FIELDS = (
    "group_id",
    "sample_index",
    "num_segments",
    "episode_reward",
    "mask_episode",
    "episode_num_loss_tokens",
    "episode_num_segments",
)
#: Fields that must hold one value across the whole batch ("reject on mismatch").
_BATCH_CONSTANT_FIELDS = ("schema_version", "tokenizer_name", "tokenizer_sha256",
                          "chat_template_sha256")


# --------------------------------------------------------------------------- problems


@dataclass(frozen=True, slots=True)
class RowProblem:
    """One broken invariant: where (row position, episode, segment, field) and what."""

    row: int
    episode_id: str
    segment_index: int | None
    field: str
    message: str

    def __str__(self) -> str:
        return (
            f"row {self.row} (episode {self.episode_id!r}, segment {self.segment_index}), "
            f"field {self.field!r}: {self.message}"
        )


class _Collector:
    """Accumulates problems with the row context filled in."""

    def __init__(self) -> None:
        self.problems: list[RowProblem] = []

    def add(self, pos: int, row: Mapping[str, Any], field: str, message: str) -> None:
        seg = row.get("segment_index")
        self.problems.append(RowProblem(
            row=pos,
            episode_id=str(row.get("episode_id", "?")),
            segment_index=seg if isinstance(seg, int) else None,
            field=field,
            message=message,
        ))


# --------------------------------------------------------------------------- validator


def check_rows(
    rows: Sequence[Mapping[str, Any]],
    *,
    tokenizer_sha256: str | None = None,
    chat_template_sha256: str | None = None,
) -> list[RowProblem]:
    """Return every broken invariant of ``rows`` (empty list when they are valid).

    Checks each row on its own, then each episode's segments, then the ordering of episodes
    and groups, then batch-wide constants. Pass the trainer's ``tokenizer_sha256`` /
    ``chat_template_sha256`` to reject rows produced with another tokenizer or template.
    """
    out = _Collector()
    for pos, row in enumerate(rows):
        _check_row(pos, row, out)
    if out.problems:  # episode checks assume well-formed rows
        return out.problems
    for positions in episodes_of(rows).values():
        _check_episode(rows, positions, out)
    _check_contiguity(rows, out)
    expected = {"tokenizer_sha256": tokenizer_sha256, "chat_template_sha256": chat_template_sha256}
    _check_batch_constants(rows, expected, out)
    return out.problems


def validate_rows(
    rows: Sequence[Mapping[str, Any]],
    *,
    tokenizer_sha256: str | None = None,
    chat_template_sha256: str | None = None,
) -> None:
    """Raise :class:`SegmentRowError` listing every broken invariant; return ``None`` if valid."""
    problems = check_rows(
        rows, tokenizer_sha256=tokenizer_sha256, chat_template_sha256=chat_template_sha256
    )
    if problems:
        raise SegmentRowError(problems)


def episodes_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Map ``episode_id`` → positions of its rows, in first-seen order."""
    episodes: dict[str, list[int]] = {}
    for pos, row in enumerate(rows):
        episodes.setdefault(str(row["episode_id"]), []).append(pos)
    return episodes


def _check_row(pos: int, row: Mapping[str, Any], out: _Collector) -> None:
    missing = [f.name for f in SEGMENT_SCHEMA if f.nullable is False and f.name not in row]
    for name in missing:
        out.add(pos, row, name, "missing")
    if missing:
        return
    _check_scalars(pos, row, out)
    if _check_token_lists(pos, row, out):
        _check_logprobs(pos, row, out)
        _check_advantages(pos, row, out)
        _check_summary_span(pos, row, out)


def _check_scalars(pos: int, row: Mapping[str, Any], out: _Collector) -> None:
    if row["schema_version"] != SCHEMA_VERSION:
        out.add(pos, row, "schema_version", f"{row['schema_version']!r} != {SCHEMA_VERSION!r}")
    if row["compaction_trigger"] not in COMPACTION_TRIGGERS:
        out.add(pos, row, "compaction_trigger", f"unknown value {row['compaction_trigger']!r}")
    if row["stop_reason"] not in STOP_REASONS:
        out.add(pos, row, "stop_reason", f"unknown value {row['stop_reason']!r}")
    for name in _FLOAT32_SCALAR_FIELDS:
        if not _is_finite_number(row[name]):
            out.add(pos, row, name, f"not a finite number: {row[name]!r}")
    if _is_finite_number(row["loss_weight"]) and row["loss_weight"] < 0:
        out.add(pos, row, "loss_weight", f"negative: {row['loss_weight']}")
    seg, num = row["segment_index"], row["num_segments"]
    if not (isinstance(seg, int) and isinstance(num, int) and 0 <= seg < num):
        out.add(pos, row, "segment_index", f"{seg!r} not in [0, num_segments={num!r})")
    elif row["is_last_segment"] != (seg == num - 1):
        out.add(pos, row, "is_last_segment",
                f"{row['is_last_segment']!r} but segment {seg} of {num}")
    if len(row["prompt_ids"]) == 0:
        out.add(pos, row, "prompt_ids", "empty (a segment starts from at least the task)")
    sampling = row["sampling"]
    if not isinstance(sampling, Mapping) or set(sampling) != set(SAMPLING_TYPE.names):
        out.add(pos, row, "sampling", f"must have exactly the keys {SAMPLING_TYPE.names}")


def _check_token_lists(pos: int, row: Mapping[str, Any], out: _Collector) -> bool:
    n = len(row["response_ids"])
    ok = True
    for name in (*_TOKEN_LIST_FIELDS, "returns"):
        value = row.get(name)
        if value is not None and len(value) != n:
            out.add(pos, row, name, f"length {len(value)} != len(response_ids) {n}")
            ok = False
    bad_mask = [t for t, m in enumerate(row["response_mask"]) if m not in (0, 1)]
    if bad_mask:
        out.add(pos, row, "response_mask", f"values other than 0/1 at tokens {bad_mask[:5]}")
        ok = False
    for name in ("prompt_ids", "response_ids"):
        if any((not isinstance(t, (int, np.integer))) or t < 0 for t in row[name]):
            out.add(pos, row, name, "token ids must be non-negative integers")
            ok = False
    return ok


def _check_logprobs(pos: int, row: Mapping[str, Any], out: _Collector) -> None:
    for t, (m, lp) in enumerate(zip(row["response_mask"], row["rollout_logprobs"], strict=True)):
        if not _is_finite_number(lp) or lp > 0:
            out.add(pos, row, "rollout_logprobs", f"token {t}: {lp!r} is not a finite value <= 0")
            return
        if m == 0 and lp != 0.0:
            out.add(pos, row, "rollout_logprobs", f"token {t}: {lp!r} where mask = 0 (must be 0.0)")
            return


def _check_advantages(pos: int, row: Mapping[str, Any], out: _Collector) -> None:
    masked = bool(row["mask_episode"])
    for t, (m, a) in enumerate(zip(row["response_mask"], row["advantages"], strict=True)):
        if not _is_finite_number(a):
            out.add(pos, row, "advantages", f"token {t}: {a!r} is not finite")
            return
        if (m == 0 or masked) and a != 0.0:
            why = "mask_episode is true" if masked else "mask = 0"
            out.add(pos, row, "advantages", f"token {t}: {a!r} where {why} (must be 0.0)")
            return


def _check_summary_span(pos: int, row: Mapping[str, Any], out: _Collector) -> None:
    span, n = row["summary_span"], len(row["response_ids"])
    if len(span) == 0:
        return
    if len(span) != 2 or not 0 <= span[0] <= span[1] <= n:
        out.add(pos, row, "summary_span", f"{list(span)!r} is not [start, end) within 0..{n}")
        return
    want = int(bool(row["summary_trained"]))
    wrong = [t for t in range(span[0], span[1]) if row["response_mask"][t] != want]
    if wrong:
        out.add(pos, row, "summary_span",
                f"tokens {wrong[:5]} have mask != summary_trained ({want})")


def _check_episode(
    rows: Sequence[Mapping[str, Any]], positions: list[int], out: _Collector
) -> None:
    first = rows[positions[0]]
    for name in _EPISODE_CONSTANT_FIELDS:
        for pos in positions[1:]:
            if rows[pos][name] != first[name]:
                out.add(pos, rows[pos], name,
                        f"{rows[pos][name]!r} differs within the episode ({first[name]!r})")
    indices = [rows[pos]["segment_index"] for pos in positions]
    if indices != list(range(len(positions))):
        out.add(positions[0], first, "segment_index",
                f"episode has segments {indices}, expected 0..{len(positions) - 1} in order")
        return
    _check_episode_totals(rows, positions, out)
    last = rows[positions[-1]]
    mask = last["response_mask"]  # a list, or an array (rows built in memory)
    if not last["mask_episode"] and (len(mask) == 0 or mask[-1] != 1):
        out.add(positions[-1], last, "response_mask",
                "last segment of an unmasked episode must end on a mask-1 token (the sampled EOS)")


def _check_episode_totals(
    rows: Sequence[Mapping[str, Any]], positions: list[int], out: _Collector
) -> None:
    first = rows[positions[0]]
    k = len(positions)
    for name in ("num_segments", "episode_num_segments"):
        if first[name] != k:
            out.add(positions[0], first, name, f"{first[name]} but the episode has {k} segments")
    n_loss = sum(sum(rows[pos]["response_mask"]) for pos in positions)
    if first["episode_num_loss_tokens"] != n_loss:
        out.add(positions[0], first, "episode_num_loss_tokens",
                f"{first['episode_num_loss_tokens']} but the episode has {n_loss} mask-1 tokens")


def _check_contiguity(rows: Sequence[Mapping[str, Any]], out: _Collector) -> None:
    for key in ("episode_id", "group_id"):
        closed: set[str] = set()
        for pos, row in enumerate(rows):
            prev = rows[pos - 1][key] if pos else None
            if row[key] != prev:
                if row[key] in closed:
                    out.add(pos, row, key, f"rows of {key} {row[key]!r} are not contiguous")
                if prev is not None:
                    closed.add(prev)
    _check_sample_indices(rows, out)


def _check_sample_indices(rows: Sequence[Mapping[str, Any]], out: _Collector) -> None:
    seen: dict[tuple[str, int], str] = {}
    for pos, row in enumerate(rows):
        key = (row["group_id"], row["sample_index"])
        if seen.setdefault(key, row["episode_id"]) != row["episode_id"]:
            out.add(pos, row, "sample_index",
                    f"{row['sample_index']} already used by episode {seen[key]!r} of the group")


def _check_batch_constants(
    rows: Sequence[Mapping[str, Any]], expected: Mapping[str, str | None], out: _Collector
) -> None:
    for name in _BATCH_CONSTANT_FIELDS:
        want = expected.get(name) or (rows[0][name] if rows else None)
        for pos, row in enumerate(rows):
            if row[name] != want:
                out.add(pos, row, name, f"{row[name]!r} != {want!r} (reject on mismatch)")
                break


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(
        value, bool
    ) and math.isfinite(float(value))


# --------------------------------------------------------------------------- Arrow / files


def to_float32(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copy rows with every float field rounded to float32, as Parquet will store it.

    After this, rows → JSONL → rows → Parquet → rows is the identity (bit-exact).
    """
    out = []
    for row in rows:
        new = dict(row)
        for name in FLOAT32_LIST_FIELDS:
            value = new.get(name)
            if isinstance(value, np.ndarray):  # arrays stay arrays (the exporter's rows)
                new[name] = value.astype(np.float32, copy=False)
            elif value is not None:
                new[name] = np.asarray(value, dtype=np.float32).tolist()
        for name in _FLOAT32_SCALAR_FIELDS:
            new[name] = float(np.float32(new[name]))
        out.append(new)
    return out


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Build an Arrow table with :data:`SEGMENT_SCHEMA` (``returns`` / ``messages_json`` may
    be absent: they are stored as null).

    List fields may be Python lists or NumPy arrays; a column whose values are all arrays
    of a kind the field holds (integers for ids and masks, floats for the float32 fields)
    is built from one concatenated buffer instead of element by element.
    """
    columns = []
    try:
        for f in SEGMENT_SCHEMA:
            values = [row.get(f.name) for row in rows]
            column = _list_column(values, f.type) if pa.types.is_list(f.type) else None
            columns.append(pa.array(values, type=f.type) if column is None else column)
        return pa.Table.from_arrays(columns, schema=SEGMENT_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ExportError(f"rows do not fit SEGMENT_SCHEMA: {exc}") from exc


_NUMPY_TYPES = {pa.int8(): np.int8, pa.int32(): np.int32, pa.float32(): np.float32}


def _list_column(values: Sequence[Any], type_: pa.ListType) -> pa.Array | None:
    """A list column from NumPy arrays, or ``None`` when some value is not a fitting one."""
    dtype = _NUMPY_TYPES.get(type_.value_type)
    if dtype is None:
        return None
    kind = "f" if np.issubdtype(dtype, np.floating) else "iu"
    if not values or not all(isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in kind
                             for v in values):
        return None
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    joined = np.concatenate(values)
    flat = joined.astype(dtype, copy=False)
    if kind == "iu" and flat is not joined and not np.array_equal(flat, joined):
        return None  # an id that does not fit the field's width: let Arrow report it
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=type_.value_type),
                                    type=type_)


def table_to_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Arrow table (any column order, :data:`SEGMENT_SCHEMA` fields) → plain dict rows."""
    table = table.select([f.name for f in SEGMENT_SCHEMA if f.name in table.column_names])
    return list(table.to_pylist())


def write_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Write rows as one Parquet file with :data:`SEGMENT_SCHEMA`."""
    pq.write_table(rows_to_table(rows), str(path))


def _shards(folder: Path, suffix: str) -> list[Path]:
    """The segment shards of a folder: ``segments-*`` files (an export), else every file
    with ``suffix`` except the export's episode table; sorted by name."""
    files = sorted(folder.glob(f"segments-*{suffix}"))
    return files or sorted(p for p in folder.glob(f"*{suffix}") if p.stem != "episodes")


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """Read a Parquet file, or a directory of Parquet segment shards (sorted by name):
    an export's ``segments-*.parquet``, never its ``episodes.parquet``."""
    path = Path(path)
    files = _shards(path, ".parquet") if path.is_dir() else [path]
    rows: list[dict[str, Any]] = []
    for file in files:
        try:
            table = pq.read_table(str(file), schema=SEGMENT_SCHEMA)
        except (OSError, pa.ArrowInvalid) as exc:
            raise TrajectoryError(f"{file}: cannot read segment rows: {exc}") from exc
        rows.extend(table_to_rows(table))
    return rows


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: str | Path) -> None:
    """Write one JSON object per line (floats keep their exact float64 repr)."""
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read rows written by :func:`write_jsonl`; errors name the file and line."""
    return list(_iter_jsonl(Path(path)))


def _iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrajectoryError(f"{path}:{lineno}: not a JSON segment row: {exc}") from exc


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read ``.jsonl`` / ``.parquet`` by suffix, or a folder of segment shards (an export
    folder: its ``segments-*`` files, Parquet or JSONL, without the episode table)."""
    path = Path(path)
    if path.is_dir():
        parquet, jsonl = _shards(path, ".parquet"), _shards(path, ".jsonl")
        if parquet and jsonl:
            raise TrajectoryError(f"{path}: holds both Parquet and JSONL segment shards")
        return read_parquet(path) if parquet else [r for f in jsonl for r in read_jsonl(f)]
    if path.suffix == ".parquet":
        return read_parquet(path)
    if path.suffix in (".jsonl", ".json"):
        return read_jsonl(path)
    raise TrajectoryError(f"{path}: unknown segment-row file type (want .jsonl or .parquet)")
