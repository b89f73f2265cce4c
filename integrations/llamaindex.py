"""LlamaIndex integration: a ``ChatMessage`` dialect, a compacting LLM wrapper and a
compacting memory for ``FunctionAgent`` / ``ReActAgent`` / ``AgentWorkflow``, and an
instrumentation handler that logs model calls.

Install with ``pip install agentcompact[llamaindex]``::

    memory = CompactingMemory(budget=Budget(trigger_tokens=60000), episode_id="run-1")
    agent = FunctionAgent(tools=tools, llm=memory.wrap(llm), system_prompt=prompt)
    with memory.logger:                      # log every LLM call (optional)
        await agent.run("fix the bug", memory=memory)

:class:`CompactingLLM` (``memory.wrap(llm)``, or ``CompactingLLM(llm, budget=Budget(...))``)
compacts what every LLM call of the agent receives - the system prompt, the memory, the
current run's tool loop (which the agents keep in their own scratchpad, outside the
memory) and the tool schemas all count toward the budget. The memory keeps the full
history (``get_all()``); wrapped, its ``get()`` returns it whole, the LLM compacting.

:class:`CompactingMemory` alone (no wrapped LLM) compacts in ``get()`` / ``aget()``: only
the history up to the start of the current run, without the system prompt or the tools -
a single run with a long tool loop is not bounded (one 40-step run with a 15k-token system
prompt sent 1.76x a 20k trigger that way; wrapped, 0.99x: see
benchmarks/integration_llamaindex_scope.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from types import TracebackType
from typing import Any, ClassVar

import orjson
import pluggy
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LLMMetadata,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.instrumentation import (  # type: ignore[attr-defined]  # re-exported
    get_dispatcher,  # without __all__; its documented import path
)
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMChatInProgressEvent
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.memory import BaseMemory
from pydantic import ConfigDict, PrivateAttr

from agentcompact import (
    Budget,
    CompactionResult,
    Dialect,
    Engine,
    ModelCall,
    Part,
    hookimpl,
    log_model_call,
)
from agentcompact.dialects import head_tail
from agentcompact.extending import new_id
from agentcompact.wire import from_chat_chunks, from_chat_completion

from ..errors import ConfigError, DialectError, ValidationError
from ._options import check_engine, engine_from_options

__all__ = [
    "CompactingLLM",
    "CompactingMemory",
    "LlamaIndexDialect",
    "ModelCallLogger",
    "agentcompact_register_dialects",
    "to_openai_chat",
]

_ROLES = {"chatbot": "assistant", "model": "assistant", "function": "tool"}
_MEDIA = frozenset({"image", "audio", "video", "document"})


def _call_fields(call: Any) -> tuple[str, str, str]:
    """(id, name, arguments JSON) of an OpenAI-style tool call, dict or SDK object."""
    if isinstance(call, dict):
        fn = call.get("function") or {}
        return str(call.get("id") or ""), str(fn.get("name") or ""), str(fn.get("arguments") or "")
    fn = getattr(call, "function", None)
    return (str(getattr(call, "id", "") or ""), str(getattr(fn, "name", "") or ""),
            str(getattr(fn, "arguments", "") or ""))


def _tool_calls(message: Any) -> list[tuple[str, str, str]]:
    blocks = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    if blocks:
        return [(str(b.tool_call_id or ""), b.tool_name,
                 b.tool_kwargs if isinstance(b.tool_kwargs, str)
                 else json.dumps(b.tool_kwargs, separators=(",", ":"))) for b in blocks]
    return [_call_fields(c) for c in message.additional_kwargs.get("tool_calls") or ()]


def _block_key(block: Any) -> Any:
    kind = getattr(block, "block_type", type(block).__name__)
    if isinstance(block, TextBlock):
        return [kind, block.text]
    if isinstance(block, ThinkingBlock):
        return [kind, block.content]
    if isinstance(block, ToolCallBlock):
        return [kind, block.tool_call_id, block.tool_name, block.tool_kwargs]
    ref = getattr(block, "url", None) or getattr(block, "path", None)
    return [kind, str(ref) if ref else repr(block)[:4096]]


class LlamaIndexDialect(Dialect):
    """LlamaIndex ``ChatMessage`` objects: role, ``blocks``, tool calls as ``ToolCallBlock``
    blocks or ``additional_kwargs["tool_calls"]``, tool results as ``tool`` messages with
    ``additional_kwargs["tool_call_id"]``. Messages are never mutated."""

    name: ClassVar[str] = "llama_index"

    def role(self, message: Any) -> str:
        role = getattr(message.role, "value", message.role)
        return _ROLES.get(str(role), str(role))

    def tool_call_ids(self, message: Any) -> tuple[str, ...]:
        if self.role(message) != "assistant":
            return ()
        return tuple(dict.fromkeys(ref for ref, _, _ in _tool_calls(message)))

    def tool_result_ids(self, message: Any) -> tuple[str, ...]:
        if self.role(message) != "tool":
            return ()
        return (str(message.additional_kwargs.get("tool_call_id", "")),)

    def parts(self, message: Any) -> list[Part]:
        parts: list[Part] = []
        for block in message.blocks:
            if isinstance(block, TextBlock):
                parts.append(Part("text", block.text))
            elif isinstance(block, ThinkingBlock):
                info = block.additional_information or {}
                parts.append(Part("thinking", block.content or "",
                                  opaque=bool(info.get("signature"))))
            elif getattr(block, "block_type", "") in _MEDIA:
                parts.append(Part("image"))
            elif not isinstance(block, ToolCallBlock):
                parts.append(Part("other"))
        if self.role(message) == "tool":
            text = "\n".join(p.text for p in parts if p.text)
            ref = str(message.additional_kwargs.get("tool_call_id", ""))
            return [Part("tool_result", text, ref=ref)]
        for ref, name, args in _tool_calls(message):
            parts.append(Part("tool_call", args, name, ref))
        return parts

    def digest(self, message: Any) -> str:
        data = [self.role(message), [_block_key(b) for b in message.blocks],
                _tool_calls(message), message.additional_kwargs.get("tool_call_id")]
        raw = orjson.dumps(data, default=str)
        return hashlib.blake2b(raw, digest_size=16).hexdigest()

    def text_message(self, text: str, role: str = "user") -> Any:
        return ChatMessage(role=role, blocks=[TextBlock(text=text)])

    def truncate(self, message: Any, max_chars: int) -> Any:
        blocks = [TextBlock(text=head_tail(b.text, max_chars))
                  if isinstance(b, TextBlock) and len(b.text) > max_chars else b
                  for b in message.blocks]
        if all(a is b for a, b in zip(blocks, message.blocks, strict=True)):
            return message
        return message.model_copy(update={"blocks": blocks})

    def check_shape(self, message: Any, index: int) -> None:
        if not isinstance(message, ChatMessage):
            raise ValidationError(
                f"llama_index: message {index} is {type(message).__name__}, not a ChatMessage",
                index)


_DIALECT = LlamaIndexDialect()


@hookimpl
def agentcompact_register_dialects(register: Callable[..., None]) -> None:
    """Register the ``llama_index`` dialect.

    ``pm.register(agentcompact.integrations.llamaindex)`` makes it available by name.
    """
    register(_DIALECT)


def to_openai_chat(message: ChatMessage) -> dict[str, Any]:
    """An OpenAI chat dict for a ``ChatMessage`` (for logging and export)."""
    role = _DIALECT.role(message)
    text = "\n".join(b.text for b in message.blocks if isinstance(b, TextBlock))
    if role == "tool":
        return {"role": "tool", "tool_call_id": str(message.additional_kwargs.get(
            "tool_call_id", "")), "content": text}
    out: dict[str, Any] = {"role": role, "content": text}
    thinking = "".join(b.content or "" for b in message.blocks if isinstance(b, ThinkingBlock))
    if thinking:
        out["reasoning_content"] = thinking
    calls = _tool_calls(message) if role == "assistant" else []
    if calls:
        out["content"] = text or None
        out["tool_calls"] = [{"id": ref, "type": "function",
                              "function": {"name": name, "arguments": args}}
                             for ref, name, args in calls]
    return out


# ------------------------------------------------------------------------- the memory


def _make_engine(engine: Engine | None, plugins: pluggy.PluginManager | None,
                 episode_id: str | None, kwargs: dict[str, Any], owner: str) -> Engine:
    if engine is not None:
        return check_engine(engine, LlamaIndexDialect, owner, kwargs)
    return engine_from_options(_DIALECT, kwargs, plugins=plugins, episode_id=episode_id,
                               owner=owner)


def _check_message(message: Any, index: int, owner: str) -> None:
    if not isinstance(message, ChatMessage):
        raise DialectError(f"{owner}: message {index} is {type(message).__name__}, not a "
                           "LlamaIndex ChatMessage")


def _checked(messages: Any, owner: str, start: int = 0) -> list[ChatMessage]:
    if not isinstance(messages, (list, tuple)):
        raise DialectError(f"{owner}: messages is {type(messages).__name__}, not a list")
    for i, message in enumerate(messages):
        _check_message(message, start + i, owner)
    return list(messages)


def _options(engine_kwargs: dict[str, Any], **named: Any) -> dict[str, Any]:
    for key, value in named.items():
        if value is not None:
            engine_kwargs[key] = value
    return engine_kwargs


# ------------------------------------------------------------------------- the LLM


class CompactingLLM(FunctionCallingLLM):
    """An LLM whose every chat call sends the compacted context (see the module docstring).

    ``chat`` / ``achat`` / ``stream_chat`` / ``astream_chat`` - and so
    ``(a)chat_with_tools`` / ``(a)stream_chat_with_tools``, which the agents call - compact
    the messages, with the tool schemas of the call counted toward the budget; the wrapped
    LLM does the rest (its own instrumentation events see the messages sent). Completion
    calls (a single prompt) pass through.

    :param llm: the LLM to wrap (any LlamaIndex LLM; tool calls need a function-calling one).
    :param engine: an :class:`~agentcompact.Engine` with a :class:`LlamaIndexDialect`, or
        ``budget=Budget(trigger_tokens=...)`` and other ``Engine`` options.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: Any
    _engine: Engine = PrivateAttr()
    _last: CompactionResult | None = PrivateAttr(default=None)

    def __init__(self, llm: Any, engine: Engine | None = None, *,
                 budget: Budget | None = None, episode_id: str | None = None,
                 plugins: pluggy.PluginManager | None = None, **engine_kwargs: Any) -> None:
        if not callable(getattr(llm, "achat", None)) or not hasattr(llm, "metadata"):
            raise ConfigError(f"CompactingLLM: llm must be a LlamaIndex LLM, got "
                              f"{type(llm).__name__}")
        super().__init__(llm=llm)
        options = _options(engine_kwargs, budget=budget)
        self._engine = _make_engine(engine, plugins, episode_id, options, "CompactingLLM")

    @classmethod
    def class_name(cls) -> str:
        return "CompactingLLM"

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def last_result(self) -> CompactionResult | None:
        """The compaction result of the latest chat call."""
        return self._last

    @property
    def metadata(self) -> LLMMetadata:
        return self.llm.metadata  # type: ignore[no-any-return]

    def _fixed(self, kwargs: dict[str, Any]) -> int:
        tools = kwargs.get("tools")
        return self._engine.fixed_tokens({"tools": tools}) if tools else 0

    def _compact(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
                 ) -> list[ChatMessage]:
        result = self._engine.compact(_checked(messages, "CompactingLLM"),
                                      fixed_tokens=self._fixed(kwargs))
        self._last = result
        return list(result.messages)

    async def _acompact(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
                        ) -> list[ChatMessage]:
        result = await self._engine.acompact(_checked(messages, "CompactingLLM"),
                                             fixed_tokens=self._fixed(kwargs))
        self._last = result
        return list(result.messages)

    # chat: compacted
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self.llm.chat(self._compact(messages, kwargs), **kwargs)  # type: ignore[no-any-return]

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self.llm.achat(await self._acompact(messages, kwargs), **kwargs)  # type: ignore[no-any-return]

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any
                    ) -> Generator[ChatResponse, None, None]:
        return self.llm.stream_chat(self._compact(messages, kwargs), **kwargs)  # type: ignore[no-any-return]

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any
                           ) -> AsyncGenerator[ChatResponse, None]:
        return await self.llm.astream_chat(await self._acompact(messages, kwargs), **kwargs)  # type: ignore[no-any-return]

    # completion: one prompt, passed through
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                 ) -> CompletionResponse:
        return self.llm.complete(prompt, formatted=formatted, **kwargs)  # type: ignore[no-any-return]

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> CompletionResponse:
        return await self.llm.acomplete(prompt, formatted=formatted, **kwargs)  # type: ignore[no-any-return]

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> Generator[CompletionResponse, None, None]:
        return self.llm.stream_complete(prompt, formatted=formatted, **kwargs)  # type: ignore[no-any-return]

    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                               ) -> AsyncGenerator[CompletionResponse, None]:
        return await self.llm.astream_complete(prompt, formatted=formatted, **kwargs)  # type: ignore[no-any-return]

    # tools: the wrapped LLM's own formats
    def _prepare_chat_with_tools(self, tools: Sequence[Any], user_msg: Any = None,
                                 chat_history: list[ChatMessage] | None = None,
                                 verbose: bool = False, allow_parallel_tool_calls: bool = False,
                                 tool_required: bool = False, **kwargs: Any) -> dict[str, Any]:
        # the wrapped LLM's compat shim drops tool_required for integrations without it
        prepare = getattr(self.llm, "_prepare_chat_with_tools_compat", None)
        if prepare is None:
            prepare = self.llm._prepare_chat_with_tools
            kwargs = {**kwargs, "tool_required": tool_required} if tool_required else kwargs
        else:
            kwargs = {**kwargs, "tool_required": tool_required}
        return prepare(  # type: ignore[no-any-return]
            tools, user_msg=user_msg, chat_history=chat_history, verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls, **kwargs)

    def _validate_chat_with_tools_response(self, response: ChatResponse, tools: Sequence[Any],
                                           allow_parallel_tool_calls: bool = False,
                                           **kwargs: Any) -> ChatResponse:
        return self.llm._validate_chat_with_tools_response(  # type: ignore[no-any-return]
            response, tools, allow_parallel_tool_calls=allow_parallel_tool_calls, **kwargs)

    def get_tool_calls_from_response(self, response: ChatResponse,
                                     error_on_no_tool_call: bool = True, **kwargs: Any
                                     ) -> list[Any]:
        return self.llm.get_tool_calls_from_response(  # type: ignore[no-any-return]
            response, error_on_no_tool_call=error_on_no_tool_call, **kwargs)


