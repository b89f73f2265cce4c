"""Reading sampled-token fields from server bodies: the upstream simulator's OpenAI
logprobs (chat, streamed chat, responses) and vLLM's return_token_ids shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentcompact import Budget
from agentcompact.testing._completion import Completion
from agentcompact.testing._openai_wire import ChatWire
from agentcompact.testing._responses_wire import ResponsesWire
from agentcompact.testing._script import split_tokens
from agentcompact.wire import (
    from_chat_chunks,
    from_chat_completion,
    from_responses,
    token_ids_from_bytes,
)
from tests.conftest import QWEN_TOKENIZER, needs_shared_data

TEXT = "The fix is in parser.py, line 12."


def _completion() -> Completion:
    return Completion(ordinal=1, model="m", text=TEXT, tool_calls=(), thinking=None,
                      input_tokens=10, output_tokens=9, truncated=False, created=0)


def test_openai_chat_logprobs_from_the_simulator_plain_and_streamed() -> None:
    body = {"logprobs": True, "top_logprobs": 2}
    plain = from_chat_completion(ChatWire().render(_completion(), body))
    assert plain.logprob_tokens == split_tokens(TEXT)
    assert plain.response_logprobs is not None and len(plain.response_logprobs) == len(
        split_tokens(TEXT)) and all(x < 0 for x in plain.response_logprobs)
    assert plain.response_token_ids is None and plain.prompt_token_ids is None
    chunks = [json.loads(json.dumps(f.data)) for f in ChatWire().frames(_completion(), body)
              if isinstance(f.data, dict)]
    streamed = from_chat_chunks(chunks)
    assert streamed.response_logprobs == plain.response_logprobs
    assert from_chat_completion(ChatWire().render(_completion(), {})).response_logprobs is None


def test_responses_logprobs_from_the_simulator() -> None:
    body = {"include": ["message.output_text.logprobs"], "top_logprobs": 0}
    got = from_responses(ResponsesWire().render(_completion(), body))
    assert got.logprob_tokens == split_tokens(TEXT)


def test_vllm_return_token_ids_shape() -> None:
    body = {"prompt_token_ids": [1, 2, 3],
            "choices": [{"index": 0, "token_ids": [7, 8],
                         "message": {"role": "assistant", "content": "hi"},
                         "logprobs": {"content": [{"token": "h", "logprob": -0.5},
                                                  {"token": "i", "logprob": -0.25}]}}]}
    got = from_chat_completion(body)
    assert got.model_call_fields() == {"prompt_token_ids": [1, 2, 3],
                                       "response_token_ids": [7, 8],
                                       "response_logprobs": [-0.5, -0.25],
                                       "response_token_bytes": None}  # ids given: not kept
    chunks = [{"prompt_token_ids": [1, 2, 3], "choices": [{"delta": {}, "token_ids": []}]},
              {"choices": [{"delta": {"content": "h"}, "token_ids": [7]}]},
              {"choices": [{"delta": {"content": "i"}, "token_ids": [8]}]}]
    assert from_chat_chunks(chunks).response_token_ids == [7, 8]


def test_a_stream_of_several_choices_reads_choice_zero_only() -> None:
    """With ``n > 1`` a stream interleaves the choices; each chunk's ``choices[0]`` may be
    another choice's delta."""
    chunks = [
        {"prompt_token_ids": [1, 2], "choices": [{"index": 1, "token_ids": [90],
                                                  "logprobs": {"content": [
                                                      {"token": "x", "logprob": -9.0}]}}]},
        {"choices": [{"index": 0, "token_ids": [7],
                      "logprobs": {"content": [{"token": "a", "logprob": -0.5}]}}]},
        {"choices": [{"index": 1, "token_ids": [91]}, {"index": 0, "token_ids": [8]}]},
    ]
    got = from_chat_chunks(chunks)
    assert (got.prompt_token_ids, got.response_token_ids, got.response_logprobs) == (
        [1, 2], [7, 8], [-0.5])


# ------------------------------------------------- the simulator as vLLM, ids from bytes

QWEN = QWEN_TOKENIZER
needs_qwen = needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "parameters": {"type": "object",
                                        "properties": {"path": {"type": "string"}}}}}]


