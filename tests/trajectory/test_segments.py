"""Segmentation and tokens: prefix-extension vs compaction, the token-level prefix
property with the real Qwen tokenizer, masks, summary spans, engine-reported ids."""

from __future__ import annotations

from typing import Any

import pytest

from agentcompact import ModelCall
from agentcompact.errors import TokenizerError
from agentcompact.trajectory._segments import build_segments
from agentcompact.trajectory._tokenize import (
    ChatTokenizer,
    TokenStream,
    tail_text,
    to_chat_messages,
)
from tests.conftest import QWEN_TOKENIZER, needs_shared_data
from tests.trajectory.runs import agent_loop

pytestmark = needs_shared_data("tokenizers", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer.from_pretrained(QWEN_TOKENIZER)


def test_prefix_extension_is_one_segment(tok: ChatTokenizer) -> None:
    segs = build_segments(agent_loop("e", 5), tok, verify=True)
    assert len(segs) == 1 and segs[0].num_calls == 5
    assert segs[0].break_reason == "" and segs[0].compaction_trigger == "none"


def test_compaction_starts_a_new_segment(tok: ChatTokenizer) -> None:
    segs = build_segments(agent_loop("e", 6, compact_at=3), tok, verify=True)
    assert [s.num_calls for s in segs] == [3, 3]
    assert segs[0].break_reason == "compaction"
    assert segs[0].compaction_trigger == "token_budget"
    # external summary: not in the first segment's response, in the second's prompt (mask 0)
    assert segs[0].summary_span == [] and not segs[0].summary_trained
    assert "Summary: explored 3 files" in tok.hf.decode(segs[1].prompt_ids)
    assert "Summary" not in tok.hf.decode(segs[0].response_ids)


def test_edited_history_without_compaction_event_starts_a_segment(tok: ChatTokenizer) -> None:
    events = agent_loop("e", 4)
    for _, call in events[2:]:  # from call 2 on the harness rewrote the task message
        call.messages[1] = {"role": "user", "content": "Fix bug e (rephrased)."}
    segs = build_segments(events, tok)
    assert [s.num_calls for s in segs] == [2, 2]
    assert segs[0].break_reason == "context" and segs[0].compaction_trigger == "none"


def test_a_server_answers_fields_the_client_does_not_send_back(tok: ChatTokenizer) -> None:
    """An OpenAI-compatible server's message carries ``refusal: null``, ``annotations: []``
    …; a client sends the assistant turn back without them: the segment goes on (recorded
    through the proxy, every call was a segment of its own)."""
    events = agent_loop("e", 4)
    for _, call in events:
        call.response = [{**m, "refusal": None, "annotations": [], "audio": None}
                         for m in call.response]
    segs = build_segments(events, tok)
    assert len(segs) == 1 and segs[0].num_calls == 4
    for _, call in events[2:]:  # from call 2 on, a resent value differs: that still breaks
        call.messages[2] = {**call.messages[2], "content": "Step 0: changed."}
    assert [s.num_calls for s in build_segments(events, tok)] == [2, 2]


def test_token_ids_equal_a_full_encode_of_the_template(tok: ChatTokenizer) -> None:
    events = agent_loop("e", 4)
    (seg,) = build_segments(events, tok, verify=True)
    last: ModelCall = events[-1][1]
    chat = to_chat_messages([*last.messages, *last.response], tok_dialect())
    text = tok.hf.apply_chat_template(chat, tokenize=False)
    full = tok.hf(text, add_special_tokens=False)["input_ids"]
    ids = seg.prompt_ids + seg.response_ids
    # the row is the full conversation minus the template's trailing newline after EOS
    assert full[: len(ids)] == ids and tok.hf.decode(full[len(ids):]) == "\n"
    first: ModelCall = events[0][1]
    prompt = tok.hf.apply_chat_template(to_chat_messages(first.messages, tok_dialect()),
                                        tokenize=False, add_generation_prompt=True)
    assert seg.prompt_ids == tok.hf(prompt, add_special_tokens=False)["input_ids"]


def tok_dialect() -> Any:
    from agentcompact import get_dialect

    return get_dialect("openai_chat")


def test_masks_assistant_one_observation_zero_last_token_eos(tok: ChatTokenizer) -> None:
    (seg,) = build_segments(agent_loop("e", 3), tok)
    ids, mask = seg.response_ids, seg.response_mask
    sampled = tok.hf.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
    observed = tok.hf.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    assert "Step 0: listing." in sampled and "Done with e." in sampled
    assert "file_0.py" in observed and "file_0.py" not in sampled
    assert "<|im_start|>assistant" in observed and "<|im_start|>" not in sampled
    assert ids[-1] == tok.hf.convert_tokens_to_ids("<|im_end|>") and mask[-1] == 1
    assert sampled.count("<|im_end|>") == 3  # each call's sampled stop token is trained
    assert seg.rollout_logprobs == [0.0] * len(ids) and not seg.logprobs_known
    assert seg.sampling["logprobs_mode"] == "none"


def test_a_trained_summary_is_a_segment_in_its_own_context(tok: ChatTokenizer) -> None:
    segs = build_segments(agent_loop("e", 4, compact_at=2, trained_summary=True), tok)
    assert [s.break_reason for s in segs] == ["compaction", "summary", ""]
    agent, summary = segs[0], segs[1]
    assert agent.summary_span == [] and not agent.summary_trained
    assert summary.summary_trained and summary.summary_span == [0, len(summary.response_ids)]
    assert set(summary.response_mask) == {1} and summary.num_calls == 0
    assert tok.hf.decode(summary.response_ids) == "Summary: explored 2 files for e.<|im_end|>"
    # the prompt is the summarizer's exact chat, its system prompt included
    assert tok.hf.decode(summary.prompt_ids) == (
        "<|im_start|>system\nSummarize.<|im_end|>\n<|im_start|>user\n"
        "Summarize the work so far.<|im_end|>\n<|im_start|>assistant\n")
    assert summary.compaction_trigger == agent.compaction_trigger


def test_summary_trained_override(tok: ChatTokenizer) -> None:
    events = agent_loop("e", 4, compact_at=2, trained_summary=True)
    segs = build_segments(events, tok, summary_trained=False)
    assert len(segs) == 2 and not any(s.summary_trained for s in segs)


def test_engine_reported_ids_and_logprobs_are_kept(tok: ChatTokenizer) -> None:
    calls = [
        ModelCall(episode_id="e", dialect="openai_chat", messages=[], response=[],
                  prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5],
                  response_logprobs=[-0.5, -0.25], request={"logprobs_mode": "processed"}),
        ModelCall(episode_id="e", dialect="openai_chat", messages=[], response=[],
                  prompt_token_ids=[1, 2, 3, 4, 5, 6, 7], response_token_ids=[8],
                  response_logprobs=[-1.0]),
        ModelCall(episode_id="e", dialect="openai_chat", messages=[], response=[],
                  prompt_token_ids=[1, 2, 9], response_token_ids=[10],
                  response_logprobs=[-2.0]),
    ]
    segs = build_segments([("model_call", c) for c in calls], tok)
    assert [s.prompt_ids for s in segs] == [[1, 2, 3], [1, 2, 9]]
    assert segs[0].response_ids == [4, 5, 6, 7, 8]
    assert segs[0].response_mask == [1, 1, 0, 0, 1]
    assert segs[0].rollout_logprobs == [-0.5, -0.25, 0.0, 0.0, -1.0]
    assert segs[0].sampling["logprobs_mode"] == "processed"
    assert segs[0].break_reason == "tokens"


