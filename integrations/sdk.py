"""Wrap an OpenAI or Anthropic SDK client so every model call sends the compacted context.

Install with ``pip install agentcompact[sdk]``. One line::

    client = agentcompact.integrations.sdk.compact(OpenAI(...), budget=Budget(60000))

Every call path that sends a context goes through the engine, sync and async clients alike,
directly and through ``with_raw_response`` / ``with_streaming_response``:

- ``openai.OpenAI`` / ``AsyncOpenAI``: ``chat.completions.create`` / ``parse`` / ``stream``
  (dialect ``openai_chat``), ``responses.create`` / ``parse`` / ``stream`` / ``compact`` and
  ``responses.input_tokens.count`` (``openai_responses``; a string ``input`` and requests
  chained with ``previous_response_id`` pass through, the server holding the history), and
  the same under ``beta``;
- ``anthropic.Anthropic`` / ``AsyncAnthropic``: ``messages.create`` / ``parse`` / ``stream``
  / ``count_tokens`` (dialect ``anthropic``), and the same under ``beta.messages``.

The budget counts what the model receives: the messages, and the request's ``system`` /
``instructions`` and ``tools`` (the engine's ``fixed_tokens``). Methods of these resources
that send no context (``retrieve``, ``list``, ``delete``, ...) pass through; those whose
context cannot be compacted here (``messages.batches.create``, ``beta.messages.tool_runner``
and ``thread``, ``responses.connect``) raise :class:`~agentcompact.errors.ConfigError`, and
so does any method the wrapper does not know (a newer SDK's), rather than pass it through
uncompacted: call it on ``client.unwrapped``.

Each model call fires ``agentcompact_log_model_call`` with the exact messages sent, the
response (streams are rebuilt by the proxy's reassembler as the caller iterates), usage,
the serving engine's ``logprobs`` / ``token_ids`` / ``prompt_token_ids`` when it returned
them, and the client's ``episode_id`` / ``group_id`` (settable attributes). A recording
failure is logged, never raised into the caller's call or stream.
"""

from __future__ import annotations

import inspect
import logging
import operator
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import pluggy

from agentcompact import CompactionResult, Engine, ModelCall, log_model_call
from agentcompact.extending import new_id
from agentcompact.wire import Reassembled, from_body, reassembler

from ..errors import ConfigError, DialectError
from ._options import engine_from_options
from ._requests import MessageCopies, json_safe
from ._requests import RequestShape as _Endpoint

__all__ = ["CompactedClient", "Session", "compact"]

log = logging.getLogger("agentcompact.sdk")

_REQUEST_KEYS = (
    "model", "system", "instructions", "tools", "tool_choice", "temperature", "top_p", "top_k",
    "max_tokens", "max_completion_tokens", "max_output_tokens", "reasoning", "reasoning_effort",
    "thinking", "response_format", "text", "stop", "stop_sequences", "seed", "logprobs",
    "top_logprobs",
)
_PARSED_KEYS = frozenset({"parsed", "parsed_output"})  # added by the SDK's parse helpers


def _given(value: Any) -> bool:
    return value is not None and type(value).__name__ not in ("NotGiven", "Omit")


