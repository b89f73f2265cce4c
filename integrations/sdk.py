"""Wrap an OpenAI or Anthropic SDK client so every request sends the compacted context.

Install with ``pip install agentcompact[sdk]``. One line::

    client = agentcompact.integrations.sdk.compact(OpenAI(...), trigger_tokens=60000)

Compacted (sync and async clients alike):

- ``openai.OpenAI`` / ``AsyncOpenAI``: ``chat.completions.create`` (dialect ``openai_chat``)
  and ``responses.create`` (``openai_responses``; a string ``input`` and requests chained
  with ``previous_response_id`` pass through; ``instructions`` count toward the budget);
- ``anthropic.Anthropic`` / ``AsyncAnthropic``: ``messages.create`` and ``messages.stream``
  (dialect ``anthropic``; ``system`` counts toward the budget).

Everything else is proxied untouched through ``__getattr__`` (``with_options`` and ``copy``
return wrapped clients). ``stream=True`` returns the SDK's stream object; when recording, it is
wrapped in a thin proxy that reassembles the response as it is iterated and logs it at the
end. Each call fires ``agentcompact_log_model_call`` with the exact messages sent, the
response, usage, and the client's ``episode_id`` / ``group_id`` (both settable attributes).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import pluggy

from ..engine import CompactionResult, Engine
from ..errors import ConfigError
from ..events import ModelCall, new_id
from ..logging_hooks import log_model_call

__all__ = ["CompactedClient", "Session", "compact"]

_REQUEST_KEYS = (
    "model", "system", "instructions", "tools", "tool_choice", "temperature", "top_p", "top_k",
    "max_tokens", "max_completion_tokens", "max_output_tokens", "reasoning", "reasoning_effort",
    "thinking", "response_format", "text", "stop", "stop_sequences", "seed", "logprobs",
)


def _plain(value: Any) -> Any:
    """``value`` with SDK model objects turned into dicts (the same object when none)."""
    if isinstance(value, dict):
        items = {k: _plain(v) for k, v in value.items()}
        return value if all(items[k] is value[k] for k in value) else items
    if isinstance(value, list):
        out = [_plain(v) for v in value]
        return value if all(a is b for a, b in zip(out, value, strict=True)) else out
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    return value


def _dump(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else value


def _json_safe(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value, default=str))


def _request_fields(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    fields = {}
    for key in _REQUEST_KEYS:
        value = kwargs.get(key)
        if value is not None and type(value).__name__ not in ("NotGiven", "Omit"):
            fields[key] = _plain(value)
    return _json_safe(fields)  # type: ignore[no-any-return]  # JSON round trip


class Session:
    """What a wrapped client shares: one engine per dialect, the ids, the plugin manager."""

    def __init__(self, engine: Engine | Mapping[str, Any] | None, *, episode_id: str | None,
                 group_id: str | None, record: bool, plugins: pluggy.PluginManager | None,
                 engine_kwargs: dict[str, Any]) -> None:
        if isinstance(engine, Engine):
            if engine_kwargs:
                raise ConfigError("give engine= or engine options, not both")
            self._template: Engine | None = engine
            self._kwargs: dict[str, Any] = {}
        else:
            self._template = None
            self._kwargs = {**dict(engine or {}), **engine_kwargs}
            self._kwargs.pop("dialect", None)
        self.engines: dict[str, Engine] = {}
        if isinstance(engine, Engine):
            self.engines[engine.dialect.name] = engine
        self.pm = plugins if plugins is not None else (
            engine.pm if isinstance(engine, Engine) else None)
        self.episode_id = episode_id or new_id()
        self.group_id = group_id
        self.record = record

    def engine(self, dialect: str) -> Engine:
        """The engine compacting messages of ``dialect`` (built on first use)."""
        found = self.engines.get(dialect)
        if found is None:
            t = self._template
            if t is not None:
                found = Engine(strategy=t.strategy, dialect=dialect, budget=t.budget,
                               counter=t.counter, plugins=t.pm, strict=t.strict,
                               episode_id=t.episode_id or self.episode_id)
            else:
                kwargs = {"episode_id": self.episode_id, **self._kwargs}
                found = Engine(dialect=dialect, plugins=self.pm, **kwargs)
            self.engines[dialect] = found
        return found

    def log(self, dialect: str, messages: list[Any], response: list[Any], kwargs: Mapping[str, Any],
            usage: Any, model: Any, result: CompactionResult | None) -> None:
        call = ModelCall(
            episode_id=self.episode_id, dialect=dialect, messages=_json_safe(messages),
            response=_json_safe(response), request=_request_fields(kwargs),
            usage=_json_safe(_dump(usage) or {}), model=str(model) if model else None,
            compacted=bool(result is not None and result.modified), group_id=self.group_id,
        )
        log_model_call(call, self.pm)


# ------------------------------------------------------------------ preparing requests


class _Prepared:
    """A request with its messages compacted; ``finish`` logs the response."""

    def __init__(self, session: Session, dialect: str, key: str, kwargs: dict[str, Any],
                 pseudo_key: str | None) -> None:
        self.session, self.dialect, self.key = session, dialect, key
        self.kwargs = kwargs
        self.result: CompactionResult | None = None
        self.messages: list[Any] | None = None
        native = kwargs.get(key)
        if not isinstance(native, list) or kwargs.get("previous_response_id"):
            return
        self.native = [_plain(m) for m in native]
        self.pseudo = self._pseudo(pseudo_key)

    def _pseudo(self, pseudo_key: str | None) -> dict[str, Any] | None:
        # system prompt / instructions count toward the budget as a leading head message
        value = self.kwargs.get(pseudo_key) if pseudo_key else None
        if not value or type(value).__name__ in ("NotGiven", "Omit"):
            return None
        role = "developer" if self.dialect == "openai_responses" else "system"
        return {"role": role, "content": _plain(value)}

    @property
    def active(self) -> bool:
        return hasattr(self, "native")

    def _input(self) -> list[Any]:
        return [self.pseudo, *self.native] if self.pseudo is not None else self.native

    def apply(self, result: CompactionResult) -> dict[str, Any]:
        self.result = result
        out = result.messages
        if self.pseudo is not None:
            out = out[1:]
        self.messages = out
        # send exactly what is logged: SDK objects in the history go out as their dicts
        return {**self.kwargs, self.key: out}

    def compact(self) -> dict[str, Any]:
        if not self.active:
            return self.kwargs
        return self.apply(self.session.engine(self.dialect).compact(self._input()))

    async def acompact(self) -> dict[str, Any]:
        if not self.active:
            return self.kwargs
        return self.apply(await self.session.engine(self.dialect).acompact(self._input()))

    def finish(self, response: list[Any], usage: Any, model: Any) -> None:
        if not self.session.record:
            return
        sent = self.messages if self.messages is not None else self.kwargs.get(self.key)
        if isinstance(sent, str):
            sent = [{"role": "user", "content": sent}]
        self.session.log(self.dialect, list(sent or []), response, self.kwargs, usage, model,
                         self.result)


# ------------------------------------------------------------------ response reassembly


def _chat_response(completion: Any) -> tuple[list[Any], Any, Any]:
    message = completion.choices[0].message if completion.choices else None
    return [_dump(message)] if message is not None else [], completion.usage, completion.model


def _responses_response(response: Any) -> tuple[list[Any], Any, Any]:
    return [_dump(item) for item in response.output or ()], response.usage, response.model


def _anthropic_response(message: Any) -> tuple[list[Any], Any, Any]:
    content = [_dump(block) for block in message.content or ()]
    return [{"role": "assistant", "content": content}], message.usage, message.model


class _ChatChunks:
    """Reassembles a streamed Chat Completion."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: Any = None
        self.model: Any = None

    def add(self, chunk: Any) -> None:
        self.model = getattr(chunk, "model", None) or self.model
        self.usage = getattr(chunk, "usage", None) or self.usage
        for choice in getattr(chunk, "choices", None) or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            self.text.append(delta.content or "")
            extra = getattr(delta, "model_extra", None) or {}
            reasoning = extra.get("reasoning_content") or extra.get("reasoning")
            if isinstance(reasoning, str):
                self.reasoning.append(reasoning)
            for call in delta.tool_calls or ():
                entry = self.calls.setdefault(call.index, {
                    "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                entry["id"] = call.id or entry["id"]
                if call.function is not None:
                    entry["function"]["name"] += call.function.name or ""
                    entry["function"]["arguments"] += call.function.arguments or ""

    def result(self) -> tuple[list[Any], Any, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return [message], self.usage, self.model


class _ResponseEvents:
    """Keeps the final response of a streamed Responses call."""

    def __init__(self) -> None:
        self.response: Any = None

    def add(self, event: Any) -> None:
        if getattr(event, "type", "") in ("response.completed", "response.incomplete",
                                          "response.failed"):
            self.response = event.response

    def result(self) -> tuple[list[Any], Any, Any] | None:
        return _responses_response(self.response) if self.response is not None else None


class _MessageEvents:
    """Reassembles a streamed Anthropic message from its raw events."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, str] = {}
        self.usage: dict[str, Any] = {}
        self.model: Any = None
        self.done = False

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", "")
        if kind == "message_start":
            self.model = event.message.model
            self.usage.update(_dump(event.message.usage) or {})
        elif kind == "content_block_start":
            self.blocks[event.index] = dict(_dump(event.content_block))
        elif kind == "content_block_delta":
            self._delta(event.index, event.delta)
        elif kind == "content_block_stop" and event.index in self.partial:
            raw = self.partial.pop(event.index)
            self.blocks[event.index]["input"] = json.loads(raw) if raw else {}
        elif kind == "message_delta":
            self.usage.update({k: v for k, v in (_dump(event.usage) or {}).items()
                               if v is not None})
        elif kind == "message_stop":
            self.done = True

    def _delta(self, index: int, delta: Any) -> None:
        block = self.blocks.setdefault(index, {})
        kind = getattr(delta, "type", "")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.text
        elif kind == "input_json_delta":
            self.partial[index] = self.partial.get(index, "") + delta.partial_json
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.thinking
        elif kind == "signature_delta":
            block["signature"] = delta.signature

    def result(self) -> tuple[list[Any], Any, Any] | None:
        if not self.done:
            return None
        content = [self.blocks[i] for i in sorted(self.blocks)]
        return [{"role": "assistant", "content": content}], self.usage, self.model


class _LoggedStream:
    """The SDK's stream, iterated through: reassembles the response, logs it at the end."""

    def __init__(self, stream: Any, collector: Any, prepared: _Prepared) -> None:
        self._stream = stream
        self._collector = collector
        self._prepared = prepared
        self._logged = False

    def _done(self) -> None:
        if self._logged:
            return
        self._logged = True
        outcome = self._collector.result()
        if outcome is not None:
            self._prepared.finish(*outcome)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    # sync
    def __iter__(self) -> _LoggedStream:
        return self

    def __next__(self) -> Any:
        try:
            item = self._stream.__next__()
        except StopIteration:
            self._done()
            raise
        self._collector.add(item)
        return item

    def __enter__(self) -> _LoggedStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stream.close()

    # async
    def __aiter__(self) -> _LoggedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self._stream.__anext__()
        except StopAsyncIteration:
            self._done()
            raise
        self._collector.add(item)
        return item

    async def __aenter__(self) -> _LoggedStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._stream.close()


class _LoggedStreamManager:
    """Anthropic's ``messages.stream(...)`` manager; logs the final message on exit."""

    def __init__(self, manager: Any, prepared: _Prepared) -> None:
        self._manager = manager
        self._prepared = prepared
        self._stream: Any = None

    def _done(self) -> None:
        try:
            snapshot = self._stream.current_message_snapshot
        except (AssertionError, AttributeError):
            return  # nothing received
        if snapshot is not None and snapshot.stop_reason is not None:
            self._prepared.finish(*_anthropic_response(snapshot))

    def __enter__(self) -> Any:
        self._stream = self._manager.__enter__()
        return self._stream

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self._done()
        self._manager.__exit__(*exc)

    async def __aenter__(self) -> Any:
        self._stream = await self._manager.__aenter__()
        return self._stream

    async def __aexit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self._done()
        await self._manager.__aexit__(*exc)


# ------------------------------------------------------------------ the proxies


_Reader = Callable[[Any], tuple[list[Any], Any, Any]]


def _is_async(client: Any) -> bool:
    return any(c.__name__ == "AsyncAPIClient" for c in type(client).__mro__)


def _wrap_create(session: Session, create: Callable[..., Any], is_async: bool, dialect: str,
                 key: str, pseudo_key: str | None, read: _Reader, collector: Callable[[], Any]
                 ) -> Callable[..., Any]:
    def deliver(prepared: _Prepared, response: Any, stream: bool) -> Any:
        if not session.record:
            return response
        if stream:
            return _LoggedStream(response, collector(), prepared)
        prepared.finish(*read(response))
        return response

    if is_async or inspect.iscoroutinefunction(inspect.unwrap(create)):
        async def acreate(**kwargs: Any) -> Any:
            prepared = _Prepared(session, dialect, key, kwargs, pseudo_key)
            response = await create(**await prepared.acompact())
            return deliver(prepared, response, bool(kwargs.get("stream")))
        return acreate

    def screate(**kwargs: Any) -> Any:
        prepared = _Prepared(session, dialect, key, kwargs, pseudo_key)
        response = create(**prepared.compact())
        return deliver(prepared, response, bool(kwargs.get("stream")))
    return screate


def _wrap_stream(session: Session, stream: Callable[..., Any]) -> Callable[..., Any]:
    def open_stream(**kwargs: Any) -> Any:
        prepared = _Prepared(session, "anthropic", "messages", kwargs, "system")
        manager = stream(**prepared.compact())
        return _LoggedStreamManager(manager, prepared) if session.record else manager
    return open_stream


class _Proxy:
    """``target`` with some attributes replaced; everything else passes through."""

    def __init__(self, target: Any, overrides: Mapping[str, Any]) -> None:
        self._target = target
        self._overrides = dict(overrides)

    def __getattr__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._target, name)


class CompactedClient:
    """An SDK client whose model calls send compacted contexts (see the module docstring).

    ``episode_id`` and ``group_id`` are settable; ``engines`` maps dialect names to the
    engines in use; ``unwrapped`` is the original client.
    """

    def __init__(self, client: Any, session: Session) -> None:
        self.unwrapped = client
        self.session = session
        s, a = session, _is_async(client)
        if hasattr(client, "chat") and hasattr(client, "responses"):  # OpenAI
            completions = client.chat.completions
            self.chat = _Proxy(client.chat, {"completions": _Proxy(completions, {
                "create": _wrap_create(s, completions.create, a, "openai_chat", "messages", None,
                                       _chat_response, _ChatChunks)})})
            self.responses = _Proxy(client.responses, {
                "create": _wrap_create(s, client.responses.create, a, "openai_responses",
                                       "input", "instructions", _responses_response,
                                       _ResponseEvents)})
        elif hasattr(client, "messages"):  # Anthropic
            messages = client.messages
            self.messages = _Proxy(messages, {
                "create": _wrap_create(s, messages.create, a, "anthropic", "messages", "system",
                                       _anthropic_response, _MessageEvents),
                "stream": _wrap_stream(s, messages.stream)})
        else:
            raise ConfigError(f"unsupported client {type(client).__name__}: expected an "
                              "openai or anthropic SDK client")

    @property
    def episode_id(self) -> str:
        return self.session.episode_id

    @episode_id.setter
    def episode_id(self, value: str) -> None:
        self.session.episode_id = value
        for engine in self.session.engines.values():
            engine.episode_id = value

    @property
    def group_id(self) -> str | None:
        return self.session.group_id

    @group_id.setter
    def group_id(self, value: str | None) -> None:
        self.session.group_id = value

    @property
    def engines(self) -> dict[str, Engine]:
        return self.session.engines

    def with_options(self, **options: Any) -> CompactedClient:
        """The client's ``with_options``, wrapped with the same engines and ids."""
        return CompactedClient(self.unwrapped.with_options(**options), self.session)

    def copy(self, **options: Any) -> CompactedClient:
        """The client's ``copy``, wrapped with the same engines and ids."""
        return CompactedClient(self.unwrapped.copy(**options), self.session)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.unwrapped, name)

    def __enter__(self) -> CompactedClient:
        self.unwrapped.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unwrapped.__exit__(*exc)

    async def __aenter__(self) -> CompactedClient:
        await self.unwrapped.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.unwrapped.__aexit__(*exc)


def compact(client: Any, *, engine: Engine | Mapping[str, Any] | None = None,
            episode_id: str | None = None, group_id: str | None = None, record: bool = True,
            plugins: pluggy.PluginManager | None = None, **engine_kwargs: Any
            ) -> CompactedClient:
    """Wrap an ``openai`` or ``anthropic`` SDK client (sync or async).

    :param engine: an :class:`~agentcompact.Engine` (used for its own dialect; engines for the
        client's other endpoints copy its strategy and budget), or ``Engine`` keyword
        arguments; or give them directly (``trigger_tokens=60000``).
    :param episode_id: / :param group_id: stamped on logged calls (default: a fresh episode).
    :param record: fire ``agentcompact_log_model_call`` for each call (default true).
    :param plugins: the plugin manager for engines and logging (default: the global one).
    """
    session = Session(engine, episode_id=episode_id, group_id=group_id, record=record,
                      plugins=plugins, engine_kwargs=engine_kwargs)
    return CompactedClient(client, session)
