"""``_line_pieces`` works by the lines it keeps, not by every line: it must cut exactly as
the plain per-line computation (the reference below, the earlier implementation)."""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompact._markers import lines_elision
from agentcompact.dialects._base import Piece, _line_pieces, line_index

LINES = ["ok", "", "  indented line", "Traceback (most recent call last):", "E   assert 1 == 2",
         "exit code 1", "x" * 90, "y" * 700, "a", "bb", "Error: boom", "\r", "z" * 59, "w" * 61,
         "FAILED tests/test_app.py::test_x - AssertionError", "\x0b", "\u2028"]


def reference(text: str, budget: int, handle: str) -> list[Piece] | None:
    lines, errors = line_index(text)
    n = len(lines)
    keep = [False] * n
    used = 0

    def take(i: int, limit: int) -> bool:
        nonlocal used
        if keep[i] or used + len(lines[i]) > limit:
            return False
        keep[i] = True
        used += len(lines[i])
        return True

    head_end = 0
    while head_end < n and take(head_end, budget * 3 // 10):
        head_end += 1
    tail_start = n
    tail_limit = used + budget * 3 // 10
    while tail_start > head_end and take(tail_start - 1, tail_limit):
        tail_start -= 1
    for i in reversed(errors[bisect_left(errors, head_end):bisect_left(errors, tail_start)]):
        take(i, budget)
    while tail_start > head_end and take(tail_start - 1, budget):
        tail_start -= 1
    if used < budget // 4:
        return None
    for i in range(1, n - 1):
        if not keep[i] and keep[i - 1] and keep[i + 1] and len(lines[i]) <= 60:
            keep[i] = True
    out: list[Piece] = []
    run: list[str] = []
    gap_lines = gap_chars = 0
    for line, kept in zip(lines, keep):
        if kept:
            if gap_lines:
                out.append((False, lines_elision(gap_lines, gap_chars, handle)))
                gap_lines = gap_chars = 0
                handle = ""
            run.append(line)
            continue
        if run:
            out.append((True, "".join(run)))
            run = []
        gap_lines += 1
        gap_chars += len(line)
    if run:
        out.append((True, "".join(run)))
    if gap_lines:
        out.append((False, lines_elision(gap_lines, gap_chars, handle)))
    return out


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(st.sampled_from(LINES), min_size=1, max_size=80),
       joiner=st.sampled_from(["\n", "\r\n", "\n\n"]), budget=st.integers(0, 3_000),
       handle=st.sampled_from(["", "ac-0123456789ab"]))
def test_line_pieces_cut_as_the_per_line_computation(lines: list[str], joiner: str,
                                                     budget: int, handle: str) -> None:
    text = joiner.join(lines)
    assert _line_pieces(text, budget, handle, line_index(text)) == reference(text, budget,
                                                                             handle)
