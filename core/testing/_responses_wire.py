"""OpenAI Responses API (``POST /v1/responses``, ``/v1/responses/compact``)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

from ._completion import Completion, Frame, token_logprobs
from ._openai_wire import openai_error
from ._script import Fault, estimate_tokens, prompt_tokens, split_tokens

__all__ = ["ResponsesWire", "compacted"]


def _usage(completion: Completion) -> dict[str, Any]:
    reasoning = estimate_tokens(completion.thinking.text) if completion.thinking else 0
    return {
        "input_tokens": completion.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion.output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": completion.input_tokens + completion.output_tokens,
    }


def _top_logprobs(body: dict[str, Any]) -> int | None:
    if "message.output_text.logprobs" not in (body.get("include") or []):
        return None
    return int(body.get("top_logprobs") or 0)


def _items(completion: Completion, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The finished output items: reasoning, message, function calls."""
    items: list[dict[str, Any]] = []
    if completion.thinking is not None:
        items.append({"type": "reasoning", "id": completion.item_id("rs"),
                      "summary": [{"type": "summary_text", "text": completion.thinking.text}],
                      "encrypted_content": completion.thinking.signature})
    if completion.text or not completion.tool_calls:
        top = _top_logprobs(body)
        logprobs = token_logprobs(split_tokens(completion.text), 0, top) if top is not None else []
        part = {"type": "output_text", "text": completion.text, "annotations": [],
                "logprobs": logprobs}
        items.append({"type": "message", "id": completion.item_id("msg"), "status": "completed",
                      "role": "assistant", "content": [part]})
    for index, call in enumerate(completion.tool_calls):
        if call.custom:
            items.append({"type": "custom_tool_call", "id": completion.item_id("ctc", index),
                          "call_id": completion.call_id("call_", index), "name": call.name,
                          "input": call.arguments_json, "status": "completed"})
            continue
        items.append({"type": "function_call", "id": completion.item_id("fc", index),
                      "call_id": completion.call_id("call_", index), "name": call.name,
                      "arguments": call.arguments_json, "status": "completed"})
    return items


class ResponsesWire:
    """Responses: ``response`` JSON; ``event: response.*`` SSE with ``sequence_number``."""

    name = "openai-responses"

    def output_budget(self, body: dict[str, Any]) -> int | None:
        budget = body.get("max_output_tokens")
        return int(budget) if budget is not None else None

    def render(self, completion: Completion, body: dict[str, Any]) -> dict[str, Any]:
        done = {"status": "incomplete" if completion.truncated else "completed",
                "completed_at": time.time(), "output": _items(completion, body),
                "usage": _usage(completion)}
        if completion.truncated:
            done["incomplete_details"] = {"reason": "max_output_tokens"}
        return {**self._snapshot(completion, body), **done}

    def frames(self, completion: Completion, body: dict[str, Any]) -> Iterator[Frame]:
        sequence = iter(range(1_000_000))
        snapshot = self._snapshot(completion, body)
        yield _frame(sequence, "response.created", response=snapshot)
        yield _frame(sequence, "response.in_progress", response=snapshot)
        for index, item in enumerate(_items(completion, body)):
            yield from _item_frames(sequence, index, item)
        final = self.render(completion, body)
        kind = "response.incomplete" if completion.truncated else "response.completed"
        yield _frame(sequence, kind, response=final)

    def error(self, fault: Fault, input_tokens: int) -> tuple[int, dict[str, Any]]:
        return openai_error(fault, input_tokens, param="input")

    def _snapshot(self, completion: Completion, body: dict[str, Any]) -> dict[str, Any]:
        """The in-progress ``response`` object, echoing the request's settings."""
        return {
            "id": completion.item_id("resp"), "object": "response",
            "created_at": completion.created, "status": "in_progress", "error": None,
            "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": completion.model,
            "output": [], "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
            "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
            "text": body.get("text", {"format": {"type": "text"}}),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
            "top_p": body.get("top_p", 1.0), "truncation": body.get("truncation", "disabled"),
            "usage": None, "user": None, "metadata": body.get("metadata") or {},
        }

