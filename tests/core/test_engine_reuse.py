"""What the engine reuses from one call to the next gives exactly what a fresh engine
computes from scratch: figures of messages shared with the previous call (the same
objects, or byte-identical JSON parsed afresh and given to ``compact_request``, whose
``Interner`` maps them to the earlier objects), the prefix-store lookup that skips prefixes
it already found empty, and the dialects' fast ``counted_text``."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompact import (
    Budget,
    Engine,
    InMemoryPrefixStore,
    PrefixEntry,
    hookimpl,
    new_plugin_manager,
)
from agentcompact._store import PrefixScan, chain_digests
from agentcompact.dialects import Dialect

from .histories import build, call_points

DIALECTS = ["openai_chat", "anthropic", "openai_responses", "gemini"]
PLAN = [(60, [1500, 200], 0), (40, [3000], 80), (0, [800, 800, 800], 0)] * 8


def engine(dialect: str, trigger: int = 3000, **kw: Any) -> Engine:
    kw.setdefault("plugins", new_plugin_manager())
    return Engine(strategy="cliff", dialect=dialect, budget=Budget(trigger_tokens=trigger), **kw)


def _never() -> Any:
    """A plugin manager whose should_compact always says no (an engine of the same
    settings that only looks prefixes up: store keys include the settings)."""
    pm = new_plugin_manager()

    class Never:
        @hookimpl
        def agentcompact_should_compact(self, tokens: int) -> bool:
            return False

    pm.register(Never())
    return pm


def outcome(result: Any) -> tuple[Any, ...]:
    events = [(e.reason, e.cut, e.head_len, e.tokens_before, e.tokens_after)
              for e in result.events]
    return ([json.dumps(m, sort_keys=True) for m in result.messages], result.compacted,
            result.modified, result.tokens_original, result.tokens_before, result.tokens_after,
            result.head_len, result.cut, events)


def edited_histories(name: str) -> list[list[Any]]:
    """Each call's history as a proxy sees it (parsed afresh), with edits a client may make
    between calls: a changed message, a number turned into a bool or a float, a message
    removed, a volatile ``cache_control`` marker moving, a different history."""
    msgs = build(name, PLAN)
    msgs[1] = {**msgs[1], "meta": {"n": 1}}
    blob = orjson.dumps(msgs)
    points = call_points(msgs, Engine(dialect=name, plugins=new_plugin_manager()).dialect)
    out: list[list[Any]] = []
    for k, c in enumerate(points):
        ctx = orjson.loads(blob)[:c]
        if k % 7 == 3:
            ctx[1]["meta"]["n"] = True  # == 1 in Python, another message in JSON
        if k % 7 == 4:
            ctx[1]["meta"]["n"] = 1.0
        if k % 5 == 2 and c > 6:
            victim = ctx[c // 2]
            for key in ("content", "output", "arguments"):
                if isinstance(victim.get(key), str):
                    victim[key] = victim[key] + " (edited)"
        if k % 9 == 5 and name == "anthropic" and isinstance(ctx[-1]["content"], list):
            ctx[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        out.append(ctx)
        if k == len(points) // 2:
            out.append(orjson.loads(blob)[:c][:3])  # the history shrank
            out.append(orjson.loads(orjson.dumps(build(name, PLAN[::-1])))[: c // 2])
    return out


@pytest.mark.parametrize("name", DIALECTS)
def test_fresh_copies_with_edits_match_an_engine_starting_from_scratch(name: str) -> None:
    ours = engine(name)
    scratch_store = InMemoryPrefixStore()
    for ctx in edited_histories(name):
        fresh = engine(name, store=scratch_store)  # a new engine: nothing from earlier calls
        assert outcome(ours.compact(ctx)) == outcome(fresh.compact(copy.deepcopy(ctx)))
        assert ours.count(ctx) == fresh.count(ctx)
        assert ours.context_tokens(ctx) == fresh.context_tokens(ctx)


@pytest.mark.parametrize("name", DIALECTS)
def test_bodies_parsed_afresh_match_an_engine_starting_from_scratch(name: str) -> None:
    """``compact_request`` on bodies parsed afresh (edits, a shrunk and a branched history
    among them) gives what a new engine gives, and sends the caller's own message objects,
    never the earlier bodies' ones it measured them as."""
    ours = engine(name)
    scratch_store = InMemoryPrefixStore()
    key = ours.dialect.messages_key
    for ctx in edited_histories(name):
        fresh = engine(name, store=scratch_store)
        body, result = ours.compact_request({key: ctx})
        expected = fresh.compact(copy.deepcopy(ctx))
        assert outcome(result) == outcome(expected)
        mine = {id(m) for m in ctx}
        earlier = [m for m in body[key] if id(m) not in mine and any(
            json.dumps(m, sort_keys=True) == json.dumps(c, sort_keys=True) for c in ctx)]
        assert not earlier  # a message equal to one of ctx's is ctx's own object


