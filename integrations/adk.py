"""Google ADK integration: a ``before_model_callback`` that bounds every ``LlmRequest`` an
``LlmAgent`` sends.

Install with ``pip install agentcompact[adk]``. One line::

    agent = LlmAgent(..., before_model_callback=CompactionCallback(budget=Budget(60000)))

ADK builds each request's ``contents`` from the session's events; the callback replaces them
with the compacted view just before the model is called (every step of the tool loop, any
model client: Gemini, ``LiteLlm``…), and the session keeps every event. The budget counts
the contents, the request's system instruction and its tool declarations. ADK's own
compaction (``EventsCompactionConfig``) summarizes events with an LLM after the turn; this
one cuts verbatim, before each call, within a token bound.

Recording (for ``agentcompact export``): also pass ``after_model_callback=callback.record``;
each model call then fires ``agentcompact_log_model_call`` with the contents sent and the
model's content, in the ``gemini`` dialect (the Gemini API's JSON, as ``model_dump`` with
aliases writes it).

Contents are ``google.genai.types.Content`` objects, read through :class:`GenAIDialect` and
never mutated: ``function_call`` / ``function_response`` parts pair by id, thought parts and
any part carrying a ``thought_signature`` pass byte for byte or not at all. One engine per
ADK session (LRU-bounded).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

import orjson
import pluggy
from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types

from agentcompact import (
    CompactionResult,
    ConfigError,
    DialectError,
    Engine,
    ModelCall,
    ValidationError,
    hookimpl,
    log_model_call,
)
from agentcompact.dialects import Dialect, Part, digest_of, truncated

from ._hosts import Conversations, conversation_key
from ._requests import json_safe

__all__ = ["CompactionCallback", "GenAIDialect", "agentcompact_register_dialects"]

log = logging.getLogger("agentcompact.adk")

#: model calls awaiting ``record`` (one per agent of each invocation in flight; without
#: ``record`` the oldest give way)
_PENDING_CALLS = 256
#: ``GenerateContentConfig`` fields (as dumped with aliases) that are sampling settings:
#: on the Gemini wire they sit in ``generationConfig``
_SAMPLING = ("temperature", "topP", "topK", "maxOutputTokens", "seed")


def _json_text(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def _part(part: types.Part) -> Part:
    if part.function_call is not None:
        call = part.function_call
        return Part("tool_call", _json_text(call.args or {}), call.name or "", call.id or "")
    if part.function_response is not None:
        response = part.function_response
        return Part("tool_result", _json_text(response.response or {}), response.name or "",
                    response.id or "")
    if part.text is not None:
        if part.thought:
            return Part("thinking", part.text, opaque=part.thought_signature is not None)
        return Part("text", part.text)
    if part.inline_data is not None or part.file_data is not None:
        return Part("image")
    return Part("other")  # executable code, its result, server tool calls, newer kinds


def _keeps_bytes(part: types.Part) -> bool:
    """A part that must reach the model byte for byte (signed, or not modelled)."""
    return part.thought_signature is not None or _part(part).kind == "other"


class GenAIDialect(Dialect):
    """``google.genai.types.Content`` messages, as ADK's ``LlmRequest.contents`` holds them.

    Role ``model`` is the assistant; ``user`` contents carry the user's text and the
    ``function_response`` parts answering the ``function_call`` parts (by ``id``) of the
    model content before them. A content with a part this dialect does not model
    (executable code, server-side tool calls) is opaque: kept verbatim, never rendered.
    Truncation cuts only plain text and function-response strings; signed parts stay whole.
    """

    name: ClassVar[str] = "google_genai"

    def role(self, message: Any) -> str:
        if not isinstance(message, types.Content):
            raise DialectError(f"google_genai: a message is {type(message).__name__}, not a "
                               "google.genai Content")
        return "assistant" if message.role == "model" else "user"

    def tool_call_ids(self, message: Any) -> tuple[str, ...]:
        return tuple(p.function_call.id or "" for p in message.parts or ()
                     if p.function_call is not None)

    def tool_result_ids(self, message: Any) -> tuple[str, ...]:
        return tuple(p.function_response.id or "" for p in message.parts or ()
                     if p.function_response is not None)

    def parts(self, message: Any) -> list[Part]:
        self.role(message)
        return [_part(p) for p in message.parts or ()]

    def is_opaque(self, message: Any) -> bool:
        return isinstance(message, types.Content) and any(
            _part(p).kind == "other" for p in message.parts or ())

    def digest(self, message: Any) -> str:
        return digest_of(message.model_dump(mode="json", exclude_none=True))

    def text_message(self, text: str, role: str = "user") -> Any:
        return types.Content(role="model" if role == "assistant" else "user",
                             parts=[types.Part(text=text)])

    def truncate(self, message: Any, max_chars: int) -> Any:
        parts = message.parts or []
        new = [_truncated(p, max_chars) for p in parts]
        if all(a is b for a, b in zip(new, parts)):
            return message
        return message.model_copy(update={"parts": new})

    def truncation_texts(self, message: Any) -> list[str]:
        texts = []
        for p in message.parts or ():
            if _keeps_bytes(p):
                continue
            if p.text is not None and not p.thought:
                texts.append(p.text)
            elif p.function_response is not None:
                texts += [v for v in (p.function_response.response or {}).values()
                          if isinstance(v, str)]
        return texts

    def check_shape(self, message: Any, index: int) -> None:
        if not isinstance(message, types.Content):
            raise ValidationError(f"google_genai: message {index} is {type(message).__name__}, "
                                  "not a google.genai Content", index)


def _truncated(part: types.Part, max_chars: int) -> types.Part:
    if _keeps_bytes(part):
        return part
    if part.text is not None and not part.thought:
        cut = truncated(part.text, max_chars)
        return part if cut is part.text else part.model_copy(update={"text": cut})
    response = part.function_response
    if response is not None and response.response:
        new = {k: truncated(v, max_chars) if isinstance(v, str) else v
               for k, v in response.response.items()}
        if any(new[k] is not v for k, v in response.response.items()):
            return part.model_copy(update={
                "function_response": response.model_copy(update={"response": new})})
    return part


_DIALECT = GenAIDialect()


@hookimpl
def agentcompact_register_dialects(register: Callable[..., None]) -> None:
    """Register the ``google_genai`` dialect (``pm.register(agentcompact.integrations.adk)``)."""
    register(_DIALECT)


class CompactionCallback:
    """A ``before_model_callback`` compacting each ``LlmRequest``'s contents (see the module
    docstring). It returns ``None``: the request goes on to the model, compacted.

    :param engine: an :class:`~agentcompact.Engine` with a :class:`GenAIDialect`, whose
        settings each session's engine copies; or leave it out and give
        ``budget=Budget(trigger_tokens=...)`` (and any other ``Engine`` option), checked here.
    :param max_conversations: ADK sessions whose engine is kept (LRU).
    """

    def __init__(self, engine: Engine | None = None, *, max_conversations: int = 256,
                 plugins: pluggy.PluginManager | None = None, **engine_kwargs: Any) -> None:
        if engine is not None and not isinstance(engine.dialect, GenAIDialect):
            raise ConfigError(f"CompactionCallback: engine dialect is {engine.dialect.name!r}; "
                              "it must be a GenAIDialect")
        self.conversations = Conversations(_DIALECT, engine_kwargs, engine=engine,
                                           plugins=plugins, owner="CompactionCallback",
                                           max_conversations=max_conversations)
        self.last_result: CompactionResult | None = None
        self._sent: dict[tuple[str, str], tuple[str, list[types.Content], LlmRequest, bool]] = {}

    def _fixed(self, engine: Engine, request: LlmRequest) -> int:
        config = request.config
        body: dict[str, Any] = {}
        system = config.system_instruction if config is not None else None
        if system is not None:
            body["system"] = system if isinstance(system, str) else json_safe(system)
        if config is not None and config.tools:
            body["tools"] = json_safe(list(config.tools))
        return engine.fixed_tokens(body) if body else 0

    async def __call__(self, callback_context: CallbackContext, llm_request: LlmRequest
                       ) -> None:
        contents = list(llm_request.contents)
        session = getattr(callback_context, "session", None)
        key = conversation_key(_DIALECT, contents, client_id=getattr(session, "id", None),
                               scope=str(getattr(session, "app_name", "")))
        engine = self.conversations.get(key)
        result = await engine.acompact(contents, fixed_tokens=self._fixed(engine, llm_request))
        self.last_result = result
        if result.modified:
            llm_request.contents = list(result.messages)
        call = _call_of(callback_context)
        self._sent.pop(call, None)
        if len(self._sent) >= _PENDING_CALLS:
            del self._sent[next(iter(self._sent))]
        self._sent[call] = (key, list(llm_request.contents), llm_request, result.modified)
        return None

    async def record(self, callback_context: CallbackContext, llm_response: LlmResponse
                     ) -> None:
        """An ``after_model_callback`` firing ``agentcompact_log_model_call`` for each model
        call this callback compacted (streamed partial responses wait for the final one).
        A recording failure is logged, never raised into the run."""
        if llm_response.partial:
            return None
        sent = self._sent.pop(_call_of(callback_context), None)
        if sent is None:
            return None
        key, contents, request, compacted = sent
        try:
            content = llm_response.content
            usage = llm_response.usage_metadata
            call = ModelCall(
                episode_id=key, dialect="gemini",
                messages=[_wire(c) for c in contents],
                response=[_wire(content)] if content is not None else [],
                request=_wire_request(request),
                usage=_wire(usage) if usage is not None else {},
                model=llm_response.model_version or request.model, compacted=compacted)
            log_model_call(call, self.conversations.plugins)
        except Exception as exc:  # a recording failure never reaches the run
            log.error("agentcompact: recording an ADK model call failed: %s",
                      type(exc).__name__)
        return None


def _call_of(context: CallbackContext) -> tuple[str, str]:
    """One agent's model call in flight: ADK runs an agent's calls one after another."""
    return (str(getattr(context, "invocation_id", "")), str(getattr(context, "agent_name", "")))


def _wire(value: Any) -> Any:
    """A google.genai object as the Gemini API's JSON (camelCase, bytes as base64)."""
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


def _wire_request(request: LlmRequest) -> dict[str, Any]:
    """The request fields beside the contents, as the Gemini API names them."""
    config = _wire(request.config) if request.config is not None else {}
    out: dict[str, Any] = {k: config[k] for k in ("systemInstruction", "tools") if k in config}
    if isinstance(out.get("systemInstruction"), str):  # the SDK sends text as one part
        out["systemInstruction"] = {"parts": [{"text": out["systemInstruction"]}]}
    sampling = {k: config[k] for k in _SAMPLING if k in config}
    if sampling:
        out["generationConfig"] = sampling
    return out
