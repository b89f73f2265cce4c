"""OpenAI Chat Completions (``POST /v1/chat/completions``) and OpenAI's error shape.

With a tokenizer (``UpstreamSim(tokenizer=...)``) it also answers as vLLM's
OpenAI-compatible server does (``vllm/entrypoints/openai/chat_completion``): a request
with ``return_token_ids: true`` gets the top-level ``prompt_token_ids`` and choice 0's
``token_ids`` (every sampled token: text, tool-call text, the stop token); in a stream the
first chunk carries ``prompt_token_ids`` and each later chunk its own ``token_ids``.
``logprobs`` then score those same tokens, one entry per id, with each token's exact
``bytes`` (vLLM scores tool-call tokens too; OpenAI's own API does not, nor without ids);
with ``return_tokens_as_token_ids: true`` each scored token is named ``token_id:<id>``
(its ``bytes`` those of that name), as vLLM writes them.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Any

from ._completion import Completion, Frame, SampledIds, token_logprobs
from ._script import Fault, split_tokens

__all__ = ["ChatWire", "openai_error"]

#: One chunk's (delta, logprobs, output tokens carried).
_Delta = tuple[dict[str, Any], "dict[str, Any] | None", int]

_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", None),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    504: ("server_error", "timeout"),
}


def openai_error(fault: Fault, input_tokens: int, *, param: str) -> tuple[int, dict[str, Any]]:
    """OpenAI's ``{"error": {message, type, param, code}}`` for ``fault``."""
    status = fault.status or 400
    error_type, code = _ERROR_TYPES.get(status, ("server_error", None))
    message = fault.message or f"simulated error {status}"
    if fault.kind == "context_length":
        tokens = fault.tokens or max(input_tokens, fault.limit + 1)
        code = "context_length_exceeded"
        message = fault.message or _context_message(param, fault.limit, tokens)
    error = {"message": message, "type": error_type, "param": param if code else None, "code": code}
    return status, {"error": error}