def test_interner_maps_byte_identical_messages_only_at_their_position() -> None:
    from agentcompact._interner import Interner

    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    interner = Interner()
    assert interner.intern(first) == first
    again = orjson.loads(orjson.dumps(first)) + [{"role": "user", "content": "c"}]
    out = interner.intern(again)
    assert out[0] is first[0] and out[1] is first[1] and out[2] is again[2]
    reordered = {"content": "a", "role": "user"}  # equal, not byte-identical: measured
    swapped = [reordered, {"role": "user", "content": "a"}]  # first's [0] at position 1
    out = interner.intern(swapped)
    assert out[0] is reordered and out[1] is swapped[1]


@pytest.mark.parametrize("name", DIALECTS)
def test_same_objects_shrunk_and_branched_match_an_engine_starting_from_scratch(
        name: str) -> None:
    msgs = build(name, PLAN)
    ours = engine(name)
    points = call_points(msgs, ours.dialect)
    half = points[len(points) // 2]
    swapped = list(msgs)
    swapped[half // 2] = copy.deepcopy(msgs[half // 2])  # equal content, another object
    edited = list(msgs)
    edited[3] = {**msgs[3], "extra": "a changed message, same position"}
    histories = [msgs[:c] for c in points[: len(points) // 2 + 1]]
    histories += [msgs[: half - 2], msgs[:half], swapped[:half], edited[:half], msgs[:3], msgs]
    scratch_store = InMemoryPrefixStore()
    for ctx in histories:
        fresh = engine(name, store=scratch_store)
        assert outcome(ours.compact(ctx)) == outcome(fresh.compact(list(ctx)))


@pytest.mark.parametrize("name", DIALECTS)
def test_same_objects_and_fresh_copies_give_the_same_results(name: str) -> None:
    msgs = build(name, PLAN)
    by_object, by_copy = engine(name), engine(name)
    blob = orjson.dumps(msgs)
    for c in call_points(msgs, by_object.dialect):
        a = by_object.compact(msgs[:c])
        b = by_copy.compact(orjson.loads(blob)[:c])
        assert outcome(a) == outcome(b)


@pytest.mark.parametrize("name", DIALECTS)
def test_an_entry_put_by_another_engine_is_found_at_prefixes_already_checked(
        name: str) -> None:
    store = InMemoryPrefixStore()
    watcher = engine(name, store=store, plugins=_never())  # never compacts, only looks up
    worker = engine(name, store=store)
    msgs = build(name, PLAN)
    assert not watcher.compact(msgs).modified  # every prefix checked: the store is empty
    done = worker.compact(msgs)
    assert done.compacted and 0 < done.cut < len(msgs)
    seen = watcher.compact(msgs)  # the same history: the new entry must be found
    assert seen.modified and not seen.compacted
    assert outcome(seen)[0] == outcome(done)[0] and seen.tokens_after == done.tokens_after


def test_the_configuration_is_read_only() -> None:
    """The store, budget and the rest seed the prefix-store keys and the lookup memo: they
    are fixed at construction (a new episode goes through ``new_episode``)."""
    e = engine("openai_chat")
    for name, value in (("store", InMemoryPrefixStore()), ("budget", e.budget),
                        ("episode_id", "other"), ("strategy", e.strategy), ("pm", e.pm),
                        ("dialect", e.dialect), ("counter", e.counter), ("strict", True)):
        with pytest.raises(AttributeError):
            setattr(e, name, value)
    assert e.new_episode("other") == "other" == e.episode_id


class DictStore:
    """A plain prefix store without a ``version``: every lookup checks every prefix."""

    def __init__(self) -> None:
        self.data: dict[str, PrefixEntry] = {}

    def get(self, key: str) -> PrefixEntry | None:
        return self.data.get(key)

    def put(self, key: str, entry: PrefixEntry) -> None:
        self.data[key] = entry


@pytest.mark.parametrize("name", DIALECTS)
def test_stores_without_a_version_give_the_same_results(name: str) -> None:
    msgs = build(name, PLAN)
    versioned, plain = engine(name), engine(name, store=DictStore())
    for c in call_points(msgs, versioned.dialect):
        assert outcome(versioned.compact(msgs[:c])) == outcome(plain.compact(msgs[:c]))
    assert isinstance(versioned.store, InMemoryPrefixStore) and versioned.store.version > 0


EDGE = {
    "gemini": [
        {"role": "user", "parts": [{"text": ""}]},
        {"parts": [{"text": "no role"}, {"inlineData": {"mimeType": "image/png", "data": "AA"}},
                   {"file_data": {"fileUri": "gs://x"}}, "not a part"]},
        {"role": "user", "parts": None},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "read", "response": {"output": "r", "n": 3},
                                  "parts": [{"inlineData": {"data": "AA"}}]}},
            {"function_response": {"name": "read", "response": "not an object"}},
            {"functionResponse": {"name": "read"}}]},
        {"role": "model", "parts": [
            {"text": "t", "thought": True}, {"thoughtSignature": "c2ln"},
            {"functionCall": {"name": "bash"}, "thoughtSignature": "c2ln"},
            {"function_call": {"id": "x", "name": "f", "args": {"a": 1}}},
            {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
            {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "1"}},
            {"x_future_part": {"note": 1}}]},
    ],
    "anthropic": [
        {"role": "user", "content": ""},
        {"role": None, "content": "x"},
        {"content": [{"type": "tool_result", "tool_use_id": "w", "content": "r"}]},
        {"role": "user", "content": None},
        {"role": "user", "content": [
            {"type": "image", "source": {}}, {"type": "document", "source": {}},
            {"type": "text", "text": ""}, {"type": "text", "text": "a"}, "not a block",
            {"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "r"}, {"type": "image", "source": {}}]},
            {"type": "tool_result", "tool_use_id": "u", "content": ""},
        ]},
        {"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "x"}, {"type": "thinking", "thinking": "t"},
            {"type": "server_tool_use", "id": "s", "name": "web", "input": {"q": 1}},
            {"type": "tool_use", "id": "v", "name": "bash"}, {"type": "web_search_result"},
        ]},
    ],
    "openai_chat": [
        {"role": "tool", "tool_call_id": "a", "content": [
            {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {}},
            {"type": "text", "text": ""}]},
        {"role": "tool", "tool_call_id": "b", "content": None, "reasoning_content": "why"},
        {"role": "function", "content": "f"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "t"}, {"type": "refusal", "refusal": "no"},
            {"type": "input_audio"}, {"type": "file"}, {"type": "text", "text": ""}, "odd"],
         "reasoning": "r", "tool_calls": [{"id": "c"}, {"id": "d", "function": {
             "name": "f", "arguments": ""}}, {"id": "e", "function": {"arguments": "{}"}}]},
        {"role": "user", "content": 5},
        {"role": "user", "content": ""},
    ],
    "openai_responses": [
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "a"}, {"type": "input_image"}]},
        {"type": "reasoning", "summary": [{"text": "s"}]},
        {"type": "function_call_output", "call_id": "c", "output": [{"text": "o"}]},
    ],
}