@needs_qwen
def test_the_simulator_serves_vllm_token_ids_plain_and_streamed() -> None:
    transformers = pytest.importorskip("transformers")
    openai = pytest.importorskip("openai")
    from agentcompact.testing import Reply, Script, UpstreamSim, serve

    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN))
    turn = Reply.tool("read_file", {"path": "é.py"}, text="Let me look…")
    sim = UpstreamSim(Script(turn, turn, Reply("naïve ✓ done."), Reply("naïve ✓ done.")),
                      tokenizer=hf)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    ask = {"return_token_ids": True}
    with serve(sim) as server, openai.OpenAI(base_url=server.base_url + "/v1",
                                             api_key="k", max_retries=0) as client:
        def both(**kw: Any) -> tuple[Any, Any]:
            plain = client.chat.completions.create(model="m", messages=messages,
                                                   logprobs=True, extra_body=ask, **kw)
            chunks = client.chat.completions.create(model="m", messages=messages, stream=True,
                                                    logprobs=True, extra_body=ask, **kw)
            return plain.model_dump(), [c.model_dump() for c in chunks]

        tool_plain, tool_chunks = both(tools=TOOLS)
        text_plain, text_chunks = both()
    prompt = hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True,
                                    tokenize=False)
    assert tool_plain["prompt_token_ids"] == hf.encode(prompt, add_special_tokens=False)
    ids = tool_plain["choices"][0]["token_ids"]
    answer = hf.decode(ids)
    assert answer.startswith("Let me look…\n<tool_call>") and answer.endswith("<|im_end|>")
    assert tool_plain["usage"]["completion_tokens"] == len(ids)
    for plain, chunks in ((tool_plain, tool_chunks), (text_plain, text_chunks)):
        got, streamed = from_chat_completion(plain), from_chat_chunks(chunks)
        assert streamed.prompt_token_ids == got.prompt_token_ids is not None
        assert streamed.response_token_ids == got.response_token_ids is not None
        assert got.response_logprobs is not None
        assert len(got.response_logprobs) == len(got.response_token_ids)
        assert streamed.response_logprobs == got.response_logprobs
        # vLLM: prompt ids on the first chunk only, the stop token on the finishing one
        assert "prompt_token_ids" in chunks[0] and all(
            c.get("prompt_token_ids") is None for c in chunks[1:])
        finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert finishing[0]["choices"][0]["token_ids"] == [hf.convert_tokens_to_ids(
            "<|im_end|>")]
        # the bytes of each scored token map back to exactly its id
        assert token_ids_from_bytes(got.token_bytes or [], hf) == got.response_token_ids
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in text_chunks
                   if c["choices"])
    assert text == text_plain["choices"][0]["message"]["content"] == "naïve ✓ done."
    args = "".join(t["function"]["arguments"] or "" for c in tool_chunks if c["choices"]
                   for t in c["choices"][0]["delta"].get("tool_calls") or [])
    assert json.loads(args) == {"path": "é.py"}


def test_byte_alphabet_is_gpt2s() -> None:
    convert = pytest.importorskip("transformers.convert_slow_tokenizer")
    from agentcompact.wire._sampled import _BYTE_CHARS

    assert convert.bytes_to_unicode() == _BYTE_CHARS


SAMPLE = "naïve café → 3 × 7 = 21 ✓ 日本語 𓀀🦜 ok\n"


def _partial(piece: list[int]) -> bool:
    """A token that is part of a UTF-8 character (its bytes alone do not decode)."""
    try:
        bytes(piece).decode()
    except UnicodeDecodeError:
        return True
    return False


def test_token_ids_from_bytes_with_tiktoken() -> None:
    tiktoken = pytest.importorskip("tiktoken")
    try:
        enc = tiktoken.get_encoding("o200k_base")
    except Exception as exc:  # offline without the cached file
        pytest.skip(f"o200k_base not available: {exc}")
    ids = enc.encode(SAMPLE)
    pieces = [list(enc.decode_single_token_bytes(t)) for t in ids]
    assert any(_partial(p) for p in pieces)
    assert token_ids_from_bytes(pieces, enc) == ids
    assert token_ids_from_bytes([*pieces, list(b"\xff" * 40)], enc) is None


