"""LiteLLM integration: a ``CustomLogger`` callback that compacts every request, in the
LiteLLM proxy server (the gateway) and on the SDK path.

Install with ``pip install agentcompact[litellm]``. In the proxy's ``config.yaml``::

    litellm_settings:
      callbacks: agentcompact.integrations.litellm.callback

``callback`` is built on first use from ``AGENTCOMPACT_TRIGGER`` (tokens, default 100000),
``AGENTCOMPACT_TARGET``, ``AGENTCOMPACT_STRATEGY`` (default ``cliff``) and
``AGENTCOMPACT_COUNTER`` (default ``tiktoken``); or put your own instance in a module beside
the config (``handler = CompactionCallback(budget=Budget(trigger_tokens=60000))``) and name it
(``callbacks: my_callbacks.handler``).

On the SDK path, add it to ``litellm.callbacks``: ``litellm.acompletion``,
``litellm.aresponses``, ``litellm.anthropic.messages.acreate`` and every ``Router`` call
(``Router.acompletion``, ``Router.completion``…: the router calls the async path) are
compacted, through the hook LiteLLM runs just before a request goes to the deployment. The
synchronous ``litellm.completion`` runs no request hook; wrap it:
``completion = callback.wrap(litellm.completion)``.

The three request shapes LiteLLM serves are compacted in their own dialect: chat completions
(``openai_chat``), ``/v1/messages`` (``anthropic``, ``system`` counted) and ``/v1/responses``
(``openai_responses``, ``instructions`` counted; a string ``input`` and requests chained with
``previous_response_id`` pass through, the server holding the history). Tool schemas count
toward the budget. Other call types (embeddings, images…) pass through.

One engine per conversation (LRU-bounded): the conversation is the client's session id
(an ``x-session-id`` / ``session_id`` header, LiteLLM's ``litellm_session_id``, or
``metadata.session_id``), else the digest of the conversation's root (system prompt and
first user message), scoped in the proxy by the caller's API key, so two tenants never
share an engine or a stored prefix. Each model call is logged through
``agentcompact_log_model_call`` with the messages sent (``record=True``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, overload

import pluggy
from litellm.integrations.custom_logger import CustomLogger

from agentcompact import (
    Budget,
    CompactionResult,
    ConfigError,
    Dialect,
    DialectError,
    Engine,
    ModelCall,
    get_dialect,
    log_model_call,
)

from ._hosts import Conversations, conversation_key
from ._requests import RequestShape as _Shape
from ._requests import json_safe

__all__ = ["CompactionCallback", "callback"]  # noqa: F822 - callback: built on first read

log = logging.getLogger("agentcompact.litellm")


_CHAT = _Shape("openai_chat", "messages", ("tools",))
_MESSAGES = _Shape("anthropic", "messages", ("system", "tools"))
_RESPONSES = _Shape("openai_responses", "input", ("instructions", "tools"))
_SHAPES = {"completion": _CHAT, "acompletion": _CHAT,
           "anthropic_messages": _MESSAGES,
           "responses": _RESPONSES, "aresponses": _RESPONSES}
_SESSION_HEADERS = ("x-session-id", "session_id", "session-id", "x-litellm-session-id")
_PENDING_CALLS = 4096  # calls awaiting their success log (then the oldest are forgotten)


def _call_type(value: Any) -> str:
    return str(getattr(value, "value", value))


def _plain(message: Any) -> Any:
    dump = getattr(message, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else message


@dataclass(slots=True)
class _Sent:
    """What the hook sent for one call, kept until its success is logged."""

    conversation: str
    dialect: str
    messages: list[Any]
    request: dict[str, Any]
    compacted: bool


class CompactionCallback(CustomLogger):
    """Compacts each request LiteLLM sends (see the module docstring).

    :param engine: an :class:`~agentcompact.Engine` whose settings every conversation's
        engine copies; or leave it out and give ``budget=Budget(trigger_tokens=...)`` (and any
        other ``Engine`` option: ``strategy``, ``counter``…), checked here.
    :param record: fire ``agentcompact_log_model_call`` for each successful call.
    :param max_conversations: conversations whose engine is kept (LRU).
    :param plugins: the plugin manager for engines and logging (default: the global one).
    """

    def __init__(self, engine: Engine | None = None, *, record: bool = True,
                 max_conversations: int = 256, plugins: pluggy.PluginManager | None = None,
                 **engine_kwargs: Any) -> None:
        super().__init__()
        if not isinstance(record, bool):
            raise ConfigError(f"CompactionCallback: record must be a bool, got "
                              f"{type(record).__name__}")
        first = Conversations(get_dialect(_CHAT.dialect), engine_kwargs, engine=engine,
                              plugins=plugins, owner="CompactionCallback",
                              max_conversations=max_conversations)
        self._conversations: dict[str, Conversations] = {_CHAT.dialect: first}
        self._template = first.template
        self._max = max_conversations
        self.record = record
        self.last_result: CompactionResult | None = None
        self._sent: OrderedDict[str, _Sent] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ engines
    def conversations(self, dialect: str) -> Conversations:
        """The engines of ``dialect``'s conversations."""
        found = self._conversations.get(dialect)
        if found is None:
            found = Conversations(get_dialect(dialect), {}, engine=self._template,
                                  owner="CompactionCallback", max_conversations=self._max)
            self._conversations[dialect] = found
        return found

    def _key(self, dialect: Dialect, data: Mapping[str, Any], messages: list[Any],
             fixed: Any, headers: Mapping[str, Any], scope: str) -> str:
        client = next((str(headers[h]) for h in _SESSION_HEADERS if headers.get(h)), None)
        metadata = data.get("metadata") or data.get("litellm_metadata")
        client = client or data.get("litellm_session_id") or (
            metadata.get("session_id") if isinstance(metadata, Mapping) else None)
        return conversation_key(dialect, messages, scope=scope, client_id=client, fixed=fixed)

    # ------------------------------------------------------------------ compaction
    async def _compact(self, data: Mapping[str, Any], call_type: Any, *, headers: Mapping[str, Any],
                       scope: str) -> dict[str, Any] | None:
        """``data`` with its context compacted, or ``None`` when there is nothing to do."""
        shape = _SHAPES.get(_call_type(call_type))
        if shape is None:
            return None
        native = data.get(shape.key)
        if not isinstance(native, (list, tuple)) or data.get("previous_response_id"):
            return None
        messages = [_plain(m) for m in native]
        body: dict[str, Any] = {k: json_safe(data[k]) for k in shape.fixed if data.get(k)}
        conversations = self.conversations(shape.dialect)
        dialect = conversations.dialect
        fixed = body.get("system") or body.get("instructions")
        key = self._key(dialect, data, messages, fixed, headers, scope)
        engine = conversations.get(key)
        result = await _run(engine, {**body, shape.key: messages}, shape.key)
        self.last_result = result
        if self.record and data.get("litellm_call_id"):
            self._remember(str(data["litellm_call_id"]), _Sent(
                key, shape.dialect, result.messages, body, result.modified))
        if not result.modified:
            return None
        return {**data, shape.key: result.messages}

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any],
                                  call_type: Any) -> dict[str, Any] | None:
        """The proxy's hook: compacts the request before LiteLLM routes it."""
        headers = _proxy_headers(data)
        scope = str(getattr(user_api_key_dict, "api_key", None) or
                    getattr(user_api_key_dict, "token", None) or "")
        return await self._compact(data, call_type, headers=headers, scope=scope)

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any
                                             ) -> dict[str, Any] | None:
        """The SDK's hook, before a request goes to the deployment (``acompletion``,
        ``aresponses``, ``Router``); in the proxy, ``async_pre_call_hook`` did the work."""
        if "proxy_server_request" in kwargs:
            return None
        return await self._compact(kwargs, call_type, headers={}, scope="")

    def wrap(self, completion: Callable[..., Any]) -> Callable[..., Any]:
        """``litellm.completion`` (synchronous, which runs no request hook) with its
        ``messages`` compacted first: ``completion = callback.wrap(litellm.completion)``."""
        def compacted(*args: Any, **kwargs: Any) -> Any:
            if args:
                kwargs = {"model": args[0], **({"messages": args[1]} if len(args) > 1 else {}),
                          **kwargs}
                args = args[2:]
            shape, native = _CHAT, kwargs.get("messages")
            if not isinstance(native, (list, tuple)):
                return completion(*args, **kwargs)
            messages = [_plain(m) for m in native]
            body = {k: json_safe(kwargs[k]) for k in shape.fixed if kwargs.get(k)}
            conversations = self.conversations(shape.dialect)
            key = self._key(conversations.dialect, kwargs, messages, None, {}, "")
            engine = conversations.get(key)
            out, result = engine.compact_request({**body, "messages": messages})
            self.last_result = result
            return completion(*args, **{**kwargs, "messages": out["messages"]})
        return compacted

    # ------------------------------------------------------------------ recording
    def _remember(self, call_id: str, sent: _Sent) -> None:
        with self._lock:
            self._sent[call_id] = sent
            while len(self._sent) > _PENDING_CALLS:
                self._sent.popitem(last=False)

    def _pop(self, kwargs: Mapping[str, Any]) -> _Sent | None:
        call_id = kwargs.get("litellm_call_id")
        with self._lock:
            return self._sent.pop(str(call_id), None) if call_id else None

    async def async_log_success_event(self, kwargs: dict[str, Any], response_obj: Any,
                                      start_time: Any, end_time: Any) -> None:
        sent = self._pop(kwargs)
        if sent is None:
            return
        try:
            response = json_safe(response_obj)
            usage = response.get("usage") if isinstance(response, dict) else None
            call = ModelCall(
                episode_id=sent.conversation, dialect=sent.dialect,
                messages=json_safe(sent.messages), response=[response],
                request=sent.request, usage=usage or {},
                model=str(kwargs.get("model")) if kwargs.get("model") else None,
                compacted=sent.compacted)
            log_model_call(call, self._template.pm)
        except Exception as exc:  # a recording failure never reaches the caller
            log.error("agentcompact: recording a LiteLLM call failed: %s", type(exc).__name__)

    async def async_log_failure_event(self, kwargs: dict[str, Any], response_obj: Any,
                                      start_time: Any, end_time: Any) -> None:
        self._pop(kwargs)


