"""The fold: a large tool output of the newest kept turn stays whole at a compaction (the
agent has not read it) and is truncated at the first call after the agent has."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from agentcompact import Budget, Engine, MemoryArchive, StrategySettings, expand, new_plugin_manager
from agentcompact._archive import handle_of
from tests.core.histories import build, call_points

# ten small turns, then a tool output large enough to cross the trigger, then small ones
PLAN = [(60, [1000], 0)] * 14 + [(60, [10_000], 0)] + [(60, [300], 0)] * 4


def make(dialect: str, archive: Any = None) -> Engine:
    options = {} if archive is None else {"archive": archive}
    return Engine(StrategySettings("cliff", options=options), dialect, Budget(6_000, 2_000),
                  plugins=new_plugin_manager())


def dumps(messages: list[Any]) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in messages]


def big_output(engine: Engine, msgs: list[Any]) -> str:
    return max((p.text for m in msgs for p in engine.dialect.parts(m)
                if p.kind == "tool_result"), key=len)


@pytest.mark.parametrize("dialect", ["anthropic", "openai_chat", "openai_responses", "gemini"])
def test_newest_output_is_whole_at_the_compaction_and_folded_once_read(dialect: str) -> None:
    archive = MemoryArchive()
    engine = make(dialect, archive)
    msgs = build(dialect, PLAN)
    big = big_output(engine, msgs)
    text = engine.dialect.text_of
    reasons: list[list[str]] = []
    sent: list[str] = []
    for c in call_points(msgs, engine.dialect):
        result = engine.compact(msgs[:c])
        reasons.append([e.reason for e in result.events])
        sent.append("\n".join(text(m) for m in result.messages))
    at = next(k for k, r in enumerate(reasons) if "trigger" in r)
    assert big in sent[at]  # the agent has not read it: whole
    assert reasons[at + 1] == ["fold"]  # the next call: the agent has read it
    assert big not in sent[at + 1]
    assert f"expand {handle_of(big)}" in sent[at + 1]
    assert expand(archive, handle_of(big), 0, 100_000).text == big  # byte-identical
    assert all(r == [] for r in reasons[at + 2:])  # once


@pytest.mark.parametrize("dialect", ["anthropic", "openai_chat", "openai_responses", "gemini"])
def test_the_fold_lands_near_the_target_and_saves_tokens(dialect: str) -> None:
    engine = make(dialect)
    msgs = build(dialect, PLAN)
    results = [engine.compact(msgs[:c]) for c in call_points(msgs, engine.dialect)]
    at = next(k for k, r in enumerate(results) if r.events and r.events[0].reason == "trigger")
    compaction, fold = results[at].events[0], results[at + 1].events[0]
    assert compaction.tokens_after <= 6_000  # never over the trigger
    assert fold.tokens_after < fold.tokens_before - 1_000
    assert fold.dropped and all(d.action == "truncated" for d in fold.dropped)
    # the compaction message had room as if the output were folded: after the fold the
    # context is about the target (the call's new messages aside)
    assert results[at + 1].tokens_after <= 2_000 * 1.5


@pytest.mark.parametrize("dialect", ["anthropic", "openai_chat", "openai_responses", "gemini"])
def test_replay_equals_incremental_with_a_fold(dialect: str) -> None:
    engine = make(dialect)
    msgs = build(dialect, PLAN)
    last = None
    folds = 0
    for c in call_points(msgs, engine.dialect):
        last = engine.compact(msgs[:c])
        folds += sum(e.reason == "fold" for e in last.events)
    assert folds == 1 and last is not None
    again = make(dialect).compact(msgs)
    assert [e.reason for e in again.events].count("fold") == 1
    assert dumps(again.messages) == dumps(last.messages)


def test_a_pinned_output_is_never_folded() -> None:
    class PinBig:
        from agentcompact import hookimpl

        @hookimpl
        def agentcompact_pin(self, message: Any, index: int, dialect: Any) -> bool | None:
            return True if any(len(p.text) > 5_000 for p in dialect.parts(message)) else None

    pm = new_plugin_manager()
    pm.register(PinBig())
    engine = Engine("cliff", "anthropic", Budget(6_000, 2_000), plugins=pm)
    msgs = build("anthropic", PLAN)
    big = big_output(engine, msgs)
    reasons = []
    for c in call_points(msgs, engine.dialect):
        result = engine.compact(msgs[:c])
        reasons += [e.reason for e in result.events]
        assert "fold" not in reasons
    assert big in "\n".join(engine.dialect.text_of(m) for m in result.messages)


def test_an_entry_round_trips_its_folds() -> None:
    from agentcompact._store import PrefixEntry

    entry = PrefixEntry(1, 5, {"role": "user", "content": "x"}, 3, "cliff", 0, {}, (),
                        ((4, "abc"),))
    assert PrefixEntry.from_dict(json.loads(json.dumps(entry.to_dict()))) == entry
    old = {k: v for k, v in entry.to_dict().items() if k != "folds"}  # stored before folds
    assert PrefixEntry.from_dict(old).folds == ()
    assert re.fullmatch(r"\(\(4, 'abc'\),\)", repr(entry.folds))
    folded = PrefixEntry(1, 5, {"role": "user", "content": "x"}, 3, "cliff", length=7)
    back = PrefixEntry.from_dict(json.loads(json.dumps(folded.to_dict())))
    assert back == folded and back.key_length == 7 and entry.key_length == 5
    assert PrefixEntry.from_dict({k: v for k, v in folded.to_dict().items()
                                  if k != "length"}).key_length == 5  # stored before


@pytest.mark.parametrize("dialect", ["anthropic", "openai_chat", "openai_responses", "gemini"])
def test_a_retry_of_the_compacting_call_after_the_fold_still_sends_the_output_whole(
        dialect: str) -> None:
    """A client retrying the request that compacted (an overloaded upstream, a dropped
    connection), or another rollout from the same prefix, after a later call folded:
    the agent has still not read the output there, so it goes whole again."""
    engine = make(dialect)
    msgs = build(dialect, PLAN)
    points = call_points(msgs, engine.dialect)
    sent: dict[int, list[str]] = {}
    reasons: dict[int, list[str]] = {}
    for c in points:
        result = engine.compact(msgs[:c])
        sent[c], reasons[c] = dumps(result.messages), [e.reason for e in result.events]
    at = next(c for c in points if "trigger" in reasons[c])
    after = points[points.index(at) + 1]
    assert reasons[after] == ["fold"]
    retry = engine.compact(msgs[:at])
    assert dumps(retry.messages) == sent[at]
    assert big_output(engine, msgs) in "\n".join(engine.dialect.text_of(m)
                                                 for m in retry.messages)
    again = engine.compact(msgs[:after])  # and the call after it is folded again, the same
    assert dumps(again.messages) == sent[after]


#: the first item of every ``custom_tool_call_output`` of Codex CLI 0.171's ``exec`` tool
CODEX_PREAMBLE = {"type": "input_text",
                  "text": "Script completed\nWall time 0.1 seconds\nOutput:\n"}


def codex_outputs(msgs: list[Any]) -> list[Any]:
    """``msgs`` (openai_responses) with every tool output as Codex CLI 0.171 sends its
    ``exec`` tool's (captured from the real CLI through the proxy): a list of content
    items, a preamble and the command's output."""
    return [{**m, "type": "custom_tool_call_output",
             "output": [CODEX_PREAMBLE, {"type": "input_text", "text": m["output"]}]}
            if m.get("type") == "function_call_output" else m for m in msgs]


