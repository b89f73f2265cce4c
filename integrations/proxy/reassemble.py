"""Turn a relayed response (JSON or an SSE stream) back into native assistant messages.

``--record`` logs each model call with the response the client received. Streams are
relayed unparsed; the proxy keeps a copy of the bytes and, once the stream ends, rebuilds
what a non-streaming call would have returned, for each of the three protocols:

- Anthropic Messages: ``message_start`` + ``content_block_*`` deltas (text, tool input
  JSON, thinking and its signature, citations) + ``message_delta`` usage;
- OpenAI Chat Completions: ``chat.completion.chunk`` deltas (content, reasoning, tool-call
  fragments by index) + the usage chunk;
- OpenAI Responses: the final ``response.completed`` / ``response.incomplete`` event (or,
  when the stream stopped early, the ``response.output_item.done`` items seen).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from .wire import ANTHROPIC, CHAT

__all__ = ["Reassembled", "iter_sse", "reassemble"]


@dataclass
class Reassembled:
    """The response as native messages of the request's dialect, with usage and model."""

    response: list[Any] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    complete: bool = False


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
        return _from_json(dialect, orjson.loads(data))
    events = []
    for _, payload in iter_sse(data):
        if payload.strip() == "[DONE]":
            continue
        try:
            events.append(orjson.loads(payload))
        except orjson.JSONDecodeError:
            continue
    if dialect == ANTHROPIC:
        return _anthropic_stream(events)
    if dialect == CHAT:
        return _chat_stream(events)
    return _responses_stream(events)


def _from_json(dialect: str, body: Any) -> Reassembled:
    if not isinstance(body, dict):
        return Reassembled()
    usage = body.get("usage") or {}
    model = body.get("model")
    if dialect == ANTHROPIC:
        message = {"role": "assistant", "content": body.get("content", [])}
        return Reassembled([message], usage, model, True)
    if dialect == CHAT:
        choices = body.get("choices") or [{}]
        message = choices[0].get("message") or {}
        return Reassembled([message], usage, model, True)
    return Reassembled(list(body.get("output") or []), usage, model, True)


def _anthropic_stream(events: list[Any]) -> Reassembled:
    out = Reassembled()
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    for ev in events:
        kind = ev.get("type") if isinstance(ev, dict) else None
        if kind == "message_start":
            message = ev.get("message") or {}
            out.model = message.get("model")
            out.usage = dict(message.get("usage") or {})
        elif kind == "content_block_start":
            blocks[ev["index"]] = dict(ev.get("content_block") or {})
        elif kind == "content_block_delta":
            _anthropic_delta(blocks.setdefault(ev["index"], {}), partial, ev)
        elif kind == "content_block_stop" and ev.get("index") in partial:
            raw = "".join(partial.pop(ev["index"]))
            block = blocks.get(ev["index"], {})
            try:
                block["input"] = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                block["input"] = raw
        elif kind == "message_delta":
            out.usage.update(ev.get("usage") or {})
        elif kind == "message_stop":
            out.complete = True
    content = [blocks[i] for i in sorted(blocks)]
    out.response = [{"role": "assistant", "content": content}]
    return out


def _anthropic_delta(block: dict[str, Any], partial: dict[int, list[str]], ev: Any) -> None:
    delta = ev.get("delta") or {}
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "input_json_delta":
        partial.setdefault(ev["index"], []).append(delta.get("partial_json", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = block.get("signature", "") + delta.get("signature", "")
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))


def _chat_stream(events: list[Any]) -> Reassembled:
    out = Reassembled()
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls: dict[int, dict[str, Any]] = {}
    for ev in events:
        if not isinstance(ev, dict):
            continue
        out.model = ev.get("model") or out.model
        if ev.get("usage"):
            out.usage = dict(ev["usage"])
        for choice in ev.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for key in ("content", "reasoning_content", "refusal"):
                if delta.get(key):
                    message[key] = (message.get(key) or "") + delta[key]
            for frag in delta.get("tool_calls") or ():
                _chat_tool_fragment(calls, frag)
            if choice.get("finish_reason"):
                out.complete = True
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    out.response = [message]
    return out


def _chat_tool_fragment(calls: dict[int, dict[str, Any]], frag: dict[str, Any]) -> None:
    call = calls.setdefault(int(frag.get("index", 0)), {
        "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    if frag.get("id"):
        call["id"] = frag["id"]
    function = frag.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def _responses_stream(events: list[Any]) -> Reassembled:
    out = Reassembled()
    done: dict[int, Any] = {}
    for ev in events:
        kind = ev.get("type") if isinstance(ev, dict) else None
        if kind == "response.output_item.done":
            done[int(ev.get("output_index", len(done)))] = ev.get("item")
        elif kind in ("response.created", "response.completed", "response.incomplete",
                      "response.failed"):
            response = ev.get("response") or {}
            out.model = response.get("model") or out.model
            if kind != "response.created":
                out.usage = dict(response.get("usage") or {})
                out.response = list(response.get("output") or [])
                out.complete = True
    if not out.complete:
        out.response = [done[i] for i in sorted(done)]
    return out