#: How each output item looks in ``response.output_item.added``, before its deltas.
_OPENERS: dict[str, dict[str, Any]] = {
    "reasoning": {"summary": []},
    "message": {"content": [], "status": "in_progress"},
    "function_call": {"arguments": "", "status": "in_progress"},
    "custom_tool_call": {"input": "", "status": "in_progress"},
}


def _frame(sequence: Iterator[int], kind: str, tokens: int = 0, **fields: Any) -> Frame:
    return Frame({"type": kind, "sequence_number": next(sequence), **fields}, kind, tokens)


def _item_frames(sequence: Iterator[int], index: int, item: dict[str, Any]) -> Iterator[Frame]:
    """``output_item.added``, the item's own deltas, ``output_item.done``."""
    opening = {**item, **_OPENERS[item["type"]]}
    yield _frame(sequence, "response.output_item.added", output_index=index, item=opening)
    streams = {"reasoning": _reasoning_frames, "message": _message_frames,
               "function_call": _call_frames, "custom_tool_call": _custom_frames}
    yield from streams[item["type"]](sequence, index, item)
    yield _frame(sequence, "response.output_item.done", output_index=index, item=item)


def _reasoning_frames(sequence: Iterator[int], index: int,
                      item: dict[str, Any]) -> Iterator[Frame]:
    where = {"item_id": item["id"], "output_index": index, "summary_index": 0}
    part = item["summary"][0]
    yield _frame(sequence, "response.reasoning_summary_part.added", **where,
                 part={"type": "summary_text", "text": ""})
    for piece in split_tokens(part["text"]):
        yield _frame(sequence, "response.reasoning_summary_text.delta", 1, **where, delta=piece)
    yield _frame(sequence, "response.reasoning_summary_text.done", **where, text=part["text"])
    yield _frame(sequence, "response.reasoning_summary_part.done", **where, part=part)


def _message_frames(sequence: Iterator[int], index: int, item: dict[str, Any]) -> Iterator[Frame]:
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    part = item["content"][0]
    yield _frame(sequence, "response.content_part.added", **where,
                 part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
    scored = part["logprobs"]
    for position, piece in enumerate(split_tokens(part["text"])):
        logprobs = scored[position : position + 1]
        yield _frame(sequence, "response.output_text.delta", 1, **where, delta=piece,
                     logprobs=logprobs)
    yield _frame(sequence, "response.output_text.done", **where, text=part["text"],
                 logprobs=scored)
    yield _frame(sequence, "response.content_part.done", **where, part=part)


def _call_frames(sequence: Iterator[int], index: int, item: dict[str, Any]) -> Iterator[Frame]:
    where = {"item_id": item["id"], "output_index": index}
    for piece in split_tokens(item["arguments"]):
        yield _frame(sequence, "response.function_call_arguments.delta", 1, **where, delta=piece)
    yield _frame(sequence, "response.function_call_arguments.done", **where,
                 name=item["name"], arguments=item["arguments"])


def _custom_frames(sequence: Iterator[int], index: int, item: dict[str, Any]
                   ) -> Iterator[Frame]:
    where = {"item_id": item["id"], "output_index": index}
    for piece in split_tokens(item["input"]):
        yield _frame(sequence, "response.custom_tool_call_input.delta", 1, **where, delta=piece)
    yield _frame(sequence, "response.custom_tool_call_input.done", **where, input=item["input"])


def compacted(body: dict[str, Any], ordinal: int) -> dict[str, Any]:
    """A minimal valid ``response.compaction``: one opaque compaction item for the input."""
    blob = json.dumps(body.get("input"), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    tokens = prompt_tokens(body)
    usage = {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 16, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": tokens + 16}
    item = {"type": "compaction", "id": f"cmp_sim{ordinal:04d}",
            "encrypted_content": f"sim-compaction:{digest}"}
    return {"id": f"resp_sim{ordinal:04d}", "object": "response.compaction",
            "created_at": int(time.time()), "output": [item], "usage": usage}
