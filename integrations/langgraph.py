"""LangGraph and LangChain integration: a message dialect, a graph node, a pre-model hook,
an agent middleware, and a callback handler that logs every model call for RL export.

Install with ``pip install agentcompact[langgraph]``. The ways in, one engine each:

- :class:`CompactionMiddleware` — an ``AgentMiddleware`` for ``langchain.agents.create_agent``
  (the recommended path: LangGraph 1.x deprecates ``create_react_agent``): the model request
  is compacted in ``wrap_model_call``, every model call of the agent; state is left
  untouched; each model call is logged.
- :meth:`CompactionNode.wrap` — a model for your own ``StateGraph`` that compacts its input
  on every call (``llm = node.wrap(ChatOpenAI(...).bind_tools(tools))``): no edge can reach
  the model without compaction.
- :class:`CompactionNode` — a ``StateGraph`` node (sync and async). It reads
  ``state["messages"]`` and returns ``{"llm_input_messages": compacted}`` so the graph state
  keeps the full history and only the model sees the compacted view; with
  ``mode="rewrite"`` it rewrites the state itself
  (``[RemoveMessage(id=REMOVE_ALL_MESSAGES), *compacted]``) when a compaction applies. Every
  edge into the model must pass through it: a node that finds the model was called more
  than once since its last pass raises :class:`~agentcompact.errors.ConfigError` (a stale
  ``llm_input_messages``).
- :func:`pre_model_hook` — the same node for ``langgraph.prebuilt.create_react_agent``.
- :class:`ModelCallLogger` — a LangChain callback handler that fires
  ``agentcompact_log_model_call`` for every chat-model call it sees (pass it in
  ``config={"callbacks": [...]}``). Use it with the node or hook; the middleware logs by itself.

The budget counts what the model receives: the messages, the system prompt and the tool
schemas (the engine's ``fixed_tokens``). The middleware and :meth:`CompactionNode.wrap` see
them in the request / the model's bound tools; the node and hook are told them
(``system_prompt=``, ``tools=``), since the prompt and tools of ``create_react_agent`` are
added after the hook runs.

Logged contexts are LangChain messages converted to OpenAI chat dicts
(``langchain_core.messages.convert_to_openai_messages``), dialect ``openai_chat``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal
from uuid import UUID

import orjson
import pluggy
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph.message import REMOVE_ALL_MESSAGES

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
from agentcompact.extending import FixedTokens, new_id
from agentcompact.wire import from_chat_completion

from ..errors import ConfigError, DialectError, ValidationError
from ._options import check_engine, engine_from_options
from ._requests import MessageCopies, json_safe

__all__ = [
    "CompactionMiddleware",
    "CompactionNode",
    "LangChainDialect",
    "ModelCallLogger",
    "agentcompact_register_dialects",
    "model_call_from_langchain",
    "pre_model_hook",
]

Mode = Literal["llm_input", "rewrite"]

_ROLE_BY_TYPE = {
    "ai": "assistant", "AIMessageChunk": "assistant",
    "human": "user", "HumanMessageChunk": "user",
    "system": "system", "SystemMessageChunk": "system",
    "tool": "tool", "ToolMessageChunk": "tool",
    "function": "tool", "FunctionMessageChunk": "tool",
}
_CHAT_ROLES = {"human": "user", "ai": "assistant", "model": "assistant"}
_IMAGE_BLOCKS = frozenset({"image_url", "image", "file", "audio", "input_audio", "video"})
_CALL_BLOCKS = frozenset({"tool_use", "tool_call", "function_call", "server_tool_use"})
_VOLATILE = frozenset({"cache_control", "id"})


# --------------------------------------------------------------------------- the dialect


def _block_part(block: Any) -> Part | None:
    if isinstance(block, str):
        return Part("text", block)
    if not isinstance(block, Mapping):
        return Part("other")
    kind = block.get("type")
    if kind == "text":
        return Part("text", str(block.get("text", "")))
    if kind == "thinking":
        return Part("thinking", str(block.get("thinking", "")), opaque=bool(block.get("signature")))
    if kind == "redacted_thinking":
        return Part("thinking", "", opaque=True)
    if kind == "reasoning":
        text = block.get("reasoning")
        if not isinstance(text, str):
            summary = block.get("summary") or ()
            text = "\n".join(str(s.get("text", "")) for s in summary if isinstance(s, Mapping))
        opaque = bool(block.get("encrypted_content") or block.get("signature"))
        return Part("thinking", text, opaque=opaque)
    if kind in _IMAGE_BLOCKS:
        return Part("image")
    if kind in _CALL_BLOCKS:
        return None  # represented once, from ``AIMessage.tool_calls``
    return Part("other")


def _content_parts(content: Any) -> list[Part]:
    if isinstance(content, str):
        return [Part("text", content)] if content else []
    parts = (_block_part(b) for b in content) if isinstance(content, list) else ()
    return [p for p in parts if p is not None]


def _truncate_content(content: Any, max_chars: int) -> Any:
    if isinstance(content, str):
        return content if len(content) <= max_chars else head_tail(content, max_chars)
    if not isinstance(content, list):
        return content
    out: list[Any] = []
    for block in content:
        if isinstance(block, str) and len(block) > max_chars:
            block = head_tail(block, max_chars)
        elif isinstance(block, Mapping) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str) and len(text) > max_chars:
                block = {**block, "text": head_tail(text, max_chars)}
        out.append(block)
    return content if all(a is b for a, b in zip(out, content, strict=True)) else out


def _strip(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _strip(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


class LangChainDialect(Dialect):
    """LangChain ``BaseMessage`` objects (what LangGraph keeps in ``state["messages"]``).

    Tool calls are read from ``AIMessage.tool_calls``, results from
    ``ToolMessage.tool_call_id``; content is a string or a list of content blocks (text,
    image, Anthropic ``thinking``, LangChain/OpenAI ``reasoning``). The digest covers the
    message type, content, tool calls, tool-call id and name — never the random ``id``.
    Messages are never mutated: truncation returns ``model_copy(update=...)``.
    """

    name: ClassVar[str] = "langchain"

    def role(self, message: Any) -> str:
        if not isinstance(message, BaseMessage):
            raise DialectError(f"langchain: a message is {type(message).__name__}, "
                               "not a BaseMessage")
        kind = message.type
        role = _ROLE_BY_TYPE.get(kind)
        if role is not None:
            return role
        if kind in ("chat", "ChatMessageChunk"):
            raw = str(getattr(message, "role", "user"))
            return _CHAT_ROLES.get(raw, raw)
        return str(kind)

    def tool_call_ids(self, message: Any) -> tuple[str, ...]:
        calls = getattr(message, "tool_calls", None)
        if not calls:
            return ()
        return tuple(str(c.get("id") or "") for c in calls)

    def tool_result_ids(self, message: Any) -> tuple[str, ...]:
        ref = getattr(message, "tool_call_id", None)
        if ref is None or self.role(message) != "tool":
            return ()
        return (str(ref),)

    def parts(self, message: Any) -> list[Part]:
        parts: list[Part] = []
        kwargs = getattr(message, "additional_kwargs", None) or {}
        reasoning = kwargs.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            parts.append(Part("thinking", reasoning))
        content = _content_parts(getattr(message, "content", ""))
        if self.role(message) == "tool":
            text = "\n".join(p.text for p in content if p.text)
            ref = str(getattr(message, "tool_call_id", "") or "")
            name = str(getattr(message, "name", "") or "")
            return [*parts, Part("tool_result", text, name, ref)]
        parts.extend(content)
        for call in getattr(message, "tool_calls", None) or ():
            args = orjson.dumps(call.get("args") or {}, default=str).decode()
            parts.append(Part("tool_call", args, str(call.get("name", "")), str(call.get("id"))))
        return parts

    def is_opaque(self, message: Any) -> bool:
        """A message whose content holds a block this dialect does not model (a provider's
        server-tool result, a ``non_standard`` block, anything newer): the engine keeps it
        verbatim, never rendered into compaction text (which would lose the block)."""
        content = getattr(message, "content", None)
        if not isinstance(content, list):
            return False
        return any(part is not None and part.kind == "other"  # what ``_block_part`` cannot read
                   for part in map(_block_part, content))

    def digest(self, message: Any) -> str:
        content = getattr(message, "content", "")
        calls = getattr(message, "tool_calls", None) or []
        data = [
            getattr(message, "type", ""),
            content if isinstance(content, str) else _strip(content),
            [[c.get("name"), c.get("args"), c.get("id")] for c in calls],
            getattr(message, "tool_call_id", None),
            getattr(message, "name", None),
            getattr(message, "role", None),
        ]
        raw = orjson.dumps(data, default=str, option=orjson.OPT_SORT_KEYS)
        return hashlib.blake2b(raw, digest_size=16).hexdigest()

    def text_message(self, text: str, role: str = "user") -> Any:
        # a content-derived id keeps the message stable across calls and lets LangGraph's
        # ``add_messages`` accept it without assigning (mutating) a random one
        ident = "agentcompact-" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
        if role == "system":
            return SystemMessage(content=text, id=ident)
        if role == "assistant":
            return AIMessage(content=text, id=ident)
        return HumanMessage(content=text, id=ident)

    def truncate(self, message: Any, max_chars: int) -> Any:
        content = getattr(message, "content", "")
        new = _truncate_content(content, max_chars)
        return message if new is content else message.model_copy(update={"content": new})

    def check_shape(self, message: Any, index: int) -> None:
        if not isinstance(message, BaseMessage):
            raise ValidationError(
                f"langchain: message {index} is {type(message).__name__}, not a BaseMessage",
                index)


_DIALECT = LangChainDialect()


@hookimpl
def agentcompact_register_dialects(register: Callable[..., None]) -> None:
    """Register the ``langchain`` dialect (``pm.register(agentcompact.integrations.langgraph)``)."""
    register(_DIALECT)


# ---------------------------------------------------------------------- shared plumbing


def _make_engine(engine: Engine | None, plugins: pluggy.PluginManager | None,
                 episode_id: str | None, kwargs: dict[str, Any], owner: str) -> Engine:
    if engine is not None:
        return check_engine(engine, LangChainDialect, owner, kwargs)
    return engine_from_options(_DIALECT, kwargs, plugins=plugins, episode_id=episode_id,
                               owner=owner)


def _checked(messages: Any, owner: str) -> list[Any]:
    """``messages`` as a list, each a ``BaseMessage`` (a ``DialectError`` names the first
    that is not, by index and type)."""
    if not isinstance(messages, (list, tuple)):
        raise DialectError(f"{owner}: messages is {type(messages).__name__}, not a list")
    for i, message in enumerate(messages):
        if not isinstance(message, BaseMessage):
            raise DialectError(f"{owner}: message {i} is {type(message).__name__}, not a "
                               "LangChain BaseMessage")
    return list(messages)


def _tool_schema(tool: Any) -> Any:
    if isinstance(tool, Mapping):
        return dict(tool)
    try:
        return convert_to_openai_tool(tool)
    except Exception:  # a tool LangChain cannot describe: count its name and description
        return {"name": str(getattr(tool, "name", "")),
                "description": str(getattr(tool, "description", ""))}


def _fixed_tokens(engine: Engine) -> Callable[[Any, Sequence[Any] | None], int]:
    """Tokens of a system prompt (a message or its content) and tools sent besides the
    messages, converted and counted again only when one of them changed (an agent passes
    the same objects every call)."""
    fixed = FixedTokens(engine.counter, ("system", "tools"), _body_value)
    return lambda system, tools: fixed.count({"system": system, "tools": tuple(tools or ())})


def _body_value(key: str, value: Any) -> Any:
    if key == "tools":
        return [_tool_schema(t) for t in value]
    return getattr(value, "content", value)


def _usage_of(message: BaseMessage, result: LLMResult | None = None) -> dict[str, Any]:
    usage = getattr(message, "usage_metadata", None)
    if usage:
        return json_safe(dict(usage))  # type: ignore[no-any-return]  # JSON round trip
    output = (result.llm_output or {}) if result is not None else {}
    token_usage = output.get("token_usage") or output.get("usage") or {}
    return json_safe(dict(token_usage))  # type: ignore[no-any-return]  # JSON round trip


def _openai_dicts() -> MessageCopies:
    """LangChain messages as JSON-safe OpenAI chat dicts, converted once per message object."""
    return MessageCopies(lambda message: json_safe(convert_to_openai_messages(message)))


def model_call_from_langchain(
    sent: Sequence[BaseMessage], response: BaseMessage, *, episode_id: str,
    group_id: str | None = None, usage: Mapping[str, Any] | None = None,
    model: str | None = None, request: Mapping[str, Any] | None = None,
    _convert: Callable[[Sequence[BaseMessage]], list[Any]] | None = None,
) -> ModelCall:
    """A :class:`ModelCall` for LangChain messages (converted to OpenAI chat dicts).

    ``compacted`` is true when the context sent holds a compaction message (the same as
    ``CompactionResult.modified`` for the call that produced it).
    """
    messages = (_convert(sent) if _convert is not None
                else [json_safe(convert_to_openai_messages(m)) for m in sent])
    reply = convert_to_openai_messages(response)
    return ModelCall(
        episode_id=episode_id, dialect="openai_chat", messages=messages,
        response=[json_safe(reply)], request=json_safe(dict(request or {})),
        usage=dict(usage) if usage is not None else _usage_of(response), model=model,
        compacted=any(_DIALECT.is_synthetic(m) for m in sent), group_id=group_id,
        **_sampled_fields(response),
    )


def _sampled_fields(response: BaseMessage) -> dict[str, Any]:
    """What the server reported of its sampled tokens, as ``ChatOpenAI`` keeps it: the
    choice's ``logprobs`` (``logprobs=True``; each token's text, logprob and bytes) in
    ``response_metadata``; vLLM's ``token_ids`` / ``prompt_token_ids`` where a chat model
    passes them on there (``ChatOpenAI`` drops them: the exporter then maps the tokens'
    bytes to its tokenizer's ids)."""
    meta = getattr(response, "response_metadata", None)
    if not isinstance(meta, Mapping) or not meta.get("logprobs") and not meta.get("token_ids"):
        return {}
    body = {"prompt_token_ids": meta.get("prompt_token_ids"),
            "choices": [{"logprobs": meta.get("logprobs"), "token_ids": meta.get("token_ids")}]}
    return from_chat_completion(body).model_call_fields()


# ---------------------------------------------------------------------- node and hook


def _bound_tools(model: Any) -> list[Any]:
    """The tool schemas bound to ``model`` (``bind_tools`` keeps them in ``kwargs``)."""
    while model is not None:
        kwargs = getattr(model, "kwargs", None)
        if isinstance(kwargs, Mapping) and kwargs.get("tools"):
            return list(kwargs["tools"])
        model = getattr(model, "bound", None)
    return []


class CompactionNode(Runnable[Any, dict[str, Any]]):
    """A LangGraph node that compacts ``state["messages"]`` (see the module docstring).

    Use it as ``builder.add_node("compact", node)``, ``create_react_agent(...,
    pre_model_hook=node)``, or call it (``node(state)`` / ``await node.ainvoke(state)``);
    or let :meth:`wrap` put it inside the model.

    :param engine: an :class:`~agentcompact.Engine` with a :class:`LangChainDialect`;
        or leave it out and give ``budget=Budget(trigger_tokens=...)`` (and any other
        ``Engine`` option).
    :param mode: ``"llm_input"`` (state keeps the full history) or ``"rewrite"``.
    :param system_prompt: / :param tools: what the model receives besides the state's
        messages (``create_react_agent``'s ``prompt`` and ``tools``): counted toward the
        budget. A system message inside ``state["messages"]`` is counted anyway.
    :param check_wiring: in ``llm_input`` mode, raise :class:`ConfigError` when the state
        shows the model was called more than once since this node's last pass (an edge
        reaching the model without passing the node, which would send a stale
        ``llm_input_messages``). Turn it off for graphs where other model nodes add
        AI messages between this node's passes.
    :param episode_id: stamped on compaction events and on :attr:`logger`'s model calls.
    :param group_id: the task (GRPO group) for :attr:`logger`'s model calls.
    """

    def __init__(
        self, engine: Engine | None = None, *, budget: Budget | None = None,
        mode: Mode = "llm_input", episode_id: str | None = None, group_id: str | None = None,
        plugins: pluggy.PluginManager | None = None, messages_key: str = "messages",
        system_prompt: str | SystemMessage | None = None, tools: Sequence[Any] | None = None,
        check_wiring: bool = True, **engine_kwargs: Any,
    ) -> None:
        if mode not in ("llm_input", "rewrite"):
            raise ConfigError(f"CompactionNode: mode must be 'llm_input' or 'rewrite', got "
                              f"{mode!r}")
        if system_prompt is not None and not isinstance(system_prompt, (str, SystemMessage)):
            raise ConfigError(f"CompactionNode: system_prompt must be a str or SystemMessage, "
                              f"got {type(system_prompt).__name__}")
        if budget is not None:
            engine_kwargs["budget"] = budget
        self.engine = _make_engine(engine, plugins, episode_id, engine_kwargs, "CompactionNode")
        self.mode: Mode = mode
        self.messages_key = messages_key
        self.system_prompt = system_prompt
        self.tools = list(tools or ())
        self.check_wiring = check_wiring
        self.episode_id = episode_id or self.engine.episode_id or new_id()
        self.group_id = group_id
        self.last_result: CompactionResult | None = None
        self._fixed = _fixed_tokens(self.engine)
        self._logger: ModelCallLogger | None = None

    @property
    def logger(self) -> ModelCallLogger:
        """A :class:`ModelCallLogger` sharing this node's episode, group and plugins."""
        if self._logger is None:
            self._logger = ModelCallLogger(episode_id=self.episode_id, group_id=self.group_id,
                                           plugins=self.engine.pm)
        return self._logger

    def _messages(self, state: Any) -> list[Any]:
        value = (state.get(self.messages_key) if isinstance(state, Mapping)
                 else getattr(state, self.messages_key, None))
        if value is None:
            raise ConfigError(f"CompactionNode: state has no {self.messages_key!r} key")
        messages = _checked(value, "CompactionNode")
        if self.mode == "llm_input" and self.check_wiring:
            previous = (state.get("llm_input_messages") if isinstance(state, Mapping)
                        else getattr(state, "llm_input_messages", None))
            if previous:
                _check_fresh(previous, messages)
        return messages

    def _update(self, result: CompactionResult) -> dict[str, Any]:
        self.last_result = result
        if self.mode == "llm_input":
            return {"llm_input_messages": result.messages}
        if not result.modified:
            return {}
        return {self.messages_key: [RemoveMessage(id=REMOVE_ALL_MESSAGES), *result.messages]}

    def invoke(self, input: Any, config: RunnableConfig | None = None,  # noqa: A002 - Runnable API
               **kwargs: Any) -> dict[str, Any]:
        """The state update for ``input`` (a graph state)."""
        messages = self._messages(input)
        fixed = self._fixed(self.system_prompt, self.tools)
        return self._update(self.engine.compact(messages, fixed_tokens=fixed))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None,  # noqa: A002
                      **kwargs: Any) -> dict[str, Any]:
        """``invoke`` for async graphs: awaits async strategies."""
        messages = self._messages(input)
        fixed = self._fixed(self.system_prompt, self.tools)
        return self._update(await self.engine.acompact(messages, fixed_tokens=fixed))

    def __call__(self, state: Any) -> dict[str, Any]:
        return self.invoke(state)

    # --- the node inside the model -------------------------------------------------------
    def _model_input(self, value: Any) -> list[Any]:
        if isinstance(value, PromptValue):
            return value.to_messages()
        if isinstance(value, str):
            return [HumanMessage(content=value)]
        if isinstance(value, Mapping):
            value = value.get(self.messages_key)
            if value is None:
                raise ConfigError(f"CompactionNode.wrap: input has no {self.messages_key!r} "
                                  "key")
        return _checked(value, "CompactionNode.wrap")

    def wrap(self, model: Runnable[Any, Any], *, tools: Sequence[Any] | None = None
             ) -> Runnable[Any, Any]:
        """``model`` with its input compacted on every call, for a ``StateGraph`` of your
        own: ``llm = node.wrap(ChatOpenAI(...).bind_tools(tools))`` then, in the model
        node, ``llm.invoke(state["messages"])``. No edge can then reach the model
        uncompacted, and the state keeps the full history. The tools bound to ``model``
        (or ``tools=``) and the node's ``system_prompt`` count toward the budget; invoke,
        stream and their async forms all compact (``last_result`` tells the last one).
        """
        bound = list(tools) if tools is not None else (_bound_tools(model) or self.tools)

        def prepare(value: Any) -> list[Any]:
            messages = self._model_input(value)
            result = self.engine.compact(messages,
                                         fixed_tokens=self._fixed(self.system_prompt, bound))
            self.last_result = result
            return list(result.messages)

        async def aprepare(value: Any) -> list[Any]:
            messages = self._model_input(value)
            result = await self.engine.acompact(
                messages, fixed_tokens=self._fixed(self.system_prompt, bound))
            self.last_result = result
            return list(result.messages)

        return RunnableLambda(prepare, afunc=aprepare, name="agentcompact") | model


