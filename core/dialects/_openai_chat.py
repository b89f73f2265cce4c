"""OpenAI Chat Completions: ``{"role", "content", "tool_calls", "tool_call_id", ...}``.

Content is a string, ``None`` (assistant with tool calls) or a list of parts (``text``,
``image_url``, ``input_audio``, ``file``, ``refusal``). ``reasoning_content`` (DeepSeek,
vLLM) is read as thinking. ``system`` and ``developer`` messages are instructions; a
message with a content part type not listed here is opaque (kept verbatim, counted by the
part's JSON).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..errors import ValidationError
from ._base import Dialect, Part, json_text, truncated
from ._objects import check_objects, not_an_object

__all__ = ["OpenAIChatDialect"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_KNOWN_PARTS = frozenset({"text", "refusal", "image_url", "input_image", "file", "input_audio"})


def _content_parts(content: Any) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [Part("text", content)]
    parts: list[Part] = []
    for item in content if isinstance(content, list) else ():
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text":
            parts.append(Part("text", str(item.get("text", ""))))
        elif kind == "refusal":
            parts.append(Part("text", str(item.get("refusal", ""))))
        elif kind in ("image_url", "input_image", "file", "input_audio"):
            parts.append(Part("image"))
        else:  # not modelled: its JSON is what it counts (its message is kept verbatim)
            parts.append(Part("other", json_text(item)))
    return parts


def _has_unknown_part(content: Any) -> bool:
    return isinstance(content, list) and any(
        not isinstance(item, dict) or item.get("type") not in _KNOWN_PARTS for item in content)


def _truncate_content(content: Any, max_chars: int) -> Any:
    if isinstance(content, str):
        return content if len(content) <= max_chars else truncated(content, max_chars)
    if not isinstance(content, list):
        return content
    out = []
    for item in content:
        if not isinstance(item, dict):
            out.append(item)
            continue
        text = item.get("text")
        if item.get("type") == "text" and isinstance(text, str) and len(text) > max_chars:
            item = {**item, "text": truncated(text, max_chars)}
        out.append(item)
    return content if all(a is b for a, b in zip(out, content)) else out


class OpenAIChatDialect(Dialect):
    """Messages of the OpenAI Chat Completions API (and every compatible server)."""

    name: ClassVar[str] = "openai_chat"

    def role(self, message: Any) -> str:
        if not isinstance(message, dict):
            raise not_an_object(self.name, message)
        role = str(message.get("role", ""))
        return "tool" if role == "function" else role

    def is_opaque(self, message: Any) -> bool:
        """A message with a content part type this dialect does not model."""
        return isinstance(message, dict) and _has_unknown_part(message.get("content"))

    def messages_of(self, body: dict[str, Any]) -> list[Any]:
        messages = super().messages_of(body)
        check_objects(self.name, messages)
        return messages

    def tool_call_ids(self, message: Any) -> tuple[str, ...]:
        calls = message.get("tool_calls")
        if not calls:
            return ()
        return tuple(str(c.get("id", "")) for c in calls if isinstance(c, dict))

    def tool_result_ids(self, message: Any) -> tuple[str, ...]:
        if message.get("role") != "tool":
            return ()
        return (str(message.get("tool_call_id", "")),)

    def parts(self, message: Any) -> list[Part]:
        parts: list[Part] = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            parts.append(Part("thinking", reasoning))
        if message.get("role") == "tool":
            texts = [p.text for p in _content_parts(message.get("content"))]
            ref = str(message.get("tool_call_id", ""))
            return [*parts, Part("tool_result", "\n".join(texts), ref=ref)]
        parts.extend(_content_parts(message.get("content")))
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            parts.append(Part("tool_call", str(fn.get("arguments", "")), str(fn.get("name", "")),
                              str(call.get("id", ""))))
        return parts

    def counted_text(self, message: Any) -> tuple[str, int]:
        # the texts ``parts`` would give, without building them (the meter's hot path)
        texts: list[str] = []
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            texts.append(reasoning)
        content = message.get("content")
        images = 0
        if message.get("role") == "tool":
            text = content if isinstance(content, str) else "\n".join(
                [p.text for p in _content_parts(content)])
            if text:
                texts.append(text)
            return "\n".join(texts), 0
        if isinstance(content, str):
            if content:
                texts.append(content)
        elif isinstance(content, list):
            for part in _content_parts(content):
                if part.text:
                    texts.append(part.text)
                elif part.kind == "image":
                    images += 1
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            text = str(fn.get("arguments", ""))
            if text:
                texts.append(text)
        return "\n".join(texts), images

    def text_message(self, text: str, role: str = "user") -> Any:
        return {"role": role, "content": text}

    def truncate(self, message: Any, max_chars: int) -> Any:
        content = message.get("content")
        new = _truncate_content(content, max_chars)
        return message if new is content else {**message, "content": new}

    def check_shape(self, message: Any, index: int) -> None:
        super().check_shape(message, index)
        if message.get("role") not in _ROLES:
            raise ValidationError(
                f"openai_chat: message {index} has unknown role {message.get('role')!r}", index
            )

    def check_order(self, messages: Sequence[Any]) -> None:
        # Tool messages must directly follow the assistant message that called them (or
        # its other tool messages): checked by the generic pairing rule in turns.validate.
        return None