@needs_qwen
def test_token_ids_from_bytes_with_the_qwen_tokenizer() -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN))
    ids = hf.encode(SAMPLE + "<|im_end|>", add_special_tokens=False)
    from agentcompact.testing import SimTokenizer

    pieces = [list(SimTokenizer(hf).token_bytes(t)) for t in ids]
    assert any(_partial(p) for p in pieces)
    assert token_ids_from_bytes(pieces, hf) == ids
    assert hf.decode(ids) == SAMPLE + "<|im_end|>"
    assert token_ids_from_bytes([list(b"no such token, surely")], hf) is None
    assert token_ids_from_bytes([[300]], hf) is None and token_ids_from_bytes([None], hf) is None


def _run_without_ids(run: Path, tokenizer: Any) -> None:
    """Two SDK-wrapped calls with ``logprobs`` but no ``return_token_ids`` (OpenAI's
    shape: each token's text and bytes, no ids), recorded."""
    openai = pytest.importorskip("openai")
    from agentcompact import new_plugin_manager
    from agentcompact.integrations.sdk import compact
    from agentcompact.plugins.recorder import Recorder
    from agentcompact.testing import Reply, Script, UpstreamSim, serve

    pm = new_plugin_manager()
    recorder = Recorder(run)
    pm.register(recorder)
    script = Script(Reply.tool("read_file", {"path": "a.py"}, text="Looking…"),
                    Reply("Fixed: naïve ✓."))
    with serve(UpstreamSim(script, tokenizer=tokenizer)) as server, openai.OpenAI(
            base_url=server.base_url + "/v1", api_key="k", max_retries=0) as raw:
        client = compact(raw, budget=Budget(trigger_tokens=100_000), plugins=pm)
        messages: list[Any] = [{"role": "user", "content": "fix it"}]
        first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                               logprobs=True).choices[0].message
        messages += [first, {"role": "tool", "tool_call_id": first.tool_calls[0].id,
                             "content": "def f(x): return x"}]
        client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                       logprobs=True)
    recorder.close()


@needs_qwen
def test_export_gives_openai_logprobs_their_ids_from_the_bytes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("pyarrow")
    transformers = pytest.importorskip("transformers")
    from agentcompact.testing import logprob_of
    from agentcompact.trajectory import read_events
    from agentcompact.trajectory._export_cli import main as export_main
    from agentcompact.trajectory.export import read_export

    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN))
    for name, tokenizer in (("qwen", hf), ("pieces", None)):
        run, out = tmp_path / name / "run", tmp_path / name / "out"
        _run_without_ids(run, tokenizer)
        calls = read_events(run).of_kind("model_call")
        assert all(c.data["response_token_ids"] is None and c.data["response_token_bytes"]
                   for c in calls)
        assert export_main([str(run), "--out", str(out), "--tokenizer", str(QWEN),
                            "--no-progress", "--workers", "1"]) == 0
        (row,) = read_export(out)
        sampled = [lp for lp, m in zip(row["rollout_logprobs"], row["response_mask"],
                                       strict=True) if m]
        if tokenizer is not None:  # each scored token is one Qwen token: logprobs kept
            assert row["sampling"]["logprobs_mode"] == "raw"
            n = len(calls[0].data["response_logprobs"])
            assert sampled == pytest.approx(
                [logprob_of(k) for k in range(n)]
                + [logprob_of(k) for k in range(len(sampled) - n)], abs=1e-6)
        else:  # 4-character pieces are not Qwen's tokens: not kept, and said so
            assert row["sampling"]["logprobs_mode"] == "none" and not any(sampled)
            assert "--recompute-logprobs" in caplog.text


def test_a_trained_summarizer_asks_for_logprobs_and_ids_only_when_told() -> None:
    from agentcompact import Summarizer

    prompt = [{"role": "user", "content": "summarize"}]
    plain = Summarizer("http://127.0.0.1:9/v1", "m").request_kwargs(prompt, 10)
    assert "logprobs" not in plain and "extra_body" not in plain
    trained = Summarizer("http://127.0.0.1:9/v1", "m", trained=True)
    assert trained.request_kwargs(prompt, 10)["logprobs"] is True
    assert "extra_body" not in trained.request_kwargs(prompt, 10)  # OpenAI rejects the field
    vllm = Summarizer("http://127.0.0.1:9/v1", "m", trained=True, return_token_ids=True,
                      extra_body={"top_k": 5})
    assert vllm.request_kwargs(prompt, 10)["extra_body"] == {"top_k": 5,
                                                             "return_token_ids": True}
    off = Summarizer("http://127.0.0.1:9/v1", "m", trained=True, logprobs=False)
    assert "logprobs" not in off.request_kwargs(prompt, 10) and not off.records_tokens