def _check_fresh(previous: Sequence[Any], messages: Sequence[Any]) -> None:
    """Raise when the model answered more than once since ``previous`` was computed."""
    last_id = getattr(previous[-1], "id", None)
    if last_id is None:
        return
    for j in range(len(messages) - 1, -1, -1):
        if getattr(messages[j], "id", None) == last_id:
            answers = sum(1 for m in messages[j + 1:] if isinstance(m, AIMessage))
            if answers > 1:
                raise ConfigError(
                    f"CompactionNode: the model answered {answers} times since this node's "
                    "last pass, so it was sent a stale llm_input_messages: an edge reaches the "
                    "model without passing the node (route every edge into the model through "
                    "it, or use node.wrap(model) or create_agent with CompactionMiddleware)")
            return


def pre_model_hook(engine: Engine | None = None, **options: Any) -> CompactionNode:
    """A ``pre_model_hook`` for ``langgraph.prebuilt.create_react_agent``.

    ``create_react_agent`` sends ``llm_input_messages`` to the model when the hook returns
    them and keeps ``messages`` (the full history) in state. Options are those of
    :class:`CompactionNode` (``mode="rewrite"`` rewrites the state instead); give the
    agent's ``prompt`` and ``tools`` as ``system_prompt=`` / ``tools=`` so the budget
    counts them. LangGraph 1.x deprecates ``create_react_agent``: prefer
    ``langchain.agents.create_agent`` with :class:`CompactionMiddleware`.
    """
    return CompactionNode(engine, **options)


