"""Gemini API (``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent``
with ``alt=sse``, ``:countTokens``): what Gemini CLI 0.61.0 sends and expects, as captured
from the real CLI (tests/clis/data), and the API's answers in its shapes.

An answer is a ``GenerateContentResponse``: candidate 0's ``content`` (role ``model``,
``parts``), ``finishReason``, ``usageMetadata``, ``modelVersion``, ``responseId``; a
streamed one is a run of them as server-sent events (``data: {...}``, no event names),
usage in each, ``finishReason`` on the last. Like the API, the simulator signs what a
Gemini 3 model signs (``thoughtSignature`` on the first function call of each answer, or
on the last part of an answer without calls) and refuses, with the API's own messages, a
request the API refuses: a function call turn that does not follow a user turn, a function
response turn that does not follow the call turn or answers another number of calls, an
empty ``parts``, an unknown role, and, for a Gemini 3 model, a step of the current turn
whose first function call lacks its signature or carries one that belongs to another call.
Models named ``gemini-1…`` / ``gemini-2…`` neither sign nor check signatures (Gemini 2.5
accepts unsigned calls).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ._completion import Completion, Frame
from ._script import Fault, estimate_tokens

__all__ = ["GeminiWire", "gemini_error", "schema_sample"]

_GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                  404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                  503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
_SIG_PREFIX = "simsig:"
_CHUNK_CHARS = 64  # text per streamed chunk (the API streams a few dozen tokens at a time)
_CALL_AFTER_USER = ("Please ensure that function call turn comes immediately after a user "
                    "turn or after a function response turn.")
_RESPONSE_AFTER_CALL = ("Please ensure that function response turn comes immediately after a "
                        "function call turn.")
_RESPONSE_COUNT = ("Please ensure that the number of function response parts is equal to the "
                   "number of function call parts of the function call turn.")


def gemini_error(fault: Fault, input_tokens: int) -> tuple[int, dict[str, Any]]:
    """Google's ``{"error": {code, message, status}}`` for ``fault``."""
    status = fault.status or 400
    message = fault.message or f"simulated error {status}"
    if fault.kind == "context_length":
        tokens = fault.tokens or max(input_tokens, fault.limit + 1)
        message = fault.message or (f"The input token count ({tokens}) exceeds the maximum "
                                    f"number of tokens allowed ({fault.limit}).")
    google = _GOOGLE_STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    return status, {"error": {"code": status, "message": message, "status": google}}


