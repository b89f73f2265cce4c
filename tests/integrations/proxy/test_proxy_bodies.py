"""Incremental body parsing (``BodyCache``) and span-based encoding: every parse must equal a
fresh ``orjson`` parse, reused messages must be the earlier objects, and an encoded body must
carry unchanged messages as the client's own bytes."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from agentcompact.integrations.proxy._bodies import BodyCache, Common, encode, scan_body

from .histories import anthropic_history, chat_history, responses_history

Serializer = Callable[[Any], bytes]

SERIALIZERS: dict[str, Serializer] = {
    "orjson": orjson.dumps,
    "json-default": lambda v: json.dumps(v).encode(),  # ", " / ": ", \\uXXXX escapes
    "json-compact-utf8": lambda v: json.dumps(v, separators=(",", ":"),
                                              ensure_ascii=False).encode(),
    "json-indent": lambda v: json.dumps(v, indent=2, ensure_ascii=False).encode(),
}

TRICKY = ['quote " inside', "backslash \\", 'escaped \\" quote', "brackets ] } [ {",
          "line\nbreak\ttab", "unicode é ü 漢字 \u2028 😀", "\\\\\"", "x" * 3000, ""]


def body_of(messages: list[Any], key: str = "messages", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 100, key: messages, **extra}


def check(cache: BodyCache, raw: bytes, key: str = "messages") -> Any:
    parsed = cache.parse(raw, key)
    assert parsed.body == orjson.loads(raw)
    if parsed.messages is not None:
        assert parsed.messages is parsed.body[key]
    return parsed


@pytest.mark.parametrize("serialize", SERIALIZERS.values(), ids=SERIALIZERS.keys())
@pytest.mark.parametrize(("history", "key"), [(anthropic_history, "messages"),
                                              (chat_history, "messages"),
                                              (responses_history, "input")])
def test_growing_history_reuses_the_earlier_objects(serialize: Serializer, history: Any,
                                                    key: str) -> None:
    full = history(12, result_tokens=40)
    for i, text in enumerate(TRICKY):  # strings that trip naive scanners
        full.insert(1 + 2 * i, {"role": "user", "content": text})
        full.insert(2 + 2 * i, {"role": "assistant", "content": text})
    cache = BodyCache()
    previous: list[Any] = []
    for n in range(1, len(full) + 1, 3):
        parsed = check(cache, serialize(body_of(full[:n], key)), key)
        assert parsed.spans
        assert parsed.reused == len(previous)
        assert all(a is b for a, b in zip(parsed.messages, previous))
        previous = parsed.messages
    assert cache.hits == len(range(1, len(full) + 1, 3)) - 1
    assert len(cache) == 1  # one entry per session: the superseded body is dropped


def test_edits_forks_rewinds_and_other_keys_parse_like_a_fresh_parse() -> None:
    rnd = random.Random(7)
    cache = BodyCache()
    messages: list[Any] = [{"role": "user", "content": "task"}]
    forks: list[list[Any]] = []
    for step in range(300):
        op = rnd.random()
        if op < 0.45:
            messages = messages + [{"role": rnd.choice(["user", "assistant"]),
                                    "content": [{"type": "text", "text": rnd.choice(TRICKY)}],
                                    "n": rnd.choice([1, -2.5e-7, None, True, "s"])}]
        elif op < 0.55:  # rewind (a client-side compaction or an undo)
            messages = messages[:max(1, len(messages) - rnd.randrange(1, 4))]
        elif op < 0.65:  # edit one message in place
            messages = list(messages)
            messages[rnd.randrange(len(messages))] = {"role": "user", "content": f"edit {step}"}
        elif op < 0.75:  # fork: remember this branch, or go back to an older one
            if forks and rnd.random() < 0.5:
                messages = forks.pop()
            else:
                forks.append(messages)
        extra: dict[str, Any] = {}
        if rnd.random() < 0.3:
            extra["tools"] = [{"name": "t", "description": rnd.choice(TRICKY)}]
        if rnd.random() < 0.2:
            extra["metadata"] = {"user_id": f"u{step}"}
        body = body_of(messages, **extra) if rnd.random() < 0.5 else {"messages": messages,
                                                                       **extra, "model": "m"}
        serialize = rnd.choice(list(SERIALIZERS.values()))
        parsed = check(cache, serialize(body))
        assert parsed.spans
    assert cache.hits > 50 and cache.partial_hits > 20  # edits and rewinds: partial reuse


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user"}], "messages": [{"role": "assistant"}]}',  # last wins
    b'{"\\u006dessages": [{"role": "user", "content": "a"}], "model": "m"}',  # escaped name
    b'  {\n "messages" :\n [ {"role":"user"} ,\n {"role":"assistant"} ] \n}\n ',
    b'{"messages": []}',
    b'{"model": "m"}',
    b'{"messages": "just a string"}',
    b'[{"messages": []}]',
    b'{"a": [1, 2.5e3, true, null, {"b": "]}"}], "messages": [{"x": -1}]}',
])
def test_odd_bodies(raw: bytes) -> None:
    cache = BodyCache()
    first = check(cache, raw)
    again = check(cache, raw)  # the same bytes twice: a retry
    if first.spans:
        assert again.reused == len(first.messages)


def test_duplicate_key_is_never_scanned() -> None:
    assert scan_body(b'{"messages": [1], "messages": [2]}', "messages") is None
    assert scan_body(b'{"messages": [1, {"a": "]"}]}', "messages") == (13, 27, [14, 17],
                                                                         [15, 27])


def test_a_duplicate_key_arriving_later_is_not_taken_for_reuse() -> None:
    cache = BodyCache()
    check(cache, b'{"messages": [{"role": "user"}]}')
    parsed = check(cache, b'{"messages": [{"role": "user"}, {"role": "x"}], "messages": []}')
    assert parsed.reused == 0 and not parsed.spans


def test_a_broken_tail_raises_like_a_full_parse() -> None:
    cache = BodyCache()
    check(cache, b'{"messages": [{"role": "user"}]}')
    with pytest.raises(orjson.JSONDecodeError):
        cache.parse(b'{"messages": [{"role": "user"}, {"role": ', "messages")
    with pytest.raises(orjson.JSONDecodeError):
        cache.parse(b'{"messages": [{"role": "user"}, {"role": "a"}], "x": tru}', "messages")


def test_bounds() -> None:
    cache = BodyCache(max_entries=2)
    for session in range(4):
        check(cache, orjson.dumps(body_of([{"role": "user", "content": f"s{session}"}])))
    assert len(cache) == 2
    small = BodyCache(max_bytes=100)
    check(small, orjson.dumps(body_of([{"role": "user", "content": "x" * 200}])))
    assert len(small) == 0
    off = BodyCache(max_entries=0)
    raw = orjson.dumps(body_of([{"role": "user", "content": "a"}]))
    check(off, raw)
    assert check(off, raw).reused == 0


@pytest.mark.parametrize("serialize", SERIALIZERS.values(), ids=SERIALIZERS.keys())
def test_encode_keeps_the_client_bytes_of_unchanged_messages(serialize: Serializer) -> None:
    history = anthropic_history(10, result_tokens=30)
    history[3]["content"][0]["thinking"] = "signed \\ \" é 漢 \u2028"
    cache = BodyCache()
    check(cache, serialize(body_of(history[:9], tools=[{"name": "t"}])))
    raw = serialize(body_of(history, tools=[{"name": "t"}]))
    parsed = check(cache, raw)
    note = {"role": "user", "content": "[agentcompact: summary]"}
    for out in ([], history[:1] + [note] + parsed.messages[5:],
                [note] + parsed.messages, parsed.messages[::2],
                parsed.messages[3:4] + parsed.messages[3:4] + [note]):
        sent = encode(parsed, out)
        expected = dict(orjson.loads(raw))
        expected["messages"] = out
        assert orjson.loads(sent) == expected
        for message in out:
            if any(message is m for m in parsed.messages):
                i = next(k for k, m in enumerate(parsed.messages) if m is message)
                assert raw[parsed.starts[i]:parsed.ends[i]] in sent
    if serialize is orjson.dumps:  # no whitespace around the elements: the very same bytes
        assert encode(parsed, parsed.messages) == raw


def test_encode_without_spans_serializes() -> None:
    cache = BodyCache()
    parsed = check(cache, b'{"messages": [1], "messages": [{"role": "user"}]}')
    assert not parsed.spans
    assert orjson.loads(encode(parsed, [{"role": "a"}])) == {"messages": [{"role": "a"}]}


@pytest.mark.parametrize("serialize", SERIALIZERS.values(), ids=SERIALIZERS.keys())
def test_keys_before_the_array_may_change(serialize: Serializer) -> None:
    """``stream``, ``max_tokens``, a system prompt quoting ``"messages": [`` before the
    array: the message objects are still reused, and the body is what a full parse gives."""
    history = anthropic_history(8, result_tokens=20)
    cache = BodyCache()
    previous: list[Any] = []
    for n in range(2, len(history) + 1):
        head = {"stream": n % 2 == 0, "max_tokens": 100 + n % 3,
                "system": 'Reply as JSON: {"messages": [' + "x" * (n % 4), "metadata": {
                    "messages": [{"role": "user", "content": "decoy"}]}}
        raw = serialize({**head, "messages": history[:n], "tools": [{"name": "t"}]})
        parsed = check(cache, raw)
        assert parsed.reused == len(previous)
        assert all(a is b for a, b in zip(parsed.messages, previous))
        previous = parsed.messages
        sent = encode(parsed, parsed.messages[1:])
        assert orjson.loads(sent) == {**orjson.loads(raw), "messages": history[1:n]}
    assert len(cache) == 1


# --- partial reuse: Claude Code moves its cache_control marker every turn (issue 13) -----

def _marked(messages: list[Any]) -> list[Any]:
    """``messages`` with Claude Code's marker on the newest block only (copies where it
    changes, so the earlier list is left as it was)."""
    out = [m for m in messages]
    last = dict(out[-1])
    content = [dict(b) for b in last["content"]] if isinstance(last["content"], list) else [
        {"type": "text", "text": last["content"]}]
    content[-1]["cache_control"] = {"type": "ephemeral"}
    last["content"] = content
    out[-1] = last
    return out


def test_a_moved_cache_control_marker_reparses_only_the_message_it_left() -> None:
    history = anthropic_history(30, result_tokens=40)
    cache = BodyCache()
    previous: Any = None
    for n in range(4, len(history) + 1, 2):
        raw = orjson.dumps(body_of(_marked(history[:n]), system="s", tools=[{"name": "t"}]))
        parsed = check(cache, raw)
        if previous is not None:
            shared = len(previous.messages) - 1  # the previous newest lost its marker
            assert parsed.reused == shared
            assert all(a is b for a, b in zip(parsed.messages[:shared], previous.messages))
        previous = parsed
    assert cache.partial_hits == cache.hits == len(range(4, len(history) + 1, 2)) - 1
    assert cache.misses == 1


def test_partial_reuse_takes_the_session_sharing_the_most_messages() -> None:
    shared_opening = {"role": "user", "content": "the same first message in every session"}
    a = [shared_opening, *anthropic_history(10, result_tokens=20)[1:]]
    b = [shared_opening, {"role": "assistant", "content": "another session"}]
    cache = BodyCache()
    first = check(cache, orjson.dumps(body_of(a)))
    check(cache, orjson.dumps(body_of(b)))  # more recent, shares one message with ``a``
    edited = [*a[:-1], {"role": "user", "content": "the newest message, edited"}]
    parsed = check(cache, orjson.dumps(body_of(edited)))
    assert parsed.reused == len(a) - 1
    assert all(x is y for x, y in zip(parsed.messages, first.messages[:len(a) - 1]))


@pytest.mark.parametrize("seed", range(4))
def test_partial_reuse_matches_a_fresh_parse_whatever_changes(seed: int) -> None:
    rnd = random.Random(seed)
    cache = BodyCache()
    messages: list[Any] = [{"role": "user", "content": "task"}]
    previous: Any = None
    changed = 0
    for step in range(120):
        messages = list(messages)
        if len(messages) > 1 and rnd.random() < 0.5:  # change one message somewhere
            changed = rnd.randrange(len(messages))
            messages[changed] = {"role": "user", "content": rnd.choice(TRICKY) + str(step)}
        else:
            changed = len(messages)
        messages.append({"role": rnd.choice(["user", "assistant"]), "content": str(step)})
        serialize = rnd.choice([orjson.dumps, SERIALIZERS["json-compact-utf8"]])
        parsed = check(cache, serialize(body_of(messages)))
        if previous is not None and parsed.reused:
            assert parsed.reused <= changed
            assert all(a is b for a, b in zip(parsed.messages[:parsed.reused],
                                              previous.messages))
        previous = parsed
    assert cache.partial_hits > 10


def _fed(cache: BodyCache, raw: bytes, rnd: random.Random, key: str = "messages") -> Common:
    """A ``Common`` fed ``raw`` in chunks of random sizes (as a server hands them over)."""
    common = cache.common(key)
    at = 0
    while at < len(raw):
        size = rnd.choice([1, 7, 64, 1000, 65536])
        common.feed(raw[at:at + size])
        at += size
    return common


@pytest.mark.parametrize("seed", range(4))
def test_common_counts_the_bytes_shared_exactly_and_lookup_concludes_alike(seed: int) -> None:
    rnd = random.Random(seed)
    cache = BodyCache()
    messages: list[Any] = [{"role": "user", "content": "task " * 50}]
    previous: Any = None
    compared = 0
    for step in range(80):
        messages = list(messages)
        if len(messages) > 1 and rnd.random() < 0.5:  # change one message somewhere
            messages[rnd.randrange(len(messages))] = {"role": "user",
                                                      "content": rnd.choice(TRICKY) + str(step)}
        if rnd.random() < 0.1 and len(messages) > 2:  # a rewind: the body gets shorter
            messages = messages[:rnd.randrange(1, len(messages))]
        messages.append({"role": rnd.choice(["user", "assistant"]), "content": str(step) * 40})
        raw = orjson.dumps(body_of(_marked(messages)))
        common = _fed(cache, raw, rnd)
        if previous is not None:
            same = common.bytes_shared(previous, raw)
            if same is not None:
                compared += 1
                assert same == len(os.path.commonprefix([previous.raw, raw]))
            assert common.bytes_shared(previous, raw[:-1]) is None  # not the body fed
        assert cache.lookup(raw, "messages", common) == cache.lookup(raw, "messages")
        previous = check(cache, raw)
    assert compared > 40  # not when the first message changed (another opening)


def test_common_compares_with_the_recent_body_its_first_chunk_opens() -> None:
    cache = BodyCache()
    a = check(cache, orjson.dumps(body_of(anthropic_history(6, result_tokens=30))))
    b = check(cache, orjson.dumps(body_of([{"role": "user", "content": "another session"}])))
    grown = orjson.dumps(body_of(anthropic_history(8, result_tokens=30)))
    common = _fed(cache, grown, random.Random(0))
    assert common.bytes_shared(b, grown) is None  # more recent, but another session
    assert common.bytes_shared(a, grown) == len(os.path.commonprefix([a.raw, grown]))