# ---------------------------------------------------------------------- RL logging


def _request_fields(params: Mapping[str, Any] | None) -> dict[str, Any]:
    keep = ("model", "model_name", "tools", "tool_choice", "temperature", "top_p", "max_tokens",
            "max_completion_tokens", "reasoning_effort", "response_format")
    return {k: params[k] for k in keep if params and params.get(k) is not None}


class ModelCallLogger(BaseCallbackHandler):
    """A callback handler firing ``agentcompact_log_model_call`` for every chat-model call.

    The context logged is exactly the messages the chat model received (so compaction by a
    node or hook shows). Streaming calls are logged when the stream ends. Per-run ids can
    be given in the run's metadata: ``config={"metadata": {"agentcompact_episode_id": ...,
    "agentcompact_group_id": ...}}``.
    """

    raise_error = True  # a failing recorder must not be silently ignored
    run_inline = True  # keep calls in order in async graphs

    def __init__(self, *, episode_id: str | None = None, group_id: str | None = None,
                 plugins: pluggy.PluginManager | None = None) -> None:
        super().__init__()
        self.episode_id = episode_id or new_id()
        self.group_id = group_id
        self.pm = plugins
        self._dicts = _openai_dicts()  # each message converted once for this logger
        self._pending: dict[UUID, tuple[list[BaseMessage], dict[str, Any], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]],
                            *, run_id: UUID, metadata: dict[str, Any] | None = None,
                            **kwargs: Any) -> None:
        params = kwargs.get("invocation_params") or {}
        with self._lock:
            self._pending[run_id] = (list(messages[0]) if messages else [], dict(metadata or {}),
                                     _request_fields(params))

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            pending = self._pending.pop(run_id, None)
        if pending is None or not response.generations or not response.generations[0]:
            return
        sent, metadata, request = pending
        generation = response.generations[0][0]
        if not isinstance(generation, ChatGeneration):
            return
        message = generation.message
        model = ((response.llm_output or {}).get("model_name")
                 or message.response_metadata.get("model_name") or request.get("model"))
        call = model_call_from_langchain(
            sent, message, usage=_usage_of(message, response), model=model, request=request,
            _convert=self._dicts,
            episode_id=metadata.get("agentcompact_episode_id") or self.episode_id,
            group_id=metadata.get("agentcompact_group_id") or self.group_id)
        log_model_call(call, self.pm)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._pending.pop(run_id, None)