@pytest.mark.parametrize("name", DIALECTS)
def test_counted_text_is_the_text_and_images_of_the_parts(name: str) -> None:
    """... and ``is_model_output`` is ``role == "assistant"`` (dialects answer directly)."""
    dialect = engine(name).dialect
    for message in [*build(name, PLAN), *EDGE[name]]:
        parts = dialect.parts(message)
        expected = ("\n".join(p.text for p in parts if p.text),
                    sum(1 for p in parts if p.kind == "image"))
        assert dialect.counted_text(message) == expected
        assert Dialect.counted_text(dialect, message) == expected
        assert dialect.text_of(message) == expected[0]
        assert dialect.is_model_output(message) == (dialect.role(message) == "assistant")


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=0, max_size=12),
                                st.lists(st.integers(1, 12), max_size=2)),
                      min_size=1, max_size=12))
def test_prefix_scan_finds_what_a_scan_of_every_length_finds(steps: Any) -> None:
    """``PrefixScan`` skips lengths it found empty before (same version, same chain up to
    them): histories that grow, shrink, branch and change their last message, with
    entries put between the scans, give the longest stored prefix every time that leaves
    some of the history after its cut."""
    store = InMemoryPrefixStore()
    scan = PrefixScan(store)
    for symbols, puts in steps:
        chain = chain_digests([str(s) for s in symbols], seed="s")
        n = len(chain)
        stored = (store.get(chain[i - 1]) for i in range(n, 0, -1))
        expected = next((e for e in stored if e is not None and e.cut < n), None)
        assert scan.find(chain, n) is expected
        for cut in puts:
            if cut <= n:
                store.put(chain[cut - 1], PrefixEntry(0, cut, {"cut": cut}, 1, "cliff"))


def test_a_history_ending_where_a_stored_cut_is_keeps_its_own_last_message() -> None:
    """A retried or forked request whose history is exactly the prefix a later compaction
    replaced (its cut) is not answered with that compaction alone: its newest messages
    are sent as they are, and a call after it still reuses the stored entry."""
    from tests.integrations.proxy.histories import anthropic_history

    store = InMemoryPrefixStore()
    full = anthropic_history(30, result_tokens=300)
    first = Engine("cliff", "anthropic", Budget(trigger_tokens=6000), counter="chars",
                   store=store, episode_id="s")
    for n in range(3, len(full) + 1, 2):
        first.compact(full[:n])
    cuts = sorted({e.cut for e, _ in store._data.values()})
    assert cuts
    for cut in cuts:
        again = Engine("cliff", "anthropic", Budget(trigger_tokens=6000), counter="chars",
                       store=store, episode_id="s")
        out = again.compact(full[:cut]).messages
        assert out[-1] is full[cut - 1]  # its own last message, not a compaction
        later = again.compact(full[:cut + 2])  # the next call finds the stored entry
        assert later.modified and not later.compacted