@needs_qwen
def test_the_proxy_reassembler_reads_the_simulators_ids_from_its_wire_bytes() -> None:
    pytest.importorskip("transformers")
    from agentcompact.testing import Reply, SimTokenizer
    from agentcompact.testing._completion import complete
    from agentcompact.wire import reassemble

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "logprobs": True, "return_token_ids": True}
    done = complete(Reply.tool("read_file", {"path": "a.py"}, text="ok"), body, ordinal=1,
                    budget=None, tokenizer=SimTokenizer(QWEN))
    assert done.ids is not None
    plain = reassemble("openai_chat", json.dumps(ChatWire().render(done, body)).encode(),
                       streamed=False)
    sse = b"".join(f.encode() for f in ChatWire().frames(done, body))
    streamed = reassemble("openai_chat", sse, streamed=True)
    for got in (plain, streamed):
        fields = got.model_call_fields()
        assert fields["prompt_token_ids"] == done.ids.prompt
        assert fields["response_token_ids"] == done.ids.response
        assert fields["response_logprobs"] is not None
        assert len(fields["response_logprobs"]) == len(done.ids.response)
        assert fields["response_token_bytes"] is None  # ids given: bytes not kept
    without_ids = reassemble("openai_chat", sse.replace(b'"token_ids"', b'"other_ids"'),
                             streamed=True).model_call_fields()
    assert without_ids["response_token_ids"] is None
    assert without_ids["response_token_bytes"] == [list(p) for p in done.ids.pieces]


@needs_qwen
def test_an_answer_cut_by_the_output_budget_samples_no_stop_token() -> None:
    pytest.importorskip("transformers")
    from agentcompact.testing import Reply, SimTokenizer
    from agentcompact.testing._completion import complete

    tok = SimTokenizer(QWEN)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "return_token_ids": True, "logprobs": True}
    eos = tok.hf.convert_tokens_to_ids("<|im_end|>")
    whole = complete(Reply("one two three four five six"), body, ordinal=1, budget=None,
                     tokenizer=tok)
    cut = complete(Reply("one two three four five six"), body, ordinal=2, budget=2,
                   tokenizer=tok)
    assert whole.ids is not None and whole.ids.response[-1] == eos
    assert cut.truncated and cut.ids is not None and eos not in cut.ids.response
    rendered = ChatWire().render(cut, body)
    assert rendered["choices"][0]["finish_reason"] == "length"
    assert tok.hf.decode(rendered["choices"][0]["token_ids"]) == cut.text


@needs_qwen
def test_vllm_tokens_named_by_id_give_the_ids_plain_and_streamed() -> None:
    """vLLM's ``return_tokens_as_token_ids``: each scored token is ``token_id:<id>`` and its
    ``bytes`` are that name's; the ids are read from the names (never the bytes mapped)."""
    transformers = pytest.importorskip("transformers")
    openai = pytest.importorskip("openai")
    from agentcompact.testing import Reply, Script, UpstreamSim, serve

    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN))
    answer = Reply("naïve ✓ done.")
    sim = UpstreamSim(Script(answer, answer, answer), tokenizer=hf)
    messages = [{"role": "user", "content": "hi"}]
    with serve(sim) as server, openai.OpenAI(base_url=server.base_url + "/v1",
                                             api_key="k", max_retries=0) as client:
        named = {"return_tokens_as_token_ids": True}
        plain = client.chat.completions.create(model="m", messages=messages, logprobs=True,
                                               extra_body=named).model_dump()
        chunks = [c.model_dump() for c in client.chat.completions.create(
            model="m", messages=messages, logprobs=True, stream=True, extra_body=named)]
        both = client.chat.completions.create(
            model="m", messages=messages, logprobs=True,
            extra_body={**named, "return_token_ids": True}).model_dump()
    ids = both["choices"][0]["token_ids"]
    entry = plain["choices"][0]["logprobs"]["content"][0]
    assert entry["token"] == f"token_id:{ids[0]}"
    assert bytes(entry["bytes"]) == entry["token"].encode()  # the name's, not the token's
    got, streamed = from_chat_completion(plain), from_chat_chunks(chunks)
    assert got.response_token_ids == streamed.response_token_ids == ids
    assert got.response_logprobs == streamed.response_logprobs
    assert got.model_call_fields()["response_token_bytes"] is None