def signature_of(name: str, args: Any) -> str:
    """The signature the simulator gives a function call (it checks it comes back with it)."""
    blob = json.dumps([name, args], sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return base64.b64encode(f"{_SIG_PREFIX}{digest}".encode()).decode()


def _signs(model: str) -> bool:
    """Gemini 3 and later sign their answers and require the signatures back."""
    return not model.removeprefix("models/").startswith(("gemini-1", "gemini-2"))


def _parts_of(content: Any) -> list[Any]:
    parts = content.get("parts") if isinstance(content, Mapping) else None
    return parts if isinstance(parts, list) else []


def _field(part: Any, camel: str, snake: str) -> Any:
    if not isinstance(part, Mapping):
        return None
    value = part.get(camel)
    return part.get(snake) if value is None else value


def _calls(content: Any) -> list[Any]:
    return [p for p in _parts_of(content)
            if isinstance(_field(p, "functionCall", "function_call"), Mapping)]


def _responses(content: Any) -> list[Any]:
    return [p for p in _parts_of(content)
            if isinstance(_field(p, "functionResponse", "function_response"), Mapping)]


def _role(content: Any) -> Any:
    return content.get("role") or "user" if isinstance(content, Mapping) else None


def refusal(body: Mapping[str, Any], model: str) -> str | None:
    """The API's message refusing ``body`` sent to ``model``, or ``None``."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified\n"
    previous: Any = None
    for i, content in enumerate(contents):
        if _role(content) not in ("user", "model"):
            return "Please use a valid role: user, model."
        if not _parts_of(content):
            return (f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not "
                    "be empty.\n")
        calls, answers = _calls(content), _responses(content)
        if calls and (previous is None or _role(previous) == "model"):
            return _CALL_AFTER_USER
        if answers and not _calls(previous):
            return _RESPONSE_AFTER_CALL
        if answers and len(answers) != len(_calls(previous)):
            return _RESPONSE_COUNT
        previous = content
    return _signature_problem(contents) if _signs(model) else None


def _signature_problem(contents: Sequence[Any]) -> str | None:
    """A step of the current turn (after the last user content that is not function
    responses) whose first call lacks its signature, or whose signature is another call's."""
    start = max((i for i, c in enumerate(contents)
                 if _role(c) == "user" and not _responses(c)), default=0)
    for content in contents[start:]:
        calls = _calls(content) if _role(content) == "model" else []
        for position, part in enumerate(calls):
            call = _field(part, "functionCall", "function_call")
            signature = _field(part, "thoughtSignature", "thought_signature")
            if position == 0 and not signature:
                return ("Function call is missing a thought_signature in functionCall parts. "
                        "This is required for tools to work correctly, and missing "
                        "thought_signature may lead to degraded model performance. Additional "
                        f"data, function call `default_api:{call.get('name')}` , position "
                        f"{_parts_of(content).index(part) + 1}. Please refer to "
                        "https://ai.google.dev/gemini-api/docs/thought-signatures for more "
                        "details.")
            if signature and _forged(signature, call):
                return "Corrupted thought signature."
    return None


def _forged(signature: str, call: Mapping[str, Any]) -> bool:
    """A signature the simulator issued, returned on another call than its own."""
    try:
        text = base64.b64decode(signature, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return False
    if not text.startswith(_SIG_PREFIX):
        return False
    return signature != signature_of(str(call.get("name", "")), call.get("args", {}))


def schema_sample(schema: Any) -> Any:
    """A value of the JSON schema ``schema`` (Gemini's ``OBJECT``/``STRING`` type names or
    JSON Schema's): what a model following ``responseJsonSchema`` answers, in its
    simplest form (numbers at their floor: Gemini CLI's loop check reads a confidence of
    0.0 as "no loop", its router a complexity of 1 as "simple")."""
    if not isinstance(schema, Mapping):
        return {}
    kind = str(schema.get("type", "object")).lower()
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: schema_sample(v) for k, v in props.items()}
    if kind == "array":
        return [schema_sample(schema.get("items"))]
    floor = schema.get("minimum")
    if kind in ("integer", "number"):
        return floor if floor is not None else (1 if kind == "integer" else 0.0)
    return {"string": "simulated", "boolean": False}.get(kind)


def json_schema_of(body: Mapping[str, Any]) -> Any:
    """The JSON schema a request asks its answer to follow (``None``: free text)."""
    config = body.get("generationConfig") or body.get("generation_config") or {}
    if not isinstance(config, Mapping):
        return None
    for key in ("responseJsonSchema", "response_json_schema", "responseSchema",
                "response_schema"):
        if config.get(key):
            return config[key]
    return None


class GeminiWire:
    """``GenerateContentResponse`` JSON, or SSE chunks of it (``alt=sse``)."""

    name = "gemini"

    def output_budget(self, body: dict[str, Any]) -> int | None:
        config = body.get("generationConfig") or {}
        budget = config.get("maxOutputTokens") if isinstance(config, dict) else None
        return int(budget) if budget is not None else None

    def render(self, completion: Completion, body: dict[str, Any]) -> dict[str, Any]:
        parts = _answer_parts(completion, body)
        return self._chunk(completion, parts, completion.output_tokens, last=True)

    def frames(self, completion: Completion, body: dict[str, Any]) -> Iterator[Frame]:
        pieces = _stream_pieces(_answer_parts(completion, body))
        spent = 0
        for n, (parts, tokens) in enumerate(pieces):
            spent += tokens
            last = n == len(pieces) - 1
            chunk = self._chunk(completion, parts, completion.output_tokens if last else spent,
                                last=last)
            yield Frame(chunk, None, tokens)

    def error(self, fault: Fault, input_tokens: int) -> tuple[int, dict[str, Any]]:
        return gemini_error(fault, input_tokens)

    @staticmethod
    def _chunk(completion: Completion, parts: list[dict[str, Any]], output_tokens: int,
               last: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if last:
            candidate["finishReason"] = "MAX_TOKENS" if completion.truncated else "STOP"
            if completion.tool_calls:
                candidate["finishMessage"] = "Model generated function call(s)."
        thoughts = estimate_tokens(completion.thinking.text) if completion.thinking else 0
        usage = {"promptTokenCount": completion.input_tokens,
                 "candidatesTokenCount": output_tokens,
                 "totalTokenCount": completion.input_tokens + output_tokens + thoughts,
                 "promptTokensDetails": [{"modality": "TEXT",
                                          "tokenCount": completion.input_tokens}]}
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        return {"candidates": [candidate], "usageMetadata": usage,
                "modelVersion": completion.model.removeprefix("models/"),
                "responseId": completion.item_id("sim")}


def _answer_parts(completion: Completion, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer's parts: a thought summary (when the request includes thoughts), the
    text, the function calls; signed as a Gemini 3 model signs."""
    parts: list[dict[str, Any]] = []
    config = body.get("generationConfig") or {}
    thinking = config.get("thinkingConfig") or {} if isinstance(config, dict) else {}
    if completion.thinking is not None and thinking.get("includeThoughts"):
        parts.append({"text": completion.thinking.text, "thought": True})
    if completion.text or not completion.tool_calls:
        parts.append({"text": completion.text})
    for index, call in enumerate(completion.tool_calls):
        args = _args(call.arguments_json)
        function: dict[str, Any] = {"name": call.name, "args": args}
        if call.id is not None:
            function = {"id": call.id, **function}
        part: dict[str, Any] = {"functionCall": function}
        if index == 0 and _signs(completion.model):
            part["thoughtSignature"] = signature_of(call.name, args)
        parts.append(part)
    if not completion.tool_calls and _signs(completion.model):
        text = base64.b64encode(f"{_SIG_PREFIX}text:{completion.ordinal}".encode()).decode()
        parts[-1] = {**parts[-1], "thoughtSignature": text}
    return parts


def _args(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"input": arguments}
    return value if isinstance(value, dict) else {"input": value}


def _stream_pieces(parts: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], int]]:
    """The parts as the API streams them: text in pieces of ``_CHUNK_CHARS`` (a signature
    on the piece that ends its part), each function call whole; (parts, tokens) per chunk."""
    out: list[tuple[list[dict[str, Any]], int]] = []
    for part in parts:
        text = part.get("text")
        if not isinstance(text, str) or len(text) <= _CHUNK_CHARS:
            out.append(([part], estimate_tokens(json.dumps(part.get("functionCall", text)))))
            continue
        pieces = [text[i:i + _CHUNK_CHARS] for i in range(0, len(text), _CHUNK_CHARS)]
        for n, piece in enumerate(pieces):
            chunk = {**part, "text": piece}
            if n < len(pieces) - 1:
                chunk.pop("thoughtSignature", None)
            out.append(([chunk], estimate_tokens(piece)))
    return out
