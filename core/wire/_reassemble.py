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

**Linear time.** Each reassembler keeps the pieces of every text, argument string and
token list it grows and joins them once, in :meth:`Reassembler.result`; :class:`SSEReader`
splits a stream into its events as its bytes come, in chunks of any size, keeping only an
unfinished line: rebuilding an answer costs the same per token at 64k tokens as at 8k, and
needs no copy of the whole stream (the proxy's recorder feeds it as bytes arrive).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from ._names import ANTHROPIC, CHAT, GEMINI
from ._sampled import (
    SampledTokens,
    from_chat_completion,
    from_responses,
    read_chat,
)

__all__ = [
    "Reassembled", "Reassembler", "SSEReader", "from_body", "iter_events", "iter_sse",
    "parse_events", "reassemble", "reassemble_events", "reassembler",
]


@dataclass
class Reassembled:
    """The response as native messages of the request's dialect, with usage and model.

    ``prompt_token_ids`` / ``token_ids`` / ``logprobs`` are the serving engine's own
    figures when it sent them (Chat Completions: vLLM/SGLang ``prompt_token_ids`` and
    choice 0's ``token_ids``; its ``logprobs.content[*].logprob``), read by
    :mod:`agentcompact.wire` (a list with an entry lacking its logprob is
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


class SSEReader:
    """The ``data`` of each server-sent event, as the stream's bytes come in chunks of
    any size (an event, a line, a ``\r\n`` may be split between two): :meth:`feed`
    returns the events a chunk completes, :meth:`close` the last one if the stream ended
    without its blank line. Only the unfinished line is kept between chunks."""

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._tail + chunk if self._tail else chunk
        if b"\r" in buf:  # CRLF or CR line ends: a CR ending the chunk may start a CRLF
            held = buf.endswith(b"\r")
            if held:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                buf += b"\r"
        cut = buf.rfind(b"\n") + 1
        self._tail = buf[cut:]
        return self._lines(buf[:cut].split(b"\n")[:-1]) if cut else []

    def close(self) -> list[bytes]:
        tail, self._tail = self._tail.rstrip(b"\r"), b""
        events = self._lines([tail]) if tail else []
        if self._data:
            events.append(b"\n".join(self._data))
            self._data = []
        return events

    def _lines(self, lines: list[bytes]) -> list[bytes]:
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = self._data = []
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
        return events


def parse_events(payloads: list[bytes]) -> list[Any]:
    """The JSON objects of a stream's event payloads (``[DONE]`` and what does not parse
    skipped): one ``orjson`` call for the lot when they all parse."""
    payloads = [p for p in payloads if p.strip() != b"[DONE]"]
    if not payloads:
        return []
    try:
        events: list[Any] = orjson.loads(b"[" + b",".join(payloads) + b"]")
        if len(events) == len(payloads):
            return events
    except orjson.JSONDecodeError:
        pass
    out = []
    for payload in payloads:  # one of them is malformed (or holds a top-level comma)
        try:
            out.append(orjson.loads(payload))
        except orjson.JSONDecodeError:
            try:  # bytes that are not UTF-8: read as a client decoding leniently would
                out.append(orjson.loads(payload.decode("utf-8", "replace")))
            except orjson.JSONDecodeError:
                continue
    return out


def reassemble(dialect: str, data: bytes, *, streamed: bool) -> Reassembled:
    """Rebuild the response of one call from the bytes the client received."""
    if not streamed:
        return from_body(dialect, orjson.loads(data))
    reader = SSEReader()
    payloads = reader.feed(data) + reader.close()
    out = reassembler(dialect)
    for event in iter_events(payloads):
        out.add(event)
    return out.result()


def iter_events(payloads: list[bytes]) -> Iterator[Any]:
    """The JSON objects of a stream's event payloads, parsed :data:`_PARSE_BATCH` at a time
    (see :func:`parse_events`)."""
    for start in range(0, len(payloads), _PARSE_BATCH):
        yield from parse_events(payloads[start:start + _PARSE_BATCH])


#: events parsed by one ``orjson`` call: a few hundred, so that few parsed events are
#: alive at once (a whole stream's would keep the garbage collector busy)
_PARSE_BATCH = 64


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
    (:mod:`agentcompact.wire`, the one reader of those fields), extending
    the lists in place (a stream adds a token or a few per chunk)."""
    if sampled.prompt_token_ids is not None:
        out.prompt_token_ids = sampled.prompt_token_ids
    if sampled.response_token_ids is not None:
        if out.token_ids is None:
            out.token_ids = []
        out.token_ids += sampled.response_token_ids
    if sampled.response_logprobs is not None:
        if out.logprobs is None or out.token_bytes is None:
            out.logprobs, out.token_bytes = list(out.logprobs or []), list(out.token_bytes or [])
        out.logprobs += sampled.response_logprobs
        out.token_bytes += sampled.token_bytes or []


