"""Turn a response (JSON, an SSE stream, or parsed stream events) back into native assistant
messages: the one reassembler shared by the proxy and the SDK wrapper.

The proxy's ``--record`` keeps a copy of the relayed bytes and calls :func:`reassemble`
once the stream ends; the SDK wrapper feeds each event it passes to the caller, as a dict,
to a :func:`reassembler` (``add(event)``, then ``result()``). Either way the result is what
a non-streaming call would have returned, for each of the three protocols:

- Anthropic Messages: ``message_start`` + ``content_block_*`` deltas (text, tool input
  JSON, thinking and its signature - both appended, never overwritten - and citations)
  + ``message_delta`` usage;
- OpenAI Chat Completions: ``chat.completion.chunk`` deltas (content, reasoning, refusal,
  tool-call fragments by index) + the usage chunk, and what the server reports for RL:
  per-token ``logprobs`` and vLLM/SGLang ``token_ids`` / ``prompt_token_ids``;
- OpenAI Responses: the final ``response.completed`` / ``response.incomplete`` event (or,
  when the stream stopped early, the ``response.output_item.done`` items seen);
- Gemini: ``GenerateContentResponse`` chunks (``_reassemble_gemini``).

Events it does not know are skipped; a malformed event never raises (the result is then
marked incomplete only if the end of the stream was not seen).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from ...trajectory._sampled import SampledTokens, from_chat_completion, from_responses
from ._wire import ANTHROPIC, CHAT, GEMINI

__all__ = [
    "Reassembled", "Reassembler", "from_body", "iter_sse", "reassemble", "reassemble_events",
    "reassembler",
]


@dataclass
class Reassembled:
    """The response as native messages of the request's dialect, with usage and model.

    ``prompt_token_ids`` / ``token_ids`` / ``logprobs`` are the serving engine's own
    figures when it sent them (Chat Completions: vLLM/SGLang ``prompt_token_ids`` and
    choice 0's ``token_ids``; its ``logprobs.content[*].logprob``), read by
    :mod:`agentcompact.trajectory._sampled` (a list with an entry lacking its logprob is
    not taken).
    """

    response: list[Any] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    complete: bool = False
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    #: each scored token's bytes (OpenAI ``logprobs.content[*].bytes``), for a server that
    #: sends no ids: the exporter maps them to its tokenizer's ids
    token_bytes: list[list[int]] | None = None

    def model_call_fields(self) -> dict[str, Any]:
        """The sampled-token keyword arguments of a ``ModelCall`` (``ModelCall(...,
        **got.model_call_fields())``); token bytes only when there are no ids."""
        return {"prompt_token_ids": self.prompt_token_ids, "response_token_ids": self.token_ids,
                "response_logprobs": self.logprobs,
                "response_token_bytes": self.token_bytes if self.token_ids is None else None}


def iter_sse(data: bytes) -> Iterator[tuple[str | None, str]]:
    """``(event, data)`` for each server-sent event in ``data`` (comments skipped)."""
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    for block in text.split("\n\n"):
        event: str | None = None
        lines: list[str] = []
        for line in block.split("\n"):
            if line.startswith("data:"):
                lines.append(line[5:].removeprefix(" "))
            elif line.startswith("event:"):
                event = line[6:].strip()
        if lines:
            yield event, "\n".join(lines)


def reassemble(dialect: str, data: bytes, *, streamed: bool) -> Reassembled:
    """Rebuild the response of one call from the bytes the client received."""
    if not streamed:
        return from_body(dialect, orjson.loads(data))
    return reassemble_events(dialect, _sse_events(data))


def _sse_events(data: bytes) -> Iterator[Any]:
    for _, payload in iter_sse(data):
        if payload.strip() == "[DONE]":
            continue
        try:
            yield orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue


def reassemble_events(dialect: str, events: Iterable[Any]) -> Reassembled:
    """Rebuild the response of one call from its parsed stream events (dicts)."""
    out = reassembler(dialect)
    for event in events:
        out.add(event)
    return out.result()


def from_body(dialect: str, body: Any) -> Reassembled:
    """The native assistant output of a non-streamed response body (a dict)."""
    if not isinstance(body, dict):
        return Reassembled()
    if dialect == GEMINI:
        from ._reassemble_gemini import gemini_from_body

        return gemini_from_body(body)
    usage = body.get("usage") or {}
    model = body.get("model")
    if dialect == ANTHROPIC:
        message = {"role": "assistant", "content": body.get("content", [])}
        return Reassembled([message], usage, model, True)
    if dialect == CHAT:
        choices = body.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message") or {}
        out = Reassembled([message], usage, model, True)
        _add_sampled(out, from_chat_completion(body))
        return out
    out = Reassembled(list(body.get("output") or []), usage, model, True)
    _add_sampled(out, from_responses(body))
    return out


def _add_sampled(out: Reassembled, sampled: SampledTokens) -> None:
    """Add what a body or a chunk reports of the sampled tokens
    (:mod:`agentcompact.trajectory._sampled`, the one reader of those fields)."""
    if sampled.prompt_token_ids is not None:
        out.prompt_token_ids = sampled.prompt_token_ids
    if sampled.response_token_ids is not None:
        out.token_ids = [*(out.token_ids or []), *sampled.response_token_ids]
    if sampled.response_logprobs is not None:
        out.logprobs = [*(out.logprobs or []), *sampled.response_logprobs]
        out.token_bytes = [*(out.token_bytes or []), *(sampled.token_bytes or [])]


class Reassembler:
    """Builds one response from its stream events, fed one at a time with :meth:`add`."""

    def __init__(self) -> None:
        self.out = Reassembled()

    def add(self, event: Any) -> None:
        """Take one event (a dict as sent on the wire); anything else is skipped."""
        if isinstance(event, dict):
            try:
                self._add(event)
            except (KeyError, TypeError, ValueError, AttributeError):
                pass  # a malformed event: skipped, as unknown events are

    def _add(self, event: dict[str, Any]) -> None:
        raise NotImplementedError

    def result(self) -> Reassembled:
        """The response as rebuilt from the events seen so far."""
        return self.out


def reassembler(dialect: str) -> Reassembler:
    """A new incremental reassembler for a stream of ``dialect``."""
    if dialect == ANTHROPIC:
        return _AnthropicStream()
    if dialect == CHAT:
        return _ChatStream()
    if dialect == GEMINI:
        from ._reassemble_gemini import GeminiStream

        return GeminiStream()
    return _ResponsesStream()


class _AnthropicStream(Reassembler):
    def __init__(self) -> None:
        super().__init__()
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, list[str]] = {}

    def _add(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        out = self.out
        if kind == "message_start":
            message = ev.get("message") or {}
            out.model = message.get("model")
            out.usage = dict(message.get("usage") or {})
        elif kind == "content_block_start":
            self.blocks[int(ev["index"])] = dict(ev.get("content_block") or {})
        elif kind == "content_block_delta":
            index = int(ev["index"])
            self._delta(self.blocks.setdefault(index, {}), index, ev.get("delta") or {})
        elif kind == "content_block_stop" and ev.get("index") in self.partial:
            raw = "".join(self.partial.pop(ev["index"]))
            block = self.blocks.get(ev["index"], {})
            try:
                block["input"] = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                block["input"] = raw
        elif kind == "message_delta":
            out.usage.update({k: v for k, v in (ev.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            out.complete = True

    def _delta(self, block: dict[str, Any], index: int, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
        elif kind == "input_json_delta":
            self.partial.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.get("signature", "")
        elif kind == "citations_delta":
            citations = block.get("citations")
            block["citations"] = [*(citations or []), delta.get("citation")]

    def result(self) -> Reassembled:
        self.out.response = [{"role": "assistant",
                              "content": [self.blocks[i] for i in sorted(self.blocks)]}]
        return self.out


class _ChatStream(Reassembler):
    def __init__(self) -> None:
        super().__init__()
        self.message: dict[str, Any] = {"role": "assistant", "content": None}
        self.calls: dict[int, dict[str, Any]] = {}

    def _add(self, ev: dict[str, Any]) -> None:
        out = self.out
        out.model = ev.get("model") or out.model
        if ev.get("usage"):
            out.usage = dict(ev["usage"])
        _add_sampled(out, from_chat_completion(ev))
        for choice in ev.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            message = self.message
            for key in ("content", "reasoning_content", "reasoning", "refusal"):
                if delta.get(key):
                    message[key] = (message.get(key) or "") + delta[key]
            for frag in delta.get("tool_calls") or ():
                self._tool_fragment(frag)
            if choice.get("finish_reason"):
                out.complete = True

    def _tool_fragment(self, frag: dict[str, Any]) -> None:
        call = self.calls.setdefault(int(frag.get("index", 0)), {
            "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        if frag.get("id"):
            call["id"] = frag["id"]
        function = frag.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def result(self) -> Reassembled:
        message = dict(self.message)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        self.out.response = [message]
        return self.out


class _ResponsesStream(Reassembler):
    def __init__(self) -> None:
        super().__init__()
        self.done: dict[int, Any] = {}

    def _add(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        out = self.out
        if kind == "response.output_item.done":
            self.done[int(ev.get("output_index", len(self.done)))] = ev.get("item")
        elif kind in ("response.created", "response.completed", "response.incomplete",
                      "response.failed"):
            response = ev.get("response") or {}
            out.model = response.get("model") or out.model
            if kind != "response.created":
                out.usage = dict(response.get("usage") or {})
                out.response = list(response.get("output") or [])
                out.complete = True
                _add_sampled(out, from_responses(response))

    def result(self) -> Reassembled:
        if not self.out.complete:
            self.out.response = [self.done[i] for i in sorted(self.done)]
        return self.out
