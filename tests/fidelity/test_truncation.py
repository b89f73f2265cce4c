"""Truncation keeps what matters, verbatim: head, tail, error lines; counts what it elides."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompact import get_dialect, new_plugin_manager
from agentcompact._archive import handle_of
from agentcompact.dialects._base import head_tail, truncation_pieces

PYTEST_LOG = (
    "============================= test session starts ==============================\n"
    + "".join(f"tests/test_orders.py::test_case_{i} PASSED{' ' * 20}[{i:3d}%]\n"
              for i in range(60))
    + "    def test_total():\n        order = make_order()\n"
    + ">       assert order.total() == 12\n"
    + "E       KeyError: 'currency'\n"
    + "".join(f"src/orders.py:{i}: in total\n    value = self.lines[{i}]\n" for i in range(30))
    + "FAILED tests/test_orders.py::test_total - KeyError: 'currency'\n"
    + "=================== 1 failed, 60 passed in 0.52s ===================\n"
)
_MARKER = re.compile(r"\[… (\d+) lines? elided, (\d+) chars omitted(?: · expand (ac-\w+))? …\]\n")


def test_pytest_error_survives_a_tight_cut() -> None:
    out = head_tail(PYTEST_LOG, 900, handle=handle_of(PYTEST_LOG))
    assert "E       KeyError: 'currency'\n" in out
    assert ">       assert order.total() == 12\n" in out
    assert "FAILED tests/test_orders.py::test_total - KeyError: 'currency'\n" in out
    assert out.startswith("=====") and out.endswith("in 0.52s ===================\n")
    assert len(out) < 1_300
    markers = _MARKER.findall(out)
    assert markers and markers[0][2] == handle_of(PYTEST_LOG)  # the handle, named once
    assert all(not h for _, _, h in markers[1:])


def _check_pieces(text: str, limit: int) -> None:
    pieces = truncation_pieces(text, limit, handle="ac-0123456789ab")
    kept = [t for verbatim, t in pieces if verbatim]
    position = 0
    for piece in kept:  # verbatim slices, in order
        found = text.find(piece, position)
        assert found >= 0
        position = found + len(piece)
    elided = 0
    for verbatim, t in pieces:
        if not verbatim:
            m = _MARKER.fullmatch(t) or re.fullmatch(
                r"\n\[… (\d+) chars omitted · expand ac-\w+ …\]\n", t)
            assert m is not None, t
            elided += int(m.group(2) if m.re is _MARKER else m.group(1))
    assert sum(map(len, kept)) + elided == len(text)  # every elided char is counted
    if len(text) <= limit:
        assert pieces == [(True, text)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet="ab E:\u00e9\u2603", max_size=60), max_size=80)
       .map("\n".join), st.integers(1, 600))
def test_pieces_are_verbatim_and_count_every_elided_char(text: str, limit: int) -> None:
    _check_pieces(text, limit)


def test_dialect_truncate_names_the_original_handle() -> None:
    d = get_dialect("anthropic", new_plugin_manager())
    message = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": PYTEST_LOG}]}
    copy = d.truncate(message, 600)
    text = copy["content"][0]["content"]
    assert f"expand {handle_of(PYTEST_LOG)}" in text and "KeyError: 'currency'" in text
    assert message["content"][0]["content"] == PYTEST_LOG  # the original is untouched


_LINE_BITS = ["Traceback (most recent call last):", "E   KeyError: 'x'", "E", "Error", "error:",
              "ERROR", "1 failed", "3 errors", "exit code 2", "Exit_Code", "returncode=1",
              "returned non-zero", "assert x", "AssertionError", "panic:", "fatal", "FAILED",
              "Killed", "Segmentation fault", "No such file", "command not found",
              "Permission denied", "Exception", "ok", "x" * 420, "errorless", "E\u2028x", "\r"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_LINE_BITS) | st.text(max_size=12), max_size=4)
                .map(" ".join), min_size=1, max_size=40),
       st.sampled_from(["\n", "\r\n", "\r", "\x0c", "\u2028"]))
def test_error_lines_are_the_lines_the_regex_matches(lines: list[str], sep: str) -> None:
    from agentcompact.dialects._base import _ERROR_LINE_MAX, ERROR_LINE, _error_lines

    text = sep.join(lines)
    split = text.splitlines(keepends=True)
    expected = [i for i, line in enumerate(split)
                if len(line) <= _ERROR_LINE_MAX and ERROR_LINE.search(line)]
    assert _error_lines(text, split) == expected