# ------------------------------------------------------------------------- the memory


class CompactingMemory(BaseMemory):
    """Agent memory that keeps the full history and hands the model a compacted view.

    :param engine: an :class:`~agentcompact.Engine` with a :class:`LlamaIndexDialect`, or
        ``budget=Budget(trigger_tokens=...)`` (and any other ``Engine``
        option), checked here.
    :param episode_id: / :param group_id: stamped on compaction events and on the model
        calls :attr:`logger` records.

    :meth:`wrap` moves the compaction into the agent's LLM (every call bounded); ``put`` and
    the other writers check each message is a ``ChatMessage`` (a ``DialectError`` names
    the index in the history and the type).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    history: list[ChatMessage] = []
    _engine: Engine = PrivateAttr()
    _episode_id: str = PrivateAttr()
    _group_id: str | None = PrivateAttr(default=None)
    _last: CompactionResult | None = PrivateAttr(default=None)
    _logger: ModelCallLogger | None = PrivateAttr(default=None)
    _wrapped: bool = PrivateAttr(default=False)

    def __init__(self, engine: Engine | None = None, *, budget: Budget | None = None,
                 episode_id: str | None = None, group_id: str | None = None,
                 plugins: pluggy.PluginManager | None = None,
                 history: Sequence[ChatMessage] = (), **engine_kwargs: Any) -> None:
        super().__init__(history=_checked(history, "CompactingMemory"))
        options = _options(engine_kwargs, budget=budget)
        self._engine = _make_engine(engine, plugins, episode_id, options, "CompactingMemory")
        self._episode_id = episode_id or self._engine.episode_id or new_id()
        self._group_id = group_id

    @classmethod
    def class_name(cls) -> str:
        return "CompactingMemory"

    @classmethod
    def from_defaults(cls, **kwargs: Any) -> CompactingMemory:
        """``CompactingMemory(**kwargs)`` (LlamaIndex's constructor convention)."""
        return cls(**kwargs)

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def last_result(self) -> CompactionResult | None:
        """The compaction result of the latest ``get`` / ``aget`` (``None`` once wrapped:
        see the wrapped LLM's ``last_result``)."""
        return self._last

    def wrap(self, llm: Any) -> CompactingLLM:
        """``llm`` compacting every call with this memory's engine; from now on ``get()``
        returns the full history (the LLM compacts what it receives, once)."""
        self._wrapped = True
        return CompactingLLM(llm, self._engine)

    @property
    def logger(self) -> ModelCallLogger:
        """A :class:`ModelCallLogger` with this memory's episode, group and plugins."""
        if self._logger is None:
            self._logger = ModelCallLogger(episode_id=self._episode_id, group_id=self._group_id,
                                           plugins=self._engine.pm)
        return self._logger

    # reading: the compacted view, or everything
    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:  # noqa: A002
        if self._wrapped:
            return list(self.history)
        self._last = self._engine.compact(self.history)
        return list(self._last.messages)

    async def aget(self, input: str | None = None, **kwargs: Any  # noqa: A002
                   ) -> list[ChatMessage]:
        if self._wrapped:
            return list(self.history)
        self._last = await self._engine.acompact(self.history)
        return list(self._last.messages)

    def get_all(self) -> list[ChatMessage]:
        return list(self.history)

    async def aget_all(self) -> list[ChatMessage]:
        return self.get_all()

    # writing: always the full history (no thread hops: order is kept)
    def put(self, message: ChatMessage) -> None:
        _check_message(message, len(self.history), "CompactingMemory.put")
        self.history = [*self.history, message]

    async def aput(self, message: ChatMessage) -> None:
        self.put(message)

    def put_messages(self, messages: list[ChatMessage]) -> None:
        added = _checked(messages, "CompactingMemory.put_messages", len(self.history))
        self.history = [*self.history, *added]

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        self.put_messages(messages)

    def set(self, messages: list[ChatMessage]) -> None:
        self.history = _checked(messages, "CompactingMemory.set")

    async def aset(self, messages: list[ChatMessage]) -> None:
        self.set(messages)

    def reset(self) -> None:
        self.history = []

    async def areset(self) -> None:
        self.reset()


# ------------------------------------------------------------------------- RL logging


def _usage(response: ChatResponse) -> dict[str, Any]:
    counts = {k: response.additional_kwargs[k]
              for k in ("prompt_tokens", "completion_tokens", "total_tokens")
              if isinstance(response.additional_kwargs.get(k), int)}
    if counts:
        return counts
    usage = getattr(response.raw, "usage", None) or (
        response.raw.get("usage") if isinstance(response.raw, dict) else None)
    dump = getattr(usage, "model_dump", None)
    value = dump() if callable(dump) else usage
    return dict(value) if isinstance(value, dict) else {}


#: streams in progress a ModelCallLogger keeps chunks of (the oldest is forgotten beyond)
_MAX_STREAMS = 256


class ModelCallLogger(BaseEventHandler):
    """A LlamaIndex instrumentation handler firing ``agentcompact_log_model_call`` for each
    chat call (streamed calls when the stream ends).

    Attach it to the root dispatcher for a block (``with logger: ...``) or with
    :meth:`attach` / :meth:`detach`. Messages are logged as OpenAI chat dicts.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    episode_id: str = ""
    group_id: str | None = None
    _pm: pluggy.PluginManager | None = PrivateAttr(default=None)
    #: the raw chunks of each stream in progress, by span (their sampled tokens)
    _chunks: dict[str | None, list[dict[str, Any]]] = PrivateAttr(default_factory=dict)

    def __init__(self, *, episode_id: str | None = None, group_id: str | None = None,
                 plugins: pluggy.PluginManager | None = None) -> None:
        super().__init__(episode_id=episode_id or new_id(), group_id=group_id)
        self._pm = plugins

    @classmethod
    def class_name(cls) -> str:
        return "AgentCompactModelCallLogger"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, LLMChatInProgressEvent):
            chunk = _raw_body(event.response.raw, "chat.completion.chunk")
            if chunk is not None:
                if event.span_id not in self._chunks and len(self._chunks) >= _MAX_STREAMS:
                    self._chunks.pop(next(iter(self._chunks)))  # a stream that never ended
                self._chunks.setdefault(event.span_id, []).append(chunk)
            return
        if not isinstance(event, LLMChatEndEvent) or event.response is None:
            return
        chunks = self._chunks.pop(event.span_id, None)
        response = event.response
        model = getattr(response.raw, "model", None) or (
            response.raw.get("model") if isinstance(response.raw, dict) else None)
        call = ModelCall(
            episode_id=self.episode_id, dialect="openai_chat",
            messages=[to_openai_chat(m) for m in event.messages],
            response=[to_openai_chat(response.message)], usage=_usage(response),
            model=str(model) if model else None, group_id=self.group_id,
            compacted=any(_DIALECT.is_synthetic(m) for m in event.messages),
            **_sampled_fields(response.raw, chunks),
        )
        log_model_call(call, self._pm)

    def attach(self) -> ModelCallLogger:
        """Start logging: add this handler to LlamaIndex's root dispatcher."""
        root = get_dispatcher()
        if not any(h is self for h in root.event_handlers):
            root.add_event_handler(self)
        return self

    def detach(self) -> None:
        """Stop logging."""
        root = get_dispatcher()
        root.event_handlers = [h for h in root.event_handlers if h is not self]

    def __enter__(self) -> ModelCallLogger:
        return self.attach()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.detach()


def _sampled_fields(raw: Any, chunks: list[dict[str, Any]] | None) -> dict[str, Any]:
    """What the server reported of its sampled tokens: from the OpenAI-compatible
    ``chat.completion`` a LlamaIndex OpenAI LLM keeps as ``response.raw`` — ``logprobs``
    (``logprobs=True``) and vLLM's ``prompt_token_ids`` / ``token_ids``
    (``additional_kwargs={"extra_body": {"return_token_ids": True}}``; the SDK keeps
    fields it does not model) — or, for a stream, from the raw chunks its in-progress
    events carried (each event's ``raw`` is one ``chat.completion.chunk``)."""
    if chunks:
        return from_chat_chunks(chunks).model_call_fields()
    body = _raw_body(raw, "chat.completion")
    return {} if body is None else from_chat_completion(body).model_call_fields()


def _raw_body(raw: Any, kind: str) -> dict[str, Any] | None:
    """``raw`` (an OpenAI SDK object or its dict) as a dict when it is a ``kind`` object."""
    body = raw.model_dump() if hasattr(raw, "model_dump") else raw
    return body if isinstance(body, dict) and body.get("object") == kind else None