class Reassembler:
    """Builds one response from its stream events, fed one at a time with :meth:`add`."""

    def __init__(self) -> None:
        self.out = Reassembled()

    def add(self, event: Any) -> None:
        """Take one event (a dict as sent on the wire); anything else is skipped."""
        if isinstance(event, dict):
            try:
                self._add(event)
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
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
        #: (block index, field) -> the field's pieces so far (its value as started first)
        self.pieces: dict[tuple[int, str], list[str]] = {}

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
        if kind in _TEXT_DELTAS:
            name = _TEXT_DELTAS[kind]
            piece = delta.get(name, "")
            if not isinstance(piece, str):
                raise TypeError(name)
            pieces = self.pieces.get((index, name))
            if pieces is None:
                pieces = self.pieces[(index, name)] = [block.get(name, "")]
            pieces.append(piece)
        elif kind == "input_json_delta":
            self.partial.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "citations_delta":
            citations = block.get("citations")
            if not isinstance(citations, list):
                citations = block["citations"] = [] if citations is None else [citations]
            citations.append(delta.get("citation"))

    def result(self) -> Reassembled:
        for (index, name), pieces in self.pieces.items():
            self.blocks.setdefault(index, {})[name] = "".join(pieces)
        self.out.response = [{"role": "assistant",
                              "content": [self.blocks[i] for i in sorted(self.blocks)]}]
        return self.out


#: Anthropic's text-growing deltas and the block field each grows (the signature too is
#: appended, never overwritten: see the module docstring)
_TEXT_DELTAS = {"text_delta": "text", "thinking_delta": "thinking",
                "signature_delta": "signature"}


class _ChatStream(Reassembler):
    def __init__(self) -> None:
        super().__init__()
        #: the message's growing fields (content, reasoning, refusal)
        self.texts: dict[str, _Text] = {}
        #: per tool call index: its id, and its name's and arguments' pieces
        self.calls: dict[int, tuple[list[str], list[str], list[str]]] = {}
        #: the sampled tokens the chunks report (``Reassembled``'s fields at the end), as
        #: arrays: no object per token (a 150 MB answer holds 450k of them)
        self.ids = array("q")
        self.logprobs = array("d")
        self.token_bytes = bytearray()
        self.token_ends = array("Q")
        self.saw_ids = self.saw_logprobs = False

    def _add(self, ev: dict[str, Any]) -> None:
        out = self.out
        out.model = ev.get("model") or out.model
        if ev.get("usage"):
            out.usage = dict(ev["usage"])
        prompt, ids, scored = read_chat(ev)
        if prompt is not None:
            out.prompt_token_ids = prompt
        if ids is not None:
            self.ids.extend(ids)
            self.saw_ids = True
        if scored is not None:
            self.logprobs.extend(scored[0])
            for piece in scored[2]:
                self.token_bytes += bytes(piece)
                self.token_ends.append(len(self.token_bytes))
            self.saw_logprobs = True
        for choice in ev.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            for key, piece in (choice.get("delta") or {}).items():
                if not piece:
                    continue
                if key in _CHAT_TEXTS:
                    if not isinstance(piece, str):
                        raise TypeError(key)
                    text = self.texts.get(key)
                    if text is None:
                        text = self.texts[key] = _Text()
                    text.add(piece)
                elif key == "tool_calls":
                    for frag in piece:
                        self._tool_fragment(frag)
            if choice.get("finish_reason"):
                out.complete = True

    def _tool_fragment(self, frag: dict[str, Any]) -> None:
        ids, names, arguments = self.calls.setdefault(int(frag.get("index", 0)), ([], [], []))
        if frag.get("id"):
            ids.append(frag["id"])
        function = frag.get("function") or {}
        for pieces, piece in ((names, function.get("name")), (arguments,
                                                               function.get("arguments"))):
            if piece:
                if not isinstance(piece, str):
                    raise TypeError("tool call fragment")
                pieces.append(piece)

    def result(self) -> Reassembled:
        message: dict[str, Any] = {"role": "assistant", "content": None}
        for key in _CHAT_TEXTS:
            if key in self.texts:
                message[key] = self.texts[key].text()
        if self.calls:
            message["tool_calls"] = [
                {"id": ids[-1] if ids else "", "type": "function",
                 "function": {"name": "".join(names), "arguments": "".join(arguments)}}
                for ids, names, arguments in (self.calls[i] for i in sorted(self.calls))]
        out = self.out
        out.response = [message]
        out.token_ids = self.ids.tolist() if self.saw_ids else None
        if self.saw_logprobs:
            out.logprobs = self.logprobs.tolist()
            # bytes stand in for ids only: a stream with ids has no use for them
            blob, ends = self.token_bytes, self.token_ends
            out.token_bytes = None if self.saw_ids else [
                list(blob[start:end]) for start, end in zip((0, *ends), ends)]
        return out


_CHAT_TEXTS = ("content", "reasoning_content", "reasoning", "refusal")
_JOIN_EVERY = 1024


class _Text:
    """A text growing by pieces: every ``_JOIN_EVERY`` pieces are joined into one chunk
    (few objects for a long answer; each character is copied twice, linear)."""

    __slots__ = ("chunks", "small")

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.small: list[str] = []

    def add(self, piece: str) -> None:
        self.small.append(piece)
        if len(self.small) >= _JOIN_EVERY:
            self.chunks.append("".join(self.small))
            self.small = []

    def text(self) -> str:
        return "".join(self.chunks + self.small)



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