def _context_message(param: str, limit: int, tokens: int) -> str:
    if param == "input":  # the Responses API words it without numbers
        return ("Your input exceeds the context window of this model. "
                "Please adjust your input and try again.")
    return (f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {tokens} tokens. Please reduce the length of the messages.")


def _finish_reason(completion: Completion) -> str:
    if completion.truncated:
        return "length"
    return "tool_calls" if completion.tool_calls else "stop"


def _usage(completion: Completion) -> dict[str, Any]:
    reasoning = 0  # chat completions carries no thinking in this simulator
    return {
        "prompt_tokens": completion.input_tokens,
        "completion_tokens": completion.output_tokens,
        "total_tokens": completion.input_tokens + completion.output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }


def _top_logprobs(body: dict[str, Any]) -> int | None:
    """How many alternatives per token the request asked for; None if no logprobs."""
    return int(body.get("top_logprobs") or 0) if body.get("logprobs") else None


def _named_ids(body: dict[str, Any], ids: list[int] | None) -> list[int] | None:
    """The sampled ids when the request asked vLLM to name tokens by id."""
    return ids if ids is not None and body.get("return_tokens_as_token_ids") else None


class ChatWire:
    """Chat Completions: ``chat.completion`` JSON; ``data:`` chunks ending ``data: [DONE]``."""

    name = "openai-chat"

    def output_budget(self, body: dict[str, Any]) -> int | None:
        budget = body.get("max_completion_tokens", body.get("max_tokens"))
        return int(budget) if budget is not None else None

    def render(self, completion: Completion, body: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": completion.text if completion.text or not completion.tool_calls else None,
            "refusal": None,
            "annotations": [],
        }
        if completion.tool_calls:
            message["tool_calls"] = [
                {"id": completion.call_id("call_", i), "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments_json}}
                for i, call in enumerate(completion.tool_calls)
            ]
        top = _top_logprobs(body)
        ids = completion.ids
        logprobs = None
        if top is not None:
            pieces = ids.pieces if ids else split_tokens(completion.text)
            named = _named_ids(body, ids.response if ids else None)
            logprobs = {"content": token_logprobs(pieces, 0, top, named), "refusal": None}
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": logprobs,
                                  "finish_reason": _finish_reason(completion)}
        out = {**self._envelope(completion, "chat.completion"), "choices": [choice],
               "usage": _usage(completion)}
        if ids is not None and body.get("return_token_ids"):
            choice["token_ids"] = list(ids.response)
            out["prompt_token_ids"] = list(ids.prompt)
        return out

    def frames(self, completion: Completion, body: dict[str, Any]) -> Iterator[Frame]:
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        extra = {"usage": None} if with_usage else {}
        if completion.ids is not None:
            yield from self._id_frames(completion, completion.ids, body, extra)
            return
        for delta, logprobs, tokens in self._deltas(completion, body):
            yield Frame({**self._chunk(completion, delta, logprobs), **extra}, tokens=tokens)
        final = self._chunk(completion, {}, None)
        final["choices"][0]["finish_reason"] = _finish_reason(completion)
        yield Frame({**final, **extra})
        yield from self._closing(completion, with_usage)

    def _closing(self, completion: Completion, with_usage: bool) -> Iterator[Frame]:
        if with_usage:
            yield Frame({**self._envelope(completion, "chat.completion.chunk"), "choices": [],
                         "usage": _usage(completion)})
        yield Frame("[DONE]")

    def _id_frames(self, completion: Completion, ids: SampledIds, body: dict[str, Any],
                   extra: dict[str, Any]) -> Iterator[Frame]:
        """A stream as vLLM sends it: one chunk per sampled token of the text (its
        ``token_ids`` and ``logprobs``), the tool-call tokens with the first call's opening
        delta, the stop token with the finishing chunk."""
        top = _top_logprobs(body)
        with_ids = bool(body.get("return_token_ids"))

        def chunk(delta: dict[str, Any], start: int, end: int,
                  finish: str | None = None) -> dict[str, Any]:
            logprobs = None
            if top is not None and end > start:
                named = _named_ids(body, ids.response[start:end])
                logprobs = {"content": token_logprobs(ids.pieces[start:end], start, top, named),
                            "refusal": None}
            out = self._chunk(completion, delta, logprobs)
            if with_ids:
                out["choices"][0]["token_ids"] = list(ids.response[start:end])
            out["choices"][0]["finish_reason"] = finish
            return {**out, **extra}

        has_text = bool(completion.text) or not completion.tool_calls
        first = self._chunk(completion, {"role": "assistant", "content": "" if has_text
                                         else None, "refusal": None}, None)
        if with_ids:
            first["prompt_token_ids"] = list(ids.prompt)
        yield Frame({**first, **extra})
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        last = len(ids.response) - 1 if ids.response else 0
        shown = position = 0
        while position < last and shown < ids.text_chars:
            text = decoder.decode(ids.pieces[position])[: ids.text_chars - shown]
            shown += len(text)
            yield Frame(chunk({"content": text}, position, position + 1), tokens=1)
            position += 1
        if shown < len(completion.text):  # held back by the decoder, or not aligned
            yield Frame(chunk({"content": completion.text[shown:]}, position, position))
        for index, call in enumerate(completion.tool_calls):
            opening = {"index": index, "id": completion.call_id("call_", index),
                       "type": "function", "function": {"name": call.name, "arguments": ""}}
            end = last if index == 0 else position
            yield Frame(chunk({"tool_calls": [opening]}, position, end), tokens=end - position)
            position = end
            arguments = {"index": index, "function": {"arguments": call.arguments_json}}
            yield Frame(chunk({"tool_calls": [arguments]}, position, position))
        yield Frame(chunk({}, position, len(ids.response), _finish_reason(completion)),
                    tokens=len(ids.response) - position)
        yield from self._closing(completion, bool(extra))

    def error(self, fault: Fault, input_tokens: int) -> tuple[int, dict[str, Any]]:
        return openai_error(fault, input_tokens, param="messages")

    def _envelope(self, completion: Completion, kind: str) -> dict[str, Any]:
        return {"id": f"chatcmpl-sim{completion.ordinal:06d}", "object": kind,
                "created": completion.created, "model": completion.model,
                "system_fingerprint": "fp_upstream_sim", "service_tier": "default"}

    def _chunk(self, completion: Completion, delta: dict[str, Any],
               logprobs: dict[str, Any] | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        return {**self._envelope(completion, "chat.completion.chunk"), "choices": [choice]}

    def _deltas(self, completion: Completion, body: dict[str, Any]) -> Iterator[_Delta]:
        """(delta, logprobs, tokens) for each chunk before the finishing one."""
        has_text = bool(completion.text) or not completion.tool_calls
        yield {"role": "assistant", "content": "" if has_text else None, "refusal": None}, None, 0
        top = _top_logprobs(body)
        for position, piece in enumerate(split_tokens(completion.text)):
            logprobs = None
            if top is not None:
                logprobs = {"content": token_logprobs([piece], position, top), "refusal": None}
            yield {"content": piece}, logprobs, 1
        for index, call in enumerate(completion.tool_calls):
            opening = {"index": index, "id": completion.call_id("call_", index), "type": "function",
                       "function": {"name": call.name, "arguments": ""}}
            yield {"tool_calls": [opening]}, None, 1
            for piece in split_tokens(call.arguments_json):
                yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, None, 1
