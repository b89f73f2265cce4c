"""OpenAI Responses API input items.

Items are messages (``{"type": "message", "role", "content"}`` or the short
``{"role", "content"}``), ``function_call`` / ``function_call_output`` (paired by
``call_id``), ``custom_tool_call`` / ``custom_tool_call_output``, ``local_shell_call`` /
``local_shell_call_output``, ``reasoning`` (with ``encrypted_content``), ``compaction``
(opaque), hosted tool calls (``web_search_call``…) and ``item_reference``. Encrypted and
opaque items are never rewritten: they are kept byte-for-byte or dropped whole.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ._base import Dialect, Part, json_text, truncated
from ._objects import check_objects, not_an_object

__all__ = ["OpenAIResponsesDialect"]

_CALLS = {"function_call", "custom_tool_call", "local_shell_call", "mcp_call",
          "apply_patch_call", "shell_call"}
_OUTPUTS = {"function_call_output", "custom_tool_call_output", "local_shell_call_output",
            "apply_patch_call_output", "shell_call_output"}
_MODEL_ITEMS = _CALLS | {"reasoning", "web_search_call", "file_search_call", "computer_call",
                         "image_generation_call", "code_interpreter_call", "mcp_list_tools",
                         "mcp_approval_request"}
_KNOWN = _CALLS | _OUTPUTS | _MODEL_ITEMS | {"message", "compaction", "item_reference",
                                             "mcp_approval_response"}
_ROLES = frozenset({"system", "developer", "user", "assistant"})
_KNOWN_CONTENT = frozenset({"input_text", "output_text", "text", "refusal", "input_image",
                            "input_file", "input_audio"})


def _item_type(item: Any) -> str:
    if not isinstance(item, dict):
        raise not_an_object("openai_responses", item)
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return str(kind)


def _message_parts(content: Any) -> list[Part]:
    if isinstance(content, str):
        return [Part("text", content)]
    parts: list[Part] = []
    for c in content if isinstance(content, list) else ():
        kind = c.get("type") if isinstance(c, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append(Part("text", str(c.get("text", ""))))
        elif kind == "refusal":
            parts.append(Part("text", str(c.get("refusal", ""))))
        elif kind in ("input_image", "input_file", "input_audio"):
            parts.append(Part("image"))
        else:  # not modelled: its JSON is what it counts (its item is kept verbatim)
            parts.append(Part("other", json_text(c)))
    return parts


def _has_unknown_content(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        not isinstance(c, dict) or c.get("type") not in _KNOWN_CONTENT for c in content)


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "\n".join(str(o.get("text", "")) for o in output if isinstance(o, dict))
    if isinstance(output, dict):
        return str(output.get("output", output.get("text", "")))
    return ""


def _truncated_texts(content: list[Any], max_chars: int) -> list[Any] | None:
    """``content`` with each text item longer than ``max_chars`` truncated (the others,
    images included, as they are); ``None`` when none is."""
    new = [
        {**c, "text": truncated(c["text"], max_chars)}
        if isinstance(c, dict) and isinstance(c.get("text"), str)
        and len(c["text"]) > max_chars else c
        for c in content
    ]
    return new if any(a is not b for a, b in zip(new, content)) else None


class OpenAIResponsesDialect(Dialect):
    """Input items of the OpenAI Responses API (Codex CLI speaks this)."""

    name: ClassVar[str] = "openai_responses"
    messages_key: ClassVar[str] = "input"

    def role(self, message: Any) -> str:
        kind = _item_type(message)
        if kind == "message":
            return str(message.get("role", "user"))
        if kind in _OUTPUTS:
            return "tool"
        if kind in _MODEL_ITEMS or kind == "compaction":
            return "assistant"
        if kind in ("item_reference", "mcp_approval_response"):
            return "user"
        role = message.get("role")  # an item not modelled here, e.g. ``additional_tools``
        return role if role in _ROLES else "assistant"

    def is_opaque(self, message: Any) -> bool:
        """An item type this dialect does not model (``additional_tools``…), or a message
        with a content part type it does not model."""
        if not isinstance(message, dict):
            return False
        kind = _item_type(message)
        return kind not in _KNOWN or (kind == "message" and _has_unknown_content(message))



    def is_model_output(self, message: Any) -> bool:
        return self.role(message) == "assistant"

    def tool_call_ids(self, message: Any) -> tuple[str, ...]:
        if _item_type(message) in _CALLS:
            return (str(message.get("call_id", "")),)
        return ()

    def tool_result_ids(self, message: Any) -> tuple[str, ...]:
        if _item_type(message) in _OUTPUTS:
            return (str(message.get("call_id", "")),)
        return ()

    def parts(self, message: Any) -> list[Part]:
        kind = _item_type(message)
        if kind == "message":
            return _message_parts(message.get("content"))
        if kind == "reasoning":
            summary = message.get("summary") or []
            text = "\n".join(str(s.get("text", "")) for s in summary if isinstance(s, dict))
            return [Part("thinking", text, opaque=True)]
        if kind in _CALLS:
            args = message.get("arguments", message.get("input", message.get("action", "")))
            text = args if isinstance(args, str) else str(args)
            return [Part("tool_call", text, str(message.get("name", kind)),
                         str(message.get("call_id", "")))]
        if kind in _OUTPUTS:
            return [Part("tool_result", _output_text(message.get("output")),
                         ref=str(message.get("call_id", "")))]
        if kind in _KNOWN:  # compaction (encrypted), item_reference…
            return [Part("other", opaque=kind == "compaction")]
        # not modelled (``additional_tools``…): its JSON is what it counts; kept verbatim
        return [Part("other", json_text(message))]

    def truncation_texts(self, message: Any) -> list[str]:
        kind = _item_type(message)
        value = message.get("output") if kind in _OUTPUTS else (
            message.get("content") if kind == "message" else None)
        if isinstance(value, str):
            return [value] if kind in _OUTPUTS else []
        if isinstance(value, list):
            return [c["text"] for c in value
                    if isinstance(c, dict) and isinstance(c.get("text"), str)]
        return []

    def messages_of(self, body: dict[str, Any]) -> list[Any]:
        value = body.get("input")
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        messages = super().messages_of(body)
        check_objects(self.name, messages)
        return messages

    def text_message(self, text: str, role: str = "user") -> Any:
        kind = "output_text" if role == "assistant" else "input_text"
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    def truncate(self, message: Any, max_chars: int) -> Any:
        kind = _item_type(message)
        if kind in _OUTPUTS and isinstance(message.get("output"), str):
            out = message["output"]
            if len(out) > max_chars:
                return {**message, "output": truncated(out, max_chars)}
            return message
        if kind in _OUTPUTS and isinstance(message.get("output"), list):
            # an output as content items (Codex CLI 0.171 sends its ``exec`` tool's so)
            new = _truncated_texts(message["output"], max_chars)
            return message if new is None else {**message, "output": new}
        if kind == "message" and isinstance(message.get("content"), list):
            new = _truncated_texts(message["content"], max_chars)
            if new is not None:
                return {**message, "content": new}
        return message