async def _run(engine: Engine, body: dict[str, Any], key: str) -> CompactionResult:
    """Compact ``body``: a strategy that awaits (a summarizer's HTTP call) is awaited; a
    local one (cliff) goes through ``compact_request``, which measures only what is new in a
    body parsed afresh (each gateway request is)."""
    try:
        if hasattr(engine.strategy, "acompact"):
            fixed = engine.fixed_tokens(body)
            return await engine.acompact(body[key], fixed_tokens=fixed)
        if key != engine.dialect.messages_key:
            body = {**body, engine.dialect.messages_key: body.pop(key)}
        return engine.compact_request(body)[1]
    except DialectError as exc:
        raise DialectError(f"agentcompact (LiteLLM callback): {exc}") from None


def _proxy_headers(data: Mapping[str, Any]) -> Mapping[str, Any]:
    request = data.get("proxy_server_request")
    headers = request.get("headers") if isinstance(request, Mapping) else None
    return headers if isinstance(headers, Mapping) else {}


# ---------------------------------------------------------------------- by configuration


def _from_env() -> CompactionCallback:
    env = os.environ
    options: dict[str, Any] = {"budget": Budget(
        trigger_tokens=_int_env("AGENTCOMPACT_TRIGGER", 100_000),
        target_tokens=_int_env("AGENTCOMPACT_TARGET", None))}
    if env.get("AGENTCOMPACT_STRATEGY"):
        options["strategy"] = env["AGENTCOMPACT_STRATEGY"]
    if env.get("AGENTCOMPACT_COUNTER"):
        options["counter"] = env["AGENTCOMPACT_COUNTER"]
    return CompactionCallback(**options)


@overload
def _int_env(name: str, default: int) -> int: ...
@overload
def _int_env(name: str, default: None) -> int | None: ...
def _int_env(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number of tokens, got {raw!r}") from None


_callback: CompactionCallback | None = None
_callback_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    # ``callback`` is built when first read (the proxy reads it from its config), so that
    # importing this module configures nothing and reads no environment
    global _callback
    if name == "callback":
        with _callback_lock:
            if _callback is None:
                _callback = _from_env()
            return _callback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