# ---------------------------------------------------------------------- middleware


def _ai_of(response: Any) -> AIMessage | None:
    if isinstance(response, AIMessage):
        return response
    inner = getattr(response, "model_response", response)
    for message in getattr(inner, "result", ()):
        if isinstance(message, AIMessage):
            return message
    return None


class CompactionMiddleware(AgentMiddleware):
    """Compacts what the model sees in ``langchain.agents.create_agent`` agents.

    ``wrap_model_call`` / ``awrap_model_call`` replace the request's messages with the
    compacted view; the agent state (and any checkpoint) keeps the full history. The
    budget counts the request's system message and tool schemas too. Each model call is
    logged through ``agentcompact_log_model_call`` unless ``record=False``.
    :attr:`last_result` is the :class:`CompactionResult` of the latest model call (whether
    or not it compacted: see its ``compacted`` / ``modified``).

    :param engine: an :class:`~agentcompact.Engine` with a :class:`LangChainDialect`, or
        ``budget=Budget(trigger_tokens=...)`` and other ``Engine`` options, checked here.
    :param episode_id: / :param group_id: stamped on logged calls (settable attributes).
    """

    def __init__(
        self, engine: Engine | None = None, *, budget: Budget | None = None,
        episode_id: str | None = None, group_id: str | None = None,
        plugins: pluggy.PluginManager | None = None, record: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        super().__init__()
        if budget is not None:
            engine_kwargs["budget"] = budget
        self.engine = _make_engine(engine, plugins, episode_id, engine_kwargs,
                                   "CompactionMiddleware")
        if not isinstance(record, bool):
            raise ConfigError(f"CompactionMiddleware: record must be a bool, got "
                              f"{type(record).__name__}")
        self.episode_id = episode_id or self.engine.episode_id or new_id()
        self.group_id = group_id
        self.record = record
        self.tools = []
        self.last_result: CompactionResult | None = None
        self._fixed = _fixed_tokens(self.engine)
        self._dicts = _openai_dicts()  # each message converted once for this middleware

    def _fixed_tokens(self, request: ModelRequest) -> int:
        return self._fixed(request.system_message, request.tools)

    def _request(self, request: ModelRequest, result: CompactionResult) -> ModelRequest:
        self.last_result = result
        return request.override(messages=result.messages) if result.modified else request

    def _log(self, request: ModelRequest, response: Any) -> None:
        message = _ai_of(response)
        if not self.record or message is None:
            return
        sent = [request.system_message] if request.system_message is not None else []
        tools = [t for t in request.tools if isinstance(t, Mapping)]
        tools += [{"name": t.name, "description": t.description}
                  for t in request.tools if not isinstance(t, Mapping)]
        model = getattr(request.model, "model_name", None) or getattr(request.model, "model", None)
        call = model_call_from_langchain(
            [*sent, *request.messages], message, episode_id=self.episode_id, _convert=self._dicts,
            group_id=self.group_id, model=str(model) if model else None,
            request={"tools": tools} if tools else {})
        log_model_call(call, self.engine.pm)

    def wrap_model_call(self, request: ModelRequest,
                        handler: Callable[[ModelRequest], ModelResponse]) -> Any:
        messages = _checked(request.messages, "CompactionMiddleware")
        result = self.engine.compact(messages, fixed_tokens=self._fixed_tokens(request))
        request = self._request(request, result)
        response = handler(request)
        self._log(request, response)
        return response

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
                               ) -> Any:
        messages = _checked(request.messages, "CompactionMiddleware")
        result = await self.engine.acompact(messages, fixed_tokens=self._fixed_tokens(request))
        request = self._request(request, result)
        response = await handler(request)
        self._log(request, response)
        return response