def test_template_that_rewrites_history_starts_new_segments(tok: ChatTokenizer) -> None:
    """A Qwen3-style template that drops earlier assistant reasoning is not prefix-stable."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    hf.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and m.reasoning_content and loop.last %}"
        "<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    qwen3ish = ChatTokenizer(hf, "qwen3ish")
    events = agent_loop("e", 3)
    for _, call in events:
        call.response[0]["reasoning_content"] = "thinking hard"
        call.response[0].pop("tool_calls", None)
    for _, call in events:  # the harness re-sends responses as they were
        for i, m in enumerate(call.messages):
            if m.get("role") == "tool":
                call.messages[i] = {"role": "user", "content": m["content"]}
    segs = build_segments(events, qwen3ish, verify=True)
    assert len(segs) == 3 and {s.break_reason for s in segs[:2]} == {"template"}
    assert "<think>thinking hard</think>" in qwen3ish.hf.decode(segs[0].response_ids)
    assert qwen3ish.chat_template_sha256 != tok.chat_template_sha256


def test_leading_newlines_do_not_end_a_segment_without_engine_ids(tok: ChatTokenizer) -> None:
    """'assistant\\n' + '\\n\\nText' tokenizes as one newline run, so the text of the next
    prompt does not tokenize as a prefix-extension. Without engine ids that is an artefact
    of tokenizing, not a compaction: the segment goes on, the sampled piece keeps its own
    ids (as a token-in-token-out agent loop would) and the ids still extend call by call."""
    events = agent_loop("e", 3)
    first: ModelCall = events[0][1]
    first.response[0]["content"] = "\n\nStep 0: listing."
    for _, call in events[1:]:
        call.messages[2] = first.response[0]
    segs = build_segments(events, tok, verify=True)
    assert len(segs) == 1 and segs[0].break_reason == "" and segs[0].num_calls == 3
    own = tok.encode("\n\nStep 0: listing")  # the piece goes on with its tool call
    assert segs[0].response_ids[:len(own)] == own and set(segs[0].response_mask[:len(own)]) == {1}


def test_engine_ids_that_do_not_extend_end_the_segment_as_a_token_break(
        tok: ChatTokenizer) -> None:
    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "go"}]
    reply = {"role": "assistant", "content": "ok"}
    calls = [
        ModelCall(episode_id="e", dialect="openai_chat", messages=history, response=[reply],
                  prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5],
                  response_logprobs=[-0.1, -0.2]),
        ModelCall(episode_id="e", dialect="openai_chat",
                  messages=[*history, reply, {"role": "user", "content": "more"}],
                  response=[reply], prompt_token_ids=[1, 2, 3, 4, 6, 7],
                  response_token_ids=[8], response_logprobs=[-0.3]),
    ]
    segs = build_segments([("model_call", c) for c in calls], tok)
    assert [s.break_reason for s in segs] == ["tokens", ""]
    assert segs[0].rollout_logprobs == pytest.approx([-0.1, -0.2])


def test_render_matches_apply_chat_template(tok: ChatTokenizer) -> None:
    events = agent_loop("e", 3)
    last: ModelCall = events[-1][1]
    chat = to_chat_messages(last.messages, tok_dialect())
    chat[2] = {**chat[2], "reasoning_content": "r"}
    tools = [{"type": "function", "function": {"name": "bash", "description": "run",
                                               "parameters": {"type": "object"}}}]
    for gen in (True, False):
        assert tok.render(chat, tools, gen) == tok.hf.apply_chat_template(
            chat, tools=tools, tokenize=False, add_generation_prompt=gen)


def test_anthropic_blocks_convert_to_chat() -> None:
    from agentcompact import get_dialect

    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"},
            {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "out"},
            {"type": "text", "text": "next"}]},
    ]
    chat = to_chat_messages(messages, get_dialect("anthropic"), system="sys")
    assert chat == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a\nb", "reasoning_content": "hmm",
         "tool_calls": [{"type": "function", "id": "t1",
                         "function": {"name": "bash", "arguments": {"cmd": "ls"}}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "out"},
        {"role": "user", "content": "next"},
    ]


class _CountingTokenizer(ChatTokenizer):
    """Counts the messages it renders (to tell a linear export from a quadratic one)."""

    rendered = 0

    def render(self, chat: Any, tools: Any = None, add_generation_prompt: bool = False) -> str:
        self.rendered += len(chat)
        return super().render(chat, tools, add_generation_prompt)


def _tokenizer(template: str | None = None) -> _CountingTokenizer:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    if template is not None:
        hf.chat_template = template
    return _CountingTokenizer(hf, "t")


def _same(a: list[Any], b: list[Any]) -> None:
    assert [vars(s) for s in a] == [vars(s) for s in b]


def test_windowed_renders_equal_full_renders_at_linear_cost() -> None:
    events = agent_loop("e", 70, compact_at=50, trained_summary=True)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    for _, value in events:
        if isinstance(value, ModelCall):
            value.request["tools"] = tools
    windowed, full = _tokenizer(), _tokenizer()
    _same(build_segments(events, windowed, verify=True),
          build_segments(events, full, window=False, verify=True))
    # every call renders the whole conversation (~ turns^2) vs a few messages per call
    assert full.rendered > 6000 and windowed.rendered < full.rendered / 4


def test_template_reading_far_back_falls_back_to_full_renders() -> None:
    """Reasoning shown only after the last user message (as Qwen3 does): a new user turn
    rewrites every earlier assistant turn, beyond any window; the segment's closing check
    catches it and the segment is rebuilt from full renders."""
    tok = _tokenizer(
        "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}"
        "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.reasoning_content and loop.index0 > ns.last %}<think>{{ m.reasoning_content }}"
        "</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    events = agent_loop("e", 16)
    calls = [value for _, value in events]
    for call in calls[:6]:
        call.response[0]["reasoning_content"] = "hmm"
    for call in calls[13:]:  # the user speaks again after call 12 (calls 6-12 did not reason)
        call.messages.insert(27, {"role": "user", "content": "Also check the tests."})
    segs = build_segments(events, tok)
    _same(segs, build_segments(events, tok, window=False))
    assert [s.num_calls for s in segs] == [13, 3] and segs[0].break_reason == "template"


def test_template_numbering_messages_renders_in_full() -> None:
    tok = _tokenizer(
        "{% for m in messages %}<|im_start|>{{ m.role }} {{ loop.index0 }}\n{{ m.content }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant "
        "{{ messages|length }}\n{% endif %}")
    events = agent_loop("e", 12)
    segs = build_segments(events, tok, verify=True)
    _same(segs, build_segments(events, tok, window=False, verify=True))


class _RecordingTokenizer(ChatTokenizer):
    """Records every text it encodes."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: list[str] = []

    def encode_batch(self, texts: Any) -> list[list[int]]:
        self.seen.extend(texts)
        return super().encode_batch(texts)


