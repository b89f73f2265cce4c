"""PydanticAI integration: a capability (and history processor) that compacts what each model
request of an ``Agent`` run receives.

Install with ``pip install agentcompact[pydantic-ai]``. One line::

    agent = Agent(model, tools=[...], capabilities=[Compaction(budget=Budget(60000))])

Every model request of the run (each step of the tool loop, streamed or not) is sent with
its messages compacted (``wrap_model_request``); the run's own history
(``result.all_messages()``) keeps every message. The budget counts the messages, the
instructions and system prompt, and the tool schemas of that request (function and output
tools) — real tokens, not message counts. Tool calls and their returns are kept whole, and
between compactions the compacted prefix is the same objects from request to request, so
the provider's prompt cache keeps hitting. The same object is a history processor too
(``Agent(capabilities=[ProcessHistory(compaction)])``): PydanticAI then writes the
compacted list back into the run's history, and the tool schemas are not counted (a history
processor sees the messages only), so prefer the capability.

Messages are PydanticAI's own ``ModelRequest`` / ``ModelResponse`` objects, read through
:class:`PydanticAIDialect` and never converted or mutated (truncation makes copies).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any, ClassVar

import orjson
import pluggy
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import RunContext, ToolDefinition

from agentcompact import CompactionResult, DialectError, Engine, ValidationError, hookimpl
from agentcompact.dialects import Dialect, Part, truncated

from ._hosts import Conversations, conversation_key
from ._requests import json_safe

__all__ = ["Compaction", "PydanticAIDialect", "agentcompact_register_dialects"]

#: the timestamp of the messages agentcompact writes: fixed, so that a compaction is the
#: same bytes wherever it is computed (the provider never receives it)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MEDIA = ("ImageUrl", "BinaryImage", "BinaryContent", "AudioUrl", "VideoUrl", "DocumentUrl",
          "BinaryAudio", "UploadedFile")


def _user_parts(content: Any) -> list[Part]:
    if isinstance(content, str):
        return [Part("text", content)]
    parts: list[Part] = []
    for item in content:
        if isinstance(item, str):
            parts.append(Part("text", item))
        elif type(item).__name__ in _MEDIA:
            parts.append(Part("image"))
        else:
            parts.append(Part("other"))
    return parts


def _part(part: Any) -> list[Part]:
    if isinstance(part, (SystemPromptPart, TextPart)):
        return [Part("text", part.content)]
    if isinstance(part, UserPromptPart):
        return _user_parts(part.content)
    if isinstance(part, ToolReturnPart):
        return [Part("tool_result", part.model_response_str(), part.tool_name, part.tool_call_id)]
    if isinstance(part, RetryPromptPart):
        text = part.model_response()
        if part.tool_name is None:
            return [Part("text", text)]
        return [Part("tool_result", text, part.tool_name, part.tool_call_id)]
    if isinstance(part, ThinkingPart):
        return [Part("thinking", part.content, opaque=bool(part.signature))]
    if isinstance(part, ToolCallPart):
        return [Part("tool_call", part.args_as_json_str(), part.tool_name, part.tool_call_id)]
    return [Part("other")]  # a native tool's call or return, a file, a provider compaction…


_MODELLED = (SystemPromptPart, TextPart, UserPromptPart, ToolReturnPart, RetryPromptPart,
             ThinkingPart, ToolCallPart)


def _digest_data(part: Any) -> Any:
    """What a part says, without its timestamps and provider ids."""
    fields = {f.name: getattr(part, f.name) for f in dataclasses.fields(part)
              if f.name not in ("timestamp", "id", "provider_details", "metadata")}
    return json_safe(fields)


class PydanticAIDialect(Dialect):
    """PydanticAI's ``ModelRequest`` / ``ModelResponse`` messages.

    A request is a ``user`` message (``system`` when it holds only system prompts): its
    ``ToolReturnPart`` and tool ``RetryPromptPart`` answer the calls of the response before
    it, as Anthropic's tool results do. A response is the ``assistant``'s: its
    ``ToolCallPart`` are the calls. A request holding a system prompt is an instruction
    (kept verbatim); a message with a part this dialect does not model (native tools, files,
    provider compactions) is opaque, kept verbatim too. Digests leave out timestamps and
    provider ids.
    """

    name: ClassVar[str] = "pydantic_ai"

    def role(self, message: Any) -> str:
        if isinstance(message, ModelResponse):
            return "assistant"
        if isinstance(message, ModelRequest):
            if message.parts and all(isinstance(p, SystemPromptPart) for p in message.parts):
                return "system"
            return "user"
        raise DialectError(f"pydantic_ai: a message is {type(message).__name__}, not a "
                           "ModelRequest or ModelResponse")

    def tool_call_ids(self, message: Any) -> tuple[str, ...]:
        if not isinstance(message, ModelResponse):
            return ()
        return tuple(p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart))

    def tool_result_ids(self, message: Any) -> tuple[str, ...]:
        if not isinstance(message, ModelRequest):
            return ()
        return tuple(p.tool_call_id for p in message.parts
                     if isinstance(p, ToolReturnPart)
                     or (isinstance(p, RetryPromptPart) and p.tool_name is not None))

    def parts(self, message: Any) -> list[Part]:
        self.role(message)
        return [piece for part in message.parts for piece in _part(part)]

    def is_instruction(self, message: Any) -> bool:
        return isinstance(message, ModelRequest) and any(
            isinstance(p, SystemPromptPart) for p in message.parts)

    def is_opaque(self, message: Any) -> bool:
        parts = getattr(message, "parts", ())
        return any(not isinstance(p, _MODELLED) for p in parts) or any(
            isinstance(p, UserPromptPart) and not isinstance(p.content, str)
            and any(x.kind == "other" for x in _user_parts(p.content)) for p in parts)

    def digest(self, message: Any) -> str:
        data = [getattr(message, "kind", type(message).__name__),
                getattr(message, "instructions", None),
                [_digest_data(p) for p in getattr(message, "parts", ())]]
        raw = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
        return hashlib.blake2b(raw, digest_size=16).hexdigest()

    def text_message(self, text: str, role: str = "user") -> Any:
        if role == "assistant":
            return ModelResponse(parts=[TextPart(content=text)], timestamp=_EPOCH)
        if role == "system":
            return ModelRequest(parts=[SystemPromptPart(content=text, timestamp=_EPOCH)],
                                timestamp=_EPOCH)
        return ModelRequest(parts=[UserPromptPart(content=text, timestamp=_EPOCH)],
                            timestamp=_EPOCH)

    def truncate(self, message: Any, max_chars: int) -> Any:
        new = [_truncated_part(p, max_chars) for p in message.parts]
        if all(a is b for a, b in zip(new, message.parts)):
            return message
        return dataclasses.replace(message, parts=new)

    def check_shape(self, message: Any, index: int) -> None:
        if not isinstance(message, (ModelRequest, ModelResponse)):
            raise ValidationError(f"pydantic_ai: message {index} is {type(message).__name__}, "
                                  "not a ModelRequest or ModelResponse", index)


def _truncated_part(part: Any, max_chars: int) -> Any:
    if isinstance(part, (TextPart, UserPromptPart)) and isinstance(part.content, str):
        cut = truncated(part.content, max_chars)
        return part if cut is part.content else dataclasses.replace(part, content=cut)
    if isinstance(part, ToolReturnPart) and isinstance(part.content, str):
        cut = truncated(part.content, max_chars)
        return part if cut is part.content else dataclasses.replace(part, content=cut)
    return part  # structured or multimodal content is kept whole


_DIALECT = PydanticAIDialect()


@hookimpl
def agentcompact_register_dialects(register: Callable[..., None]) -> None:
    """Register the ``pydantic_ai`` dialect
    (``pm.register(agentcompact.integrations.pydantic_ai)``)."""
    register(_DIALECT)


# ---------------------------------------------------------------------- the capability


def _tool_schema(tool: ToolDefinition) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": tool.name, "description": tool.description or "",
        "parameters": tool.parameters_json_schema, **({"strict": tool.strict}
                                                      if tool.strict is not None else {})}}


class Compaction(AbstractCapability[Any]):
    """Compacts the messages of each model request (see the module docstring).

    :param engine: an :class:`~agentcompact.Engine` with a :class:`PydanticAIDialect`, whose
        settings each conversation's engine copies; or leave it out and give
        ``budget=Budget(trigger_tokens=...)`` (and any other ``Engine``
        option), checked here.
    :param max_conversations: conversations whose engine is kept (LRU): a conversation is
        the digest of its first request, so a run continuing an earlier run's
        ``message_history`` finds its engine and stored prefix again.
    """

    def __init__(self, engine: Engine | None = None, *, max_conversations: int = 256,
                 plugins: pluggy.PluginManager | None = None, **engine_kwargs: Any) -> None:
        self.id = None
        if engine is not None and not isinstance(engine.dialect, PydanticAIDialect):
            from agentcompact import ConfigError

            raise ConfigError(f"Compaction: engine dialect is {engine.dialect.name!r}; it must "
                              "be a PydanticAIDialect")
        self.conversations = Conversations(_DIALECT, engine_kwargs, engine=engine,
                                           plugins=plugins, owner="Compaction",
                                           max_conversations=max_conversations)
        self.last_result: CompactionResult | None = None
        self._tools: tuple[tuple[Any, ...], list[Any]] | None = None

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built from Python, not from an agent spec

    def _schemas(self, tools: list[ToolDefinition]) -> list[Any]:
        last = self._tools
        if last is not None and last[0] == tuple(map(id, tools)):
            return last[1]
        schemas = [_tool_schema(t) for t in tools]
        self._tools = (tuple(map(id, tools)), schemas)
        return schemas

    async def compact(self, messages: list[ModelMessage], *, instructions: str | None = None,
                      tools: list[ToolDefinition] | None = None) -> list[ModelMessage]:
        """``messages`` compacted, counting ``instructions`` and ``tools`` too."""
        body: dict[str, Any] = {}
        if instructions:
            body["system"] = instructions
        if tools:
            body["tools"] = self._schemas(tools)
        engine = self.conversations.get(conversation_key(_DIALECT, messages))
        result = await engine.acompact(messages, fixed_tokens=engine.fixed_tokens(body))
        self.last_result = result
        return list(result.messages) if result.modified else messages

    async def wrap_model_request(self, ctx: RunContext[Any], *,
                                 request_context: ModelRequestContext,
                                 handler: Callable[[ModelRequestContext], Awaitable[ModelResponse]]
                                 ) -> ModelResponse:
        """Sends the request with its messages compacted; the run's history is untouched
        (the compacted list goes into a copy of the request context)."""
        params = request_context.model_request_parameters
        parts = params.instruction_parts
        messages = request_context.messages
        if parts:
            instructions: str | None = "\n\n".join(p.content for p in parts)
        else:
            last = messages[-1] if messages else None
            instructions = last.instructions if isinstance(last, ModelRequest) else None
        tools = [*params.function_tools, *params.output_tools]
        sent = copy.copy(request_context)
        sent.messages = await self.compact(messages, instructions=instructions, tools=tools)
        return await handler(sent)

    async def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The history-processor form (messages only; see the module docstring)."""
        last = messages[-1] if messages else None
        instructions = last.instructions if isinstance(last, ModelRequest) else None
        return await self.compact(messages, instructions=instructions)