_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any) -> Any:
    """``value`` with SDK model objects turned into dicts (the same object when none)."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, dict):
        out: dict[Any, Any] | None = None
        for key, item in value.items():
            plain = _plain(item)
            if plain is not item:
                if out is None:
                    out = dict(value)
                out[key] = plain
        return value if out is None else out
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        if isinstance(value, list) and all(map(operator.is_, items, value)):
            return value
        return items
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    return value


def _dump(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else value


def _unparsed(value: Any, depth: int = 0) -> Any:
    """``value`` without the ``parsed`` fields the SDK's parse helpers add (not sent by the
    server, so not part of the recorded response)."""
    if depth > 3:
        return value
    if isinstance(value, dict):
        return {k: _unparsed(v, depth + 1) for k, v in value.items() if k not in _PARSED_KEYS}
    if isinstance(value, list):
        return [_unparsed(v, depth + 1) for v in value]
    return value


def _request_fields(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    fields = {key: _plain(kwargs[key]) for key in _REQUEST_KEYS if _given(kwargs.get(key))}
    return json_safe(fields)  # type: ignore[no-any-return]  # JSON round trip


class Session:
    """What a wrapped client shares: one engine per dialect, the ids, the plugin manager.

    Engine options are checked here, when the client is wrapped: the engine of the
    client's first dialect is built at once.
    """

    def __init__(self, engine: Engine | Mapping[str, Any] | None, *, episode_id: str | None,
                 group_id: str | None, record: bool, plugins: pluggy.PluginManager | None,
                 engine_kwargs: dict[str, Any]) -> None:
        if isinstance(engine, Engine):
            if engine_kwargs:
                raise ConfigError("compact: give engine= or engine options, not both")
            self._template: Engine | None = engine
            self._kwargs: dict[str, Any] = {}
        elif engine is None or isinstance(engine, Mapping):
            self._template = None
            self._kwargs = {**dict(engine or {}), **engine_kwargs}
            self._kwargs.pop("dialect", None)
        else:
            raise ConfigError(f"compact: engine must be an Engine or a dict of Engine options, "
                              f"got {type(engine).__name__}")
        if not isinstance(record, bool):
            raise ConfigError(f"compact: record must be a bool, got {type(record).__name__}")
        self.engines: dict[str, Engine] = {}
        if isinstance(engine, Engine):
            self.engines[engine.dialect.name] = engine
        self.pm = plugins if plugins is not None else (
            engine.pm if isinstance(engine, Engine) else None)
        self.episode_id = episode_id or new_id()
        self.group_id = group_id
        self.policy_version = 0
        self.record = record
        #: each message as a plain dict, and as a JSON-safe copy for the log, converted once
        self.plain_messages = MessageCopies(_plain)
        self.safe_messages = MessageCopies(json_safe)
        self.lock = threading.Lock()

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
                found = engine_from_options(dialect, self._kwargs, plugins=self.pm,
                                            episode_id=self.episode_id, owner="compact")
            self.engines[dialect] = found
        return found

    def log(self, dialect: str, messages: list[Any], got: Reassembled,
            kwargs: Mapping[str, Any], result: CompactionResult | None) -> None:
        with self.lock:
            safe = self.safe_messages(messages)
        call = ModelCall(
            episode_id=self.episode_id, dialect=dialect, messages=safe,
            response=json_safe(_unparsed(got.response)), request=_request_fields(kwargs),
            usage=json_safe(got.usage or {}), model=str(got.model) if got.model else None,
            compacted=bool(result is not None and result.modified), group_id=self.group_id,
            policy_version=self.policy_version, **got.model_call_fields(),
        )
        log_model_call(call, self.pm)


# ------------------------------------------------------------------ the call paths


_CHAT = _Endpoint("openai_chat", "messages", ("tools",))
_RESPONSES = _Endpoint("openai_responses", "input", ("instructions", "tools"))
_MESSAGES = _Endpoint("anthropic", "messages", ("system", "tools"))

#: What each method of a wrapped resource does: ``call`` (compacted, recorded), ``stream``
#: (the SDK's stream helper: compacted, recorded on exit), ``count`` (compacted, not a
#: model call: not recorded), ``pass`` (sends no context), a string (refused: the reason),
#: or a nested table (a sub-resource).
_Table = dict[str, Any]
_BATCHES_REFUSED = ("a batch's requests are not compacted by agentcompact; compact each "
                    "request's messages with an Engine, or call it on client.unwrapped")
_BATCHES: _Table = {"create": _BATCHES_REFUSED, "cancel": "pass", "delete": "pass",
                    "list": "pass", "results": "pass", "retrieve": "pass"}
_TABLES: dict[str, _Table] = {
    "chat.completions": {
        "create": "call", "parse": "call", "stream": "stream", "delete": "pass",
        "list": "pass", "retrieve": "pass", "update": "pass", "messages": "pass"},
    "responses": {
        "create": "call", "parse": "call", "stream": "stream", "compact": "count",
        "cancel": "pass", "delete": "pass", "retrieve": "pass", "input_items": "pass",
        "input_tokens": {"count": "count"},
        "connect": "a realtime connection's context is not compacted by agentcompact; call "
                   "it on client.unwrapped"},
    "messages": {
        "create": "call", "parse": "call", "stream": "stream", "count_tokens": "count",
        "batches": _BATCHES,
        "tool_runner": "tool_runner calls the unwrapped client; run the tool loop with "
                       "messages.create / stream on the wrapped client",
        "thread": "a server-held thread's context is not compacted by agentcompact; send "
                  "the history with messages.create on the wrapped client"},
}
_ENDPOINTS = {"chat.completions": _CHAT, "responses": _RESPONSES, "messages": _MESSAGES}


def _is_async(client: Any) -> bool:
    return any(c.__name__ == "AsyncAPIClient" for c in type(client).__mro__)


class _Prepared:
    """A request with its messages compacted; ``finish`` logs the response."""

    def __init__(self, session: Session, endpoint: _Endpoint, kwargs: dict[str, Any]) -> None:
        self.session, self.endpoint, self.kwargs = session, endpoint, kwargs
        self.result: CompactionResult | None = None
        self.messages: list[Any] | None = None
        native: Any = kwargs.get(endpoint.key)
        if _given(native) and not isinstance(native, (str, list, tuple)):
            if not hasattr(native, "__iter__") or isinstance(native, (bytes, Mapping)):
                raise DialectError(f"{endpoint.dialect}: {endpoint.key} is "
                                   f"{type(native).__name__}, not a list of messages")
            native = list(native)  # the SDKs take any iterable: read it once, here
            self.kwargs = kwargs = {**kwargs, endpoint.key: native}
        self.active = isinstance(native, (list, tuple)) and not _given(
            kwargs.get("previous_response_id"))
        if self.active and isinstance(native, (list, tuple)):
            with session.lock:
                self.native = session.plain_messages(native)
            for i, message in enumerate(self.native):
                if not isinstance(message, dict):
                    raise DialectError(f"{endpoint.dialect}: {endpoint.key}[{i}] is "
                                       f"{type(message).__name__}, not a message (a dict or an "
                                       "SDK model)")

    def _fixed(self, engine: Engine) -> int:
        body = {k: _plain(self.kwargs[k]) for k in self.endpoint.fixed
                if _given(self.kwargs.get(k))}
        return engine.fixed_tokens(body) if body else 0

    def apply(self, result: CompactionResult) -> dict[str, Any]:
        self.result = result
        self.messages = result.messages
        # send exactly what is logged: SDK objects in the history go out as their dicts
        return {**self.kwargs, self.endpoint.key: result.messages}

    def compact(self) -> dict[str, Any]:
        if not self.active:
            return self.kwargs
        engine = self.session.engine(self.endpoint.dialect)
        return self.apply(engine.compact(self.native, fixed_tokens=self._fixed(engine)))

    async def acompact(self) -> dict[str, Any]:
        if not self.active:
            return self.kwargs
        engine = self.session.engine(self.endpoint.dialect)
        return self.apply(await engine.acompact(self.native, fixed_tokens=self._fixed(engine)))

    def finish(self, got: Reassembled | None) -> None:
        """Log the call with its response; a failure is logged, never raised."""
        if got is None or not self.session.record:
            return
        try:
            sent = self.messages if self.messages is not None else self.kwargs.get(
                self.endpoint.key)
            if isinstance(sent, str):
                sent = [{"role": "user", "content": sent}]
            sent = sent if isinstance(sent, list) and self.messages is not None else _plain(sent)
            self.session.log(self.endpoint.dialect, list(sent or []), got, self.kwargs,
                             self.result)
        except Exception as exc:  # recording must never break the caller's call
            log.error("agentcompact: recording a %s call failed: %s", self.endpoint.dialect,
                      type(exc).__name__)

    def finish_object(self, response: Any, sampled: Reassembled | None = None) -> None:
        """Log a parsed SDK response object; ``sampled``: the sampled-token fields read
        from the raw chunks of a stream helper (its snapshot keeps only the first chunk's)."""
        if not self.session.record:
            return
        try:
            got = from_body(self.endpoint.dialect, _dump(response))
        except Exception as exc:
            log.error("agentcompact: reading a %s response failed: %s", self.endpoint.dialect,
                      type(exc).__name__)
            return
        if sampled is not None:
            got.prompt_token_ids = sampled.prompt_token_ids
            got.token_ids, got.logprobs = sampled.token_ids, sampled.logprobs
            got.token_bytes = sampled.token_bytes
        self.finish(got)


class _LoggedStream:
    """The SDK's stream, iterated through: each event goes to the shared reassembler (as
    its wire dict), and the rebuilt response is logged when the stream ends."""

    def __init__(self, stream: Any, prepared: _Prepared) -> None:
        self._stream = stream
        self._prepared = prepared
        self._collector = reassembler(prepared.endpoint.dialect)
        self._logged = False

    def _add(self, item: Any) -> None:
        try:
            self._collector.add(_dump(item))
        except Exception as exc:  # never raised into the caller's stream
            log.error("agentcompact: reading a %s stream event failed: %s",
                      self._prepared.endpoint.dialect, type(exc).__name__)

    def _done(self) -> None:
        if self._logged:
            return
        self._logged = True
        got = self._collector.result()
        if got.complete:
            self._prepared.finish(got)

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
        self._add(item)
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
        self._add(item)
        return item

    async def __aenter__(self) -> _LoggedStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._stream.close()


def _final_snapshot(stream: Any, dialect: str) -> Any:
    """The SDK stream helper's final response, or ``None`` when the stream did not end."""
    if dialect == "anthropic":
        snapshot = stream.current_message_snapshot
        return snapshot if snapshot.stop_reason is not None else None
    if dialect == "openai_chat":
        snapshot = stream.current_completion_snapshot
        choices = snapshot.choices or ()
        return snapshot if choices and choices[0].finish_reason is not None else None
    state = getattr(stream, "_state", None)  # ResponseStream keeps it there, public or not
    return getattr(state, "_completed_response", None)


class _Tap:
    """A raw SDK stream (sync or async) that also hands each chunk to a reassembler."""

    def __init__(self, raw: Any, collector: Any) -> None:
        self._raw = raw
        self._collector = collector

    def _seen(self, item: Any) -> Any:
        try:
            self._collector.add(_dump(item))
        except Exception as exc:  # never raised into the caller's stream
            log.error("agentcompact: reading a stream chunk failed: %s", type(exc).__name__)
        return item

    def __iter__(self) -> Iterator[Any]:
        return (self._seen(item) for item in self._raw)

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for item in self._raw:
            yield self._seen(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _LoggedStreamManager:
    """A context manager the SDK returns without a request sent yet: a stream helper's
    (``messages.stream(...)``, ``chat.completions.stream``, ``responses.stream``) or a
    ``with_streaming_response`` call's. The context is compacted on entering (awaiting an
    async strategy in ``async with``); a stream helper's own final snapshot is logged on a
    clean exit."""

    def __init__(self, method: Callable[..., Any], prepared: _Prepared, record: bool) -> None:
        self._method = method
        self._prepared = prepared
        self._record = record
        self._manager: Any = None
        self._stream: Any = None
        self._tap: Any = None

    def _done(self) -> None:
        if not self._record:
            return
        dialect = self._prepared.endpoint.dialect
        try:
            final = _final_snapshot(self._stream, dialect)
        except (AssertionError, AttributeError, RuntimeError):
            return  # nothing received
        if final is not None:
            self._prepared.finish_object(final, self._tap.result() if self._tap else None)

    def _tapped(self, stream: Any) -> Any:
        """Chat Completions: read every raw chunk the helper reads (its snapshot merges the
        deltas but drops later chunks' vLLM ``token_ids``), for the sampled-token fields."""
        raw = getattr(stream, "_raw_stream", None)
        if self._record and self._prepared.endpoint is _CHAT and raw is not None:
            self._tap = reassembler(_CHAT.dialect)
            stream._raw_stream = _Tap(raw, self._tap)
        return stream

    def __enter__(self) -> Any:
        self._manager = self._method(**self._prepared.compact())
        self._stream = self._tapped(self._manager.__enter__())
        return self._stream

    def __exit__(self, *exc: Any) -> Any:
        if exc[0] is None:
            self._done()
        return self._manager.__exit__(*exc)

    async def __aenter__(self) -> Any:
        self._manager = self._method(**await self._prepared.acompact())
        self._stream = self._tapped(await self._manager.__aenter__())
        return self._stream

    async def __aexit__(self, *exc: Any) -> Any:
        if exc[0] is None:
            self._done()
        return await self._manager.__aexit__(*exc)


def _deliver(prepared: _Prepared, response: Any, kind: str, mode: str, stream: bool) -> Any:
    if not prepared.session.record or kind == "count":
        return response
    if mode == "raw":
        if not stream:  # parse() caches: the caller's own parse() gets the same object
            prepared.finish_object(response.parse())
        return response  # a raw stream is the caller's to read: not recorded
    if stream:
        return _LoggedStream(response, prepared)
    prepared.finish_object(response)
    return response


async def _adeliver(prepared: _Prepared, response: Any, kind: str, mode: str, stream: bool
                    ) -> Any:
    if mode == "raw" and not stream and prepared.session.record and kind != "count":
        parsed = response.parse()  # async in anthropic's AsyncAPIResponse
        prepared.finish_object(await parsed if inspect.isawaitable(parsed) else parsed)
        return response
    return _deliver(prepared, response, kind, mode, stream)


def _wrap_call(session: Session, endpoint: _Endpoint, method: Callable[..., Any], kind: str,
               mode: str, is_async: bool) -> Callable[..., Any]:
    if (kind == "stream" and mode == "plain") or mode == "streaming":
        # a context manager, returned before anything is sent
        record = session.record and mode == "plain"

        def open_manager(**kwargs: Any) -> Any:
            return _LoggedStreamManager(method, _Prepared(session, endpoint, kwargs), record)
        return open_manager

    if is_async or inspect.iscoroutinefunction(inspect.unwrap(method)):
        async def acall(**kwargs: Any) -> Any:
            prepared = _Prepared(session, endpoint, kwargs)
            response = await method(**await prepared.acompact())
            return await _adeliver(prepared, response, kind, mode, kwargs.get("stream") is True)
        return acall

    def call(**kwargs: Any) -> Any:
        prepared = _Prepared(session, endpoint, kwargs)
        response = method(**prepared.compact())
        return _deliver(prepared, response, kind, mode, kwargs.get("stream") is True)
    return call


class _Resource:
    """A wrapped SDK resource: each attribute is compacted, passed through or refused,
    according to its table; an attribute not in the table is refused."""

    def __init__(self, target: Any, table: _Table, session: Session, endpoint: _Endpoint,
                 path: str, is_async: bool, mode: str = "plain") -> None:
        self._target, self._table, self._session = target, table, session
        self._endpoint, self._path, self._async, self._mode = endpoint, path, is_async, mode

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return getattr(self._target, name)
        if name in ("with_raw_response", "with_streaming_response") and self._mode == "plain":
            mode = "raw" if name == "with_raw_response" else "streaming"
            return _Resource(getattr(self._target, name), self._table, self._session,
                             self._endpoint, f"{self._path}.{name}", self._async, mode)
        what = self._table.get(name)
        if what is None:
            raise ConfigError(
                f"{self._path}.{name} is not known to agentcompact's SDK wrapper, so it is "
                "refused rather than sent uncompacted; call it on client.unwrapped")
        if isinstance(what, dict):
            return _Resource(getattr(self._target, name), what, self._session,
                             self._endpoint, f"{self._path}.{name}", self._async, self._mode)
        if what == "pass":
            return getattr(self._target, name)
        if what in ("call", "stream", "count"):
            return _wrap_call(self._session, self._endpoint, getattr(self._target, name), what,
                              self._mode, self._async)
        raise ConfigError(f"{self._path}.{name}: {what}")

    def __dir__(self) -> list[str]:
        return sorted(self._table)


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
        a = _is_async(client)

        def resource(target: Any, name: str, path: str) -> _Resource:
            return _Resource(target, _TABLES[name], session, _ENDPOINTS[name], path, a)

        if hasattr(client, "chat") and hasattr(client, "responses"):  # OpenAI
            session.engine("openai_chat")  # options checked now, not at the first call
            self.chat = _Proxy(client.chat, {"completions": resource(
                client.chat.completions, "chat.completions", "chat.completions")})
            self.responses = resource(client.responses, "responses", "responses")
            beta = getattr(client, "beta", None)
            if beta is not None:
                over: dict[str, Any] = {}
                if hasattr(beta, "chat"):
                    over["chat"] = _Proxy(beta.chat, {"completions": resource(
                        beta.chat.completions, "chat.completions", "beta.chat.completions")})
                if hasattr(beta, "responses"):
                    over["responses"] = resource(beta.responses, "responses", "beta.responses")
                self.beta = _Proxy(beta, over)
        elif hasattr(client, "messages"):  # Anthropic
            session.engine("anthropic")
            self.messages = resource(client.messages, "messages", "messages")
            beta = getattr(client, "beta", None)
            if beta is not None and hasattr(beta, "messages"):
                self.beta = _Proxy(beta, {"messages": resource(beta.messages, "messages",
                                                               "beta.messages")})
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
            engine.new_episode(value)

    @property
    def group_id(self) -> str | None:
        return self.session.group_id

    @group_id.setter
    def group_id(self, value: str | None) -> None:
        self.session.group_id = value

    @property
    def policy_version(self) -> int:
        """The version of the weights serving this client (RL: the training loop sets it
        after each update), recorded on every ``ModelCall`` and on the summaries of a
        trained summarizer of its engines."""
        return self.session.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        self.session.policy_version = int(value)
        for engine in self.session.engines.values():
            summarizer = getattr(engine.strategy, "summarizer", None)
            if summarizer is not None and getattr(summarizer, "trained", False):
                summarizer.policy_version = int(value)

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
        arguments, given directly (``budget=Budget(trigger_tokens=60000)``, ``strategy=``
        a name or a :class:`StrategySettings`). Options are checked here: a bad one raises
        :class:`ConfigError` naming it.
    :param episode_id: / :param group_id: stamped on logged calls (default: a fresh episode).
    :param record: fire ``agentcompact_log_model_call`` for each call (default true).
    :param plugins: the plugin manager for engines and logging (default: the global one).
    """
    session = Session(engine, episode_id=episode_id, group_id=group_id, record=record,
                      plugins=plugins, engine_kwargs=engine_kwargs)
    return CompactedClient(client, session)