def test_prefetched_inputs_are_the_texts_the_stream_encodes(tok: ChatTokenizer) -> None:
    rec = _RecordingTokenizer(tok.hf, "rec")
    prompt = "<|im_start|>user\nList files.<|im_end|>\n<|im_start|>assistant\n"
    ops = [("sample", "Step 0.<|im_end|>"),
           ("extend", "\n<|im_start|>user\na.py b.py<|im_end|>\n<|im_start|>assistant\n"),
           ("sample", "Done.<|im_end|>"), ("extend", "\n")]
    memo: dict[str, list[int]] = {}
    TokenStream.prefetch(rec, [prompt, *TokenStream.inputs(rec, tail_text(rec, prompt), ops)],
                         memo)
    before = len(rec.seen)
    streams = [TokenStream(rec, prompt, memo=memo, verify=True), TokenStream(tok, prompt)]
    for stream in streams:
        for kind, piece in ops:
            stream.sample(piece) if kind == "sample" else stream.extend(piece)
    assert len(rec.seen) == before  # everything came from the prefetched batch
    assert streams[0].ids == streams[1].ids and streams[0].mask == streams[1].mask
    streams[0].verify()


def test_render_shortcut_keeps_jinja_semantics_and_the_sandbox() -> None:
    template = (
        "{% for m in messages %}{{ m.role }}:{{ m.content }}|{{ m.missing is defined }}|"
        "{{ m.get('content') }}|{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}"
        "{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}"
        "{{ loop.nextitem is defined }}{{ loop.cycle(1, 2) }}{% endfor %}"
        "{% for t in tools or [] %}{{ t.function.name }}"
        "{% endfor %}")
    tok = _tokenizer(template)
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    assert tok.render(chat, tools) == tok.hf.apply_chat_template(chat, tools=tools,
                                                                   tokenize=False)
    for unsafe in ("{{ messages[0].update({'role': 'x'}) }}",
                   "{{ messages[0].__class__.__mro__ }}"):
        with pytest.raises(TokenizerError, match="chat template failed"):
            _tokenizer(unsafe).render(chat)


