"""Anthropic Messages: ``{"role": "user"|"assistant", "content": str | [blocks]}``.

Blocks: ``text``, ``image``, ``document``, ``tool_use``, ``tool_result`` (content a string
or blocks), ``thinking`` (signed), ``redacted_thinking``, server tool blocks. Claude Code
puts ``{"role": "system"}`` messages in the array, mid-conversation too: they are valid
input and instructions (kept verbatim wherever they stand). A message holding a block type
this dialect does not model is opaque: kept whole, counted by the JSON of those blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..errors import ValidationError
from ._base import Dialect, Part, json_text, truncated
from ._objects import check_objects, not_an_object

__all__ = ["AnthropicDialect"]

_OPAQUE = frozenset({"redacted_thinking"})
#: block types this dialect reads; any other makes its message opaque (kept verbatim)
_KNOWN_BLOCKS = frozenset({"text", "image", "document", "tool_use", "server_tool_use",
                           "tool_result", "thinking", "redacted_thinking"})


def _json(value: Any) -> str:
    return json_text(value)  # a deep or surrogate-bearing input never makes rendering raise


def _result_text(content: Any) -> tuple[str, bool]:
    """Text of a tool_result's content, and whether it held an image."""
    if isinstance(content, str):
        return content, False
    texts: list[str] = []
    image = False
    for block in content or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "image":
            image = True
    return "\n".join(texts), image


def _block_part(block: Any) -> Part:
    if not isinstance(block, dict):
        return Part("other", _json(block))
    kind = block.get("type")
    if kind == "text":
        return Part("text", str(block.get("text", "")))
    if kind == "thinking":
        return Part("thinking", str(block.get("thinking", "")), opaque=True)
    if kind in _OPAQUE:
        return Part("thinking", "", opaque=True)
    if kind in ("tool_use", "server_tool_use"):
        return Part("tool_call", _json(block.get("input", {})), str(block.get("name", "")),
                    str(block.get("id", "")))
    if kind == "tool_result":
        text, _ = _result_text(block.get("content", ""))
        return Part("tool_result", text, ref=str(block.get("tool_use_id", "")))
    if kind in ("image", "document"):
        return Part("image")
    # not modelled: its JSON is what it counts (its message is kept verbatim)
    return Part("other", _json(block))


def _truncate_block(block: Any, max_chars: int) -> Any:
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "text":
        text = str(block.get("text", ""))
        return block if len(text) <= max_chars else {**block, "text": truncated(text, max_chars)}
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            if len(content) <= max_chars:
                return block
            return {**block, "content": truncated(content, max_chars)}
        new = [_truncate_block(b, max_chars) for b in content or ()]
        if all(a is b for a, b in zip(new, content or ())):
            return block
        return {**block, "content": new}
    return block


def _block_texts(block: Any) -> list[str]:
    """The texts ``_truncate_block`` may cut in ``block``, one by one."""
    if not isinstance(block, dict):
        return []
    kind = block.get("type")
    if kind == "text":
        return [str(block.get("text", ""))]
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            return [content]
        if isinstance(content, list):
            return [t for b in content for t in _block_texts(b)]
    return []


class AnthropicDialect(Dialect):
    """Messages of the Anthropic Messages API."""

    name: ClassVar[str] = "anthropic"

    def role(self, message: Any) -> str:
        if not isinstance(message, dict):
            raise not_an_object(self.name, message)
        role = message.get("role", "")
        if role == "user" and self._only_results(message):
            return "tool"
        return str(role)

    def is_model_output(self, message: Any) -> bool:
        # role() differs from the "role" field only for user messages ("tool")
        return str(message.get("role", "")) == "assistant"

    @staticmethod
    def _only_results(message: Any) -> bool:
        content = message.get("content")
        if not isinstance(content, list) or not content:
            return False
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                return False
        return True

    def tool_call_ids(self, message: Any) -> tuple[str, ...]:
        content = message.get("content")
        if message.get("role") != "assistant" or not isinstance(content, list):
            return ()
        return tuple(
            str(b.get("id")) for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use"
        )

    def tool_result_ids(self, message: Any) -> tuple[str, ...]:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            return ()
        return tuple(
            str(b.get("tool_use_id")) for b in content
            if isinstance(b, dict) and b.get("type") == "tool_result"
        )

    def is_instruction(self, message: Any) -> bool:
        return isinstance(message, dict) and message.get("role") == "system"

    def is_opaque(self, message: Any) -> bool:
        """A message with a content block type this dialect does not model (or a block
        that is not an object): the engine keeps it verbatim."""
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            return False
        for block in content:
            if not isinstance(block, dict) or block.get("type") not in _KNOWN_BLOCKS:
                return True
        return False

    def messages_of(self, body: dict[str, Any]) -> list[Any]:
        messages = super().messages_of(body)
        check_objects(self.name, messages)
        return messages

    def parts(self, message: Any) -> list[Part]:
        content = message.get("content", "")
        if isinstance(content, str):
            return [Part("text", content)]
        if not isinstance(content, list):
            return []
        return [_block_part(b) for b in content]

    def counted_text(self, message: Any) -> tuple[str, int]:
        # the texts ``parts`` would give, without building them (the meter's hot path)
        content = message.get("content", "")
        if isinstance(content, str):
            return content, 0
        if not isinstance(content, list):
            return "", 0
        texts: list[str] = []
        images = 0
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text = str(block.get("text", ""))
            elif kind == "tool_result":
                text = _result_text(block.get("content", ""))[0]
            elif kind in ("tool_use", "server_tool_use"):
                text = _json(block.get("input", {}))
            elif kind == "thinking":
                text = str(block.get("thinking", ""))
            elif kind in ("image", "document"):
                images += 1
                continue
            elif kind in _OPAQUE:
                continue
            else:  # not modelled: counted by its JSON (what the provider tokenizes)
                text = _json(block)
            if text:
                texts.append(text)
        return "\n".join(texts), images

    def text_message(self, text: str, role: str = "user") -> Any:
        return {"role": role, "content": [{"type": "text", "text": text}]}

    def truncate(self, message: Any, max_chars: int) -> Any:
        content = message.get("content", "")
        if isinstance(content, str):
            if len(content) <= max_chars:
                return message
            return {**message, "content": truncated(content, max_chars)}
        if not isinstance(content, list):
            return message
        new = [_truncate_block(b, max_chars) for b in content]
        if all(a is b for a, b in zip(new, content)):
            return message
        return {**message, "content": new}

    def truncation_texts(self, message: Any) -> list[str]:
        content = message.get("content", "")
        if isinstance(content, str):
            return [content]
        out: list[str] = []
        for block in content if isinstance(content, list) else ():
            out += _block_texts(block)
        return out

    def check_shape(self, message: Any, index: int) -> None:
        super().check_shape(message, index)
        if message.get("role") not in ("user", "assistant", "system"):
            raise ValidationError(
                f"anthropic: message {index} has role {message.get('role')!r}; "
                "expected 'user' or 'assistant'",
                index,
            )

    def check_order(self, messages: Sequence[Any]) -> None:
        # ``system`` messages may stand anywhere (Claude Code sends them mid-conversation);
        # the first other message must be the user's
        for i, message in enumerate(messages):
            role = message.get("role")
            if role == "system":
                continue
            if role != "user":
                raise ValidationError(
                    f"anthropic: the first message must be a user message, got {role!r} at {i}",
                    i,
                )
            return

    # --- the thinking-loop rule (kept by the engine, see Dialect.thinking_loops) -----
    def thinking_loops(self) -> bool:
        return True
