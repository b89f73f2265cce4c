"""Gemini API ``generateContent``: ``{"contents": [{"role": "user"|"model", "parts": [...]}],
"systemInstruction", "tools", "toolConfig", "generationConfig"}``.

A part holds one of ``text`` (``thought: true`` marks a thought summary), ``functionCall``
(``name``, ``args``, optional ``id``), ``functionResponse`` (``name``, ``response``,
optional ``id``, optional ``parts``), ``inlineData`` / ``fileData``, ``executableCode`` /
``codeExecutionResult``, and beside it an optional ``thoughtSignature`` (an encrypted blob
the model needs back byte for byte: a part carrying one is never rewritten). The REST API
takes field names in ``lowerCamelCase`` and in ``snake_case``; both are read. A content
holding a part key this dialect does not model is opaque: kept whole, counted by its JSON.

Pairing, as the API defines it: a function response answers the call of the same ``id``
when the call has one, else the call of the same ``name`` (the k-th response named ``f``
in a content answers the k-th call named ``f`` of the call content).

Validity, as the API enforces it (its own error messages):

- "function call turn comes immediately after a user turn or after a function response
  turn": a model content with function calls follows a user content;
- "function response turn comes immediately after a function call turn", and "the number
  of function response parts is equal to the number of function call parts of the
  function call turn";
- thought signatures (Gemini 3): every step of the current turn (the contents after the
  last user content that is not function responses) returns the signature of its first
  function call. A model that signs its calls shows it in the history: the rule is
  checked when some function call of the history carries a signature (Gemini 2.5 and
  earlier accept unsigned calls).

Consecutive user contents are valid: Gemini CLI sends them itself (its routing request),
and the engine's compaction message, a user text, may follow the head's user prompt.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from ..errors import ValidationError
from ._base import Dialect, Part, json_text, truncated
from ._objects import check_objects, not_an_object

__all__ = ["GeminiDialect"]

#: the parts' keys, camelCase (what the SDKs send) then snake_case (also accepted)
_SNAKE = {"thoughtSignature": "thought_signature", "functionCall": "function_call",
          "functionResponse": "function_response", "inlineData": "inline_data",
          "fileData": "file_data", "executableCode": "executable_code",
          "codeExecutionResult": "code_execution_result", "videoMetadata": "video_metadata",
          "partMetadata": "part_metadata", "mediaResolution": "media_resolution"}
#: every key a part may hold that this dialect reads or knows to be metadata
_KNOWN_PART_KEYS = frozenset({"text", "thought", *_SNAKE, *_SNAKE.values()})
_CONTENT_KEYS = frozenset({"role", "parts"})
_ROLES = frozenset({"user", "model"})


def _get(part: dict[str, Any], key: str) -> Any:
    """A part's field under its camelCase name, else its snake_case one."""
    value = part.get(key)
    if value is None and key in _SNAKE:
        value = part.get(_SNAKE[key])
    return value


def _parts(message: Any) -> list[Any]:
    parts = message.get("parts") if isinstance(message, dict) else None
    return parts if isinstance(parts, list) else []


def _signed(part: Any) -> bool:
    return isinstance(part, dict) and bool(_get(part, "thoughtSignature"))


