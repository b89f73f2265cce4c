"""Salient-item extraction: the fast word cut and error-line search find exactly what the
documented patterns (``_WORD``, ``SALIENT_PATTERNS``) find, items come in order of first
appearance on every run, and the replay's shortcuts for unchanged histories give the
figures of the full per-message accounting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from agentcompact.replay import (
    SALIENT_PATTERNS,
    ContenderSettings,
    FullHistory,
    ItemIndex,
    Sent,
    extract_items,
    replay_trajectory,
    resolve_price,
)
from agentcompact.replay._recall import _WORD, _line_items, _words_of
from agentcompact.trajectory import Trajectory

from .test_figures import SESSION, WordCounter

TEXTS = [
    "",
    "Read src/app/db.py and setup.cfg; call os.path.join, my_func, CamelCase. 3.14. 8080",
    "naïve café/über.py x\u00e9y ünïcödé_name 📋 src/📋/a.py ~/.claude/x.jsonl a.b.c...",
    "lone surrogate \ud800 src/app.py",
    "ValueError: boom at line 12 of the module\nErrorX is not one\nerror: this one is\n",
    "  > Traceback (most recent call last):\n  File x\nKeyError: 'k'\nErroré nope here",
    "Error_ no; Error\u00b2 no; Error\u0660 no; Error! yes, a short line",
    "FAILED tests/test_x.py::test_y - AssertionError: expected 3\nFAILEDX nope nope nope",
    "fatal: not a git repository (or any parent)\npanic: runtime error: index out of range",
    "two on one line: ValueError and TypeError and error: and fatal: here",
    "Error",
    'the tool said {"command": "cd /x && pytest -q\\nmore", "cmd": "ls"}\n$ make test\n',
]


def reference_line_items(text: str) -> dict[str, str]:
    """The error lines as the ``error`` pattern defines them (a regex scan)."""
    out: dict[str, str] = {}
    line_end = -1
    for m in SALIENT_PATTERNS["error"].finditer(text):
        if m.start() < line_end:
            continue
        start = text.rfind("\n", 0, m.start()) + 1
        line_end = text.find("\n", m.end())
        line_end = len(text) if line_end < 0 else line_end
        value = " ".join(text[start:line_end].lstrip(" \t>|").split())
        if 12 <= len(value) <= 200:
            out.setdefault(value, "error")
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_word_cut_is_the_word_pattern(text: str) -> None:
    expected = list(dict.fromkeys(_WORD.findall(text)))
    assert [w.decode() for w in _words_of(text)] == expected


@pytest.mark.parametrize("text", TEXTS)
def test_error_lines_are_the_error_pattern(text: str) -> None:
    found = {k: v for k, v in _line_items(text).items() if v == "error"}
    assert list(found.items()) == list(reference_line_items(text).items())


def test_items_come_in_order_of_first_appearance() -> None:
    items = extract_items("zeta_item then src/a.py then 4096 then alpha_item then zeta_item")
    assert list(items) == ["zeta_item", "src/a.py", "4096", "alpha_item"]
    index = ItemIndex(["b_two a_one", "c_three b_two"])
    assert [list(i) for i in index.items] == [["b_two", "a_one"], ["c_three", "b_two"]]
    assert index.postings["b_two"] == [0, 1]


def test_item_order_does_not_depend_on_the_hash_seed() -> None:
    code = ("import json, sys; from agentcompact.replay import ItemIndex; "
            "texts = json.load(sys.stdin); i = ItemIndex(texts); "
            "print(json.dumps([list(x.items()) for x in i.items]))")
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code], input=json.dumps(TEXTS), env=env,
                              capture_output=True, text=True, check=True)
        outputs.add(done.stdout)
    assert len(outputs) == 1


class Copying(FullHistory):
    """The full history as a new list of the same messages: accounted message by message."""

    name = "copying"

    def prepare(self, messages: list[Any]) -> Sent:
        return Sent(list(messages))


@pytest.mark.parametrize("system", [None, "You are terse. Use src/app/db.py. " * 5])
def test_unchanged_history_shortcut_gives_the_per_message_figures(system: str | None) -> None:
    traj = Trajectory(source="t", format="test", dialect="anthropic",
                      messages=list(SESSION), system=system)
    settings = ContenderSettings(trigger=10**6, counter=WordCounter())
    price = resolve_price(None, None, "anthropic")
    done = replay_trajectory(traj, ["none", "copying"], settings, price,
                             contenders={"copying": Copying()})
    fast, slow = done.runs["none"].to_dict(), done.runs["copying"].to_dict()
    for figures in (fast, slow):
        del figures["totals"]["time_s"], figures["totals"]["ms_per_call"]
        del figures["totals"]["max_ms_per_call"], figures["series"]["time_s"]
    assert fast == slow
    assert sum(done.runs["none"].needed) > 0 and done.runs["none"].cached[-1] > 0