class _PlainRecorder(ChatTokenizer):
    """Records the texts that reach the tokenizer's batch call."""

    def __init__(self, *args: Any) -> None:
        self.sent: list[str] = []
        super().__init__(*args)

    def _plain(self, texts: list[str]) -> list[list[int]]:
        self.sent.extend(texts)
        return super()._plain(texts)


def test_long_chunks_between_special_tokens_are_encoded_once(tok: ChatTokenizer) -> None:
    rec = _PlainRecorder(tok.hf, "rec")
    assert rec._reuse  # the Qwen tokenizer splits exactly at its special tokens
    system = "You are an airline agent.\n" + "Policy: be careful with refunds. " * 80

    def prompt(task: str) -> str:
        return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{task}"
                f"<|im_end|>\n<|im_start|>assistant\n")

    texts = [prompt("Cancel my flight."), prompt("  leading spaces\n\n"), system, "short"]
    plain = [tok.hf(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert rec.encode_batch(texts) == plain
    rec.sent.clear()
    assert rec.encode(prompt("Book a hotel.")) == tok.hf(
        prompt("Book a hotel."), add_special_tokens=False)["input_ids"]
    assert not any(system in t for t in rec.sent)  # reused, not encoded again
    rec.clear_reuse()
    assert rec.encode(prompt("Book a hotel.")) == tok.hf(
        prompt("Book a hotel."), add_special_tokens=False)["input_ids"]
    assert any(system in t for t in rec.sent)


def test_template_raising_on_a_window_renders_in_full() -> None:
    """A template that checks the conversation's shape (here: the message after the system
    prompt is the user's) raises on every window; the export falls back to full renders."""
    tok = _tokenizer(
        "{% if messages|length > 1 and messages[1].role != 'user' %}"
        "{{ raise_exception('the first message after the system prompt must be the user') }}"
        "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}"
        "<|im_end|>\\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n"
        "{% endif %}")
    events = agent_loop("e", 12)
    segs = build_segments(events, tok, verify=True)
    _same(segs, build_segments(events, tok, window=False, verify=True))
    assert len(segs) == 1 and segs[0].num_calls == 12


def test_joins_only_where_the_cut_is_a_split(tok: ChatTokenizer) -> None:
    """The shortcut is refused where the joint encode differs (a newline run across the cut)
    or cannot be read off the configuration (another pre-tokenizer)."""
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    tail = "assistant\n"
    assert tok.joins(tail, "I will check.") and tok.joins(tail, "<tool_call>\n{}")
    for piece in ("\n\nStep 0.", " x", "\u00e9t\u00e9"):
        assert not tok.joins(tail, piece)
    assert tok.encode(tail + "\n\nStep 0.") != tok.encode(tail) + tok.encode("\n\nStep 0.")
    assert not tok.joins("assistant", "I") and not tok.joins("x<tool_call>\n", "I")
    hf = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert not ChatTokenizer(hf, "other").joins(tail, "I will check.")
