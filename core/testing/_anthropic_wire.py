"""Anthropic Messages API (``POST /v1/messages``): JSON body, SSE events, error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ._completion import Completion, Frame
from ._script import Fault, split_tokens

__all__ = ["AnthropicWire"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

#: What each block type looks like in its ``content_block_start`` event, before any delta.
_EMPTY_BLOCKS: dict[str, dict[str, Any]] = {
    "thinking": {"thinking": "", "signature": ""},
    "text": {"text": ""},
    "tool_use": {"input": {}},
}


def _usage(completion: Completion, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": completion.input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _stop_reason(completion: Completion) -> str:
    if completion.truncated:
        return "max_tokens"
    return "tool_use" if completion.tool_calls else "end_turn"


def _blocks(completion: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if completion.thinking is not None:
        thinking = completion.thinking
        blocks.append({"type": "thinking", "thinking": thinking.text,
                       "signature": thinking.signature})
    if completion.text or not completion.tool_calls:
        blocks.append({"type": "text", "text": completion.text})
    for index, call in enumerate(completion.tool_calls):
        blocks.append({"type": "tool_use", "id": completion.call_id("toolu_", index),
                       "name": call.name, "input": json.loads(call.arguments_json)})
    return blocks


class AnthropicWire:
    """Messages: ``message_start`` … ``content_block_*`` … ``message_delta``, ``message_stop``."""

    name = "anthropic"

    def output_budget(self, body: dict[str, Any]) -> int | None:
        budget = body.get("max_tokens")
        return int(budget) if budget is not None else None

    def render(self, completion: Completion, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": completion.item_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": completion.model,
            "content": _blocks(completion),
            "stop_reason": _stop_reason(completion),
            "stop_sequence": None,
            "usage": _usage(completion, completion.output_tokens),
        }

    def frames(self, completion: Completion, body: dict[str, Any]) -> Iterator[Frame]:
        start = {**self.render(completion, body), "content": [], "stop_reason": None}
        start["usage"] = _usage(completion, 1)
        yield Frame({"type": "message_start", "message": start}, "message_start")
        yield Frame({"type": "ping"}, "ping")
        for index, block in enumerate(_blocks(completion)):
            yield from _block_frames(index, block)
        yield Frame(
            {"type": "message_delta",
             "delta": {"stop_reason": _stop_reason(completion), "stop_sequence": None},
             "usage": _usage(completion, completion.output_tokens)},
            "message_delta",
        )
        yield Frame({"type": "message_stop"}, "message_stop")

    def error(self, fault: Fault, input_tokens: int) -> tuple[int, dict[str, Any]]:
        status = fault.status or 400
        message = fault.message or _default_message(fault, status, input_tokens)
        fallback = "api_error" if status >= 500 else "invalid_request_error"
        error_type = _ERROR_TYPES.get(status, fallback)
        return status, {"type": "error", "error": {"type": error_type, "message": message}}


def _default_message(fault: Fault, status: int, input_tokens: int) -> str:
    if fault.kind == "context_length":
        tokens = fault.tokens or max(input_tokens, fault.limit + 1)
        return f"prompt is too long: {tokens} tokens > {fault.limit} maximum"
    return {529: "Overloaded", 504: "Request timed out"}.get(status, f"simulated error {status}")


def _block_frames(index: int, block: dict[str, Any]) -> Iterator[Frame]:
    """``content_block_start``, its deltas, ``content_block_stop`` for one content block."""
    kind = block["type"]
    empty: dict[str, Any] = _EMPTY_BLOCKS[kind]
    opening = {**block, **empty}
    yield Frame({"type": "content_block_start", "index": index, "content_block": opening},
                "content_block_start")
    for delta, tokens in _deltas(block):
        yield Frame({"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta", tokens)
    yield Frame({"type": "content_block_stop", "index": index}, "content_block_stop")


def _deltas(block: dict[str, Any]) -> Iterator[tuple[dict[str, Any], int]]:
    kind = block["type"]
    if kind == "thinking":
        for piece in split_tokens(block["thinking"]):
            yield {"type": "thinking_delta", "thinking": piece}, 1
        yield {"type": "signature_delta", "signature": block["signature"]}, 0
    elif kind == "text":
        for piece in split_tokens(block["text"]):
            yield {"type": "text_delta", "text": piece}, 1
    else:
        arguments = json.dumps(block["input"], separators=(",", ":"), ensure_ascii=False)
        for piece in split_tokens(arguments):
            yield {"type": "input_json_delta", "partial_json": piece}, 1