def test_a_codex_output_of_content_items_is_folded_and_expands_to_its_original() -> None:
    """Codex CLI 0.171 sends tool outputs as lists of ``input_text`` items: the fold (and
    the tail truncation that makes room for the strategy) cut the long item, name its
    handle, and keep the preamble and the structure; the archive holds the original item
    text under that handle (before, the dialect only cut string outputs: no fold in a
    real Codex session)."""
    archive = MemoryArchive()
    engine = make("openai_responses", archive)
    msgs = codex_outputs(build("openai_responses", PLAN))
    big = max((m["output"][1]["text"] for m in msgs
               if m.get("type") == "custom_tool_call_output"), key=len)
    before = dumps(msgs)
    reasons, sent = [], []
    for c in call_points(msgs, engine.dialect):
        result = engine.compact(msgs[:c])
        reasons.append([e.reason for e in result.events])
        sent.append(result.messages)
    assert dumps(msgs) == before  # the input is never mutated
    at = next(k for k, r in enumerate(reasons) if "trigger" in r)
    assert reasons[at + 1] == ["fold"]
    folded = [m for m in sent[at + 1] if m.get("type") == "custom_tool_call_output"
              and m["output"][1]["text"] != big and big.startswith(m["output"][1]["text"][:50])]
    (out,) = [m for m in folded if f"expand {handle_of(big)}" in m["output"][1]["text"]]
    assert out["output"][0] == CODEX_PREAMBLE and len(out["output"]) == 2
    assert len(out["output"][1]["text"]) < len(big) // 3
    assert expand(archive, handle_of(big), 0, 100_000).text == big


@pytest.mark.parametrize("dialect", ["anthropic", "openai_chat", "openai_responses", "gemini"])
def test_every_handle_truncate_names_is_of_a_text_truncation_texts_gives(dialect: str) -> None:
    """What the archive holds for a message the engine may truncate is what the marker
    names: each handle in ``truncate``'s output is the handle of one of the message's
    ``truncation_texts`` (lists of blocks and content items included)."""
    engine = make(dialect)
    d = engine.dialect
    msgs = build(dialect, PLAN)
    if dialect == "openai_responses":
        msgs += codex_outputs(msgs)
    if dialect == "anthropic":  # a tool result of two text blocks
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                     "content": [{"type": "text", "text": "a" * 3000},
                                 {"type": "text", "text": "b" * 3000}]}]})
    handles = re.compile(r"expand (\S+?)[\]\s·]")
    named = 0
    for m in msgs:
        cut = d.truncate(m, 500)
        if cut is m:
            continue
        found = set(handles.findall(json.loads(json.dumps(cut)).__repr__()))
        assert found, m
        assert found <= {handle_of(t) for t in d.truncation_texts(m)}
        named += len(found)
    assert named >= 2