def _refs(parts: Iterable[Any], key: str) -> tuple[str, ...]:
    """The pairing refs of the ``key`` objects (``functionCall`` / ``functionResponse``)
    of ``parts``: the ``id`` when there is one, else ``name#k`` (the k-th of that name)."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for part in parts:
        value = _get(part, key) if isinstance(part, dict) else None
        if not isinstance(value, dict):
            continue
        ident = value.get("id")
        name = str(value.get("name", ""))
        if ident:
            out.append(str(ident))
        else:
            k = seen.get(name, 0)
            seen[name] = k + 1
            out.append(f"{name}#{k}")
    return tuple(out)


def _response_text(response: Any) -> str:
    """What a function response says: its string fields (Gemini CLI sends ``output`` or
    ``error``), then the JSON of any other fields; the JSON of a response that is not
    an object."""
    if not isinstance(response, dict):
        return json_text(response) if response is not None else ""
    texts = [v for v in response.values() if isinstance(v, str)]
    rest = {k: v for k, v in response.items() if not isinstance(v, str)}
    if rest:
        texts.append(json_text(rest))
    return "\n".join(texts)


def _response_images(value: dict[str, Any]) -> int:
    """Media parts inside a function response (``functionResponse.parts``)."""
    inner = value.get("parts")
    if not isinstance(inner, list):
        return 0
    return sum(1 for p in inner if isinstance(p, dict)
               and (_get(p, "inlineData") is not None or _get(p, "fileData") is not None))


def _part(part: Any) -> Part:
    if not isinstance(part, dict):
        return Part("other", json_text(part))
    call = _get(part, "functionCall")
    if isinstance(call, dict):
        return Part("tool_call", json_text(call.get("args", {})), str(call.get("name", "")),
                    opaque=_signed(part))
    answer = _get(part, "functionResponse")
    if isinstance(answer, dict):
        return Part("tool_result", _response_text(answer.get("response")),
                    str(answer.get("name", "")))
    text = part.get("text")
    if isinstance(text, str):
        if part.get("thought") is True or (not text and _signed(part)):
            return Part("thinking", text, opaque=_signed(part))
        return Part("text", text, opaque=_signed(part))
    if _get(part, "inlineData") is not None or _get(part, "fileData") is not None:
        return Part("image")
    code = _get(part, "executableCode")
    if isinstance(code, dict):
        return Part("text", str(code.get("code", "")))
    result = _get(part, "codeExecutionResult")
    if isinstance(result, dict):
        return Part("text", str(result.get("output", "")))
    if _signed(part):  # a signature on its own (an empty thought part)
        return Part("thinking", "", opaque=True)
    return Part("other", json_text(part))


def _with_refs(parts: list[Part], message: Any) -> list[Part]:
    """``parts`` with each call's and response's pairing ref filled in."""
    calls = iter(_refs(_parts(message), "functionCall"))
    answers = iter(_refs(_parts(message), "functionResponse"))
    out = []
    for p in parts:
        if p.kind == "tool_call":
            p = Part(p.kind, p.text, p.name, next(calls, ""), p.opaque)
        elif p.kind == "tool_result":
            p = Part(p.kind, p.text, p.name, next(answers, ""), p.opaque)
        out.append(p)
    return out


def _cuttable_text(part: Any) -> bool:
    """A plain text part the engine may cut: not a thought, no signature on it."""
    return (isinstance(part, dict) and isinstance(part.get("text"), str)
            and part.get("thought") is not True and not _signed(part))


def _response_of(part: Any) -> dict[str, Any] | None:
    """The ``response`` object of a function-response part (``None``: not one)."""
    answer = _get(part, "functionResponse") if isinstance(part, dict) else None
    response = answer.get("response") if isinstance(answer, dict) else None
    return response if isinstance(response, dict) else None


def _truncate_part(part: Any, max_chars: int) -> Any:
    if _cuttable_text(part):
        text = part["text"]
        return part if len(text) <= max_chars else {**part, "text": truncated(text, max_chars)}
    response = _response_of(part)
    if response is None:
        return part
    new = {k: truncated(v, max_chars) if isinstance(v, str) and len(v) > max_chars else v
           for k, v in response.items()}
    if all(new[k] is v for k, v in response.items()):
        return part
    key = "functionResponse" if "functionResponse" in part else "function_response"
    return {**part, key: {**part[key], "response": new}}


class GeminiDialect(Dialect):
    """Contents of the Gemini API (``generateContent`` / ``streamGenerateContent``)."""

    name: ClassVar[str] = "gemini"
    messages_key: ClassVar[str] = "contents"
    fixed_keys: ClassVar[tuple[str, ...]] = (
        "systemInstruction", "system_instruction", "tools")

    # --- reading one message -----------------------------------------------------
    def role(self, message: Any) -> str:
        if not isinstance(message, dict):
            raise not_an_object(self.name, message)
        role = message.get("role") or "user"
        if role == "model":
            return "assistant"
        if role in ("user", "function") and any(
                isinstance(p, dict) and isinstance(_get(p, "functionResponse"), dict)
                for p in _parts(message)):
            return "tool"
        return str(role)

    def is_model_output(self, message: Any) -> bool:
        return isinstance(message, dict) and message.get("role") == "model"

    def tool_call_ids(self, message: Any) -> tuple[str, ...]:
        if message.get("role") != "model":
            return ()
        return _refs(_parts(message), "functionCall")

    def tool_result_ids(self, message: Any) -> tuple[str, ...]:
        if message.get("role") == "model":
            return ()
        return _refs(_parts(message), "functionResponse")

    def parts(self, message: Any) -> list[Part]:
        parts: list[Part] = []
        for raw in _parts(message):
            part = _part(raw)
            parts.append(part)
            if part.kind == "tool_result":  # media a function returned, after its text
                parts += [Part("image")] * _response_images(_get(raw, "functionResponse"))
        if any(p.kind in ("tool_call", "tool_result") for p in parts):
            parts = _with_refs(parts, message)
        return parts

    def counted_text(self, message: Any) -> tuple[str, int]:
        # the texts ``parts`` would give, without the pairing refs (the meter's hot path)
        texts: list[str] = []
        images = 0
        for raw in _parts(message):
            part = _part(raw)
            if part.kind == "image":
                images += 1
            elif part.text:
                texts.append(part.text)
            if part.kind == "tool_result":
                images += _response_images(_get(raw, "functionResponse"))
        return "\n".join(texts), images

    # --- what the engine must keep as it is ------------------------------------------
    def is_instruction(self, message: Any) -> bool:
        return False  # instructions live in ``systemInstruction``, outside ``contents``

    def is_opaque(self, message: Any) -> bool:
        """A content with a key, or a part with a key, this dialect does not model (or a
        part that is not an object): the engine keeps it verbatim."""
        if not isinstance(message, dict):
            return False
        if not _CONTENT_KEYS.issuperset(message):
            return True
        return any(not isinstance(p, dict) or not _KNOWN_PART_KEYS.issuperset(p)
                   for p in _parts(message))

    # --- building messages --------------------------------------------------------
    def text_message(self, text: str, role: str = "user") -> Any:
        return {"role": "model" if role in ("assistant", "model") else "user",
                "parts": [{"text": text}]}

    def truncate(self, message: Any, max_chars: int) -> Any:
        parts = _parts(message)
        new = [_truncate_part(p, max_chars) for p in parts]
        if all(a is b for a, b in zip(new, parts)):
            return message
        return {**message, "parts": new}

    def truncation_texts(self, message: Any) -> list[str]:
        out: list[str] = []
        for part in _parts(message):
            if _cuttable_text(part):
                out.append(part["text"])
            elif (response := _response_of(part)) is not None:
                out += [v for v in response.values() if isinstance(v, str)]
        return out

    # --- request bodies -----------------------------------------------------------
    def messages_of(self, body: dict[str, Any]) -> list[Any]:
        messages = super().messages_of(body)
        check_objects(self.name, messages)
        return messages

    # --- validation ---------------------------------------------------------------
    def check_shape(self, message: Any, index: int) -> None:
        super().check_shape(message, index)
        role = message.get("role")
        if role is not None and role not in _ROLES:
            raise ValidationError(
                f"gemini: content {index} has role {role!r}; expected 'user' or 'model'", index)
        parts = message.get("parts")
        if not isinstance(parts, list) or not parts:
            raise ValidationError(f"gemini: content {index} has no parts (contents.parts "
                                  "must not be empty)", index)

    def check_order(self, messages: Sequence[Any]) -> None:
        found = self.order_problems(messages)
        if found:
            raise found[0]

    def order_problems(self, messages: Sequence[Any]) -> list[ValidationError]:
        out: list[ValidationError] = []
        previous: Any = None
        for i, message in enumerate(messages):
            calls = self.tool_call_ids(message)
            answers = self.tool_result_ids(message)
            if calls and (previous is None or previous.get("role") == "model"):
                out.append(ValidationError(
                    f"gemini: content {i} calls functions but does not follow a user turn or "
                    "a function response turn", i))
            if answers:
                asked = self.tool_call_ids(previous) if previous is not None else ()
                if not asked:
                    out.append(ValidationError(
                        f"gemini: content {i} answers function calls but does not follow a "
                        "function call turn", i))
                elif len(answers) != len(asked):
                    out.append(ValidationError(
                        f"gemini: content {i} has {len(answers)} function responses for the "
                        f"{len(asked)} function calls of content {i - 1}", i))
            previous = message
        return out + self._unsigned(messages)

    def _unsigned(self, messages: Sequence[Any]) -> list[ValidationError]:
        """The steps of the current turn whose first call lacks its signature, when the
        history shows a model that signs its calls."""
        if not any(_signed(p) and isinstance(_get(p, "functionCall"), dict)
                   for m in messages for p in _parts(m)):
            return []
        start = 0
        for i, message in enumerate(messages):
            if self.role(message) == "user":
                start = i
        out = []
        for i in range(start, len(messages)):
            calls = [p for p in _parts(messages[i]) if isinstance(p, dict)
                     and isinstance(_get(p, "functionCall"), dict)]
            if messages[i].get("role") == "model" and calls and not _signed(calls[0]):
                out.append(ValidationError(
                    f"gemini: content {i} of the current turn has a function call without "
                    "its thought signature", i))
        return out
