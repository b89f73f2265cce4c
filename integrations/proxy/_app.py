"""The compaction proxy as a Starlette app.

``create_app(config)`` returns an ASGI app that harnesses point their base URL at. For
``POST`` to ``/v1/messages`` (Anthropic), ``…/chat/completions`` (OpenAI Chat) and any path
ending in ``/responses`` (OpenAI Responses, incl. Codex's ChatGPT backend) it compacts the
request's messages with an engine of that dialect, then forwards; every other request
passes through untouched. Only request bodies are rewritten: responses (SSE included) are
relayed as they arrive.

Per request, in plain steps (``CompactionProxy.handle``), each a function of explicit,
frozen values: **receive** the body (a large one that may stay under the trigger is sent
on upstream as it arrives, held by its last byte: ``_hold``) → **prepare** (``_prepare``:
``_parse`` gives a ``_Request`` — the body parsed, its session, its engine —; ``_decide``
lets the session's engine compact, off the event loop when the body is large; ``_outgoing``
gives the ``_Outgoing``: the original bytes unless the history changed, else the engine's
encoded, or a strict-mode refusal) → **send** (``_send_out`` gives the ``_Sent``: completes
the held request or sends anew; on a context-length error ``_reactive`` compacts harder and
replays once) → **record** the log line and counters and **relay** the answer (``_answer``;
with ``--record``, the model call with the reassembled response at the stream's end; a
request completed upstream before the engine measured it is measured and recorded once
the answer's first chunk is relayed). Any failure before sending forwards the original
bytes (fail-open).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sized
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio
import orjson
import pluggy
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentcompact import (
    SINGLE_TENANT,
    Budget,
    CompactionResult,
    Dialect,
    Engine,
    InMemoryPrefixStore,
    ModelCall,
    PrefixStore,
    Tenant,
    __version__,
    log_model_call,
)
from agentcompact.extending import MessageMeter, make_counter
from agentcompact.plugins import get_plugin_manager, registry
from agentcompact.wire import Reassembled

from ._bodies import BodyCache, Common, Parsed, encode
from ._config import ProxyConfig
from ._observe import DebugDumper, ExchangeLog, ProxyStats
from ._offloop import EngineLoop, does_io
from ._recording import Recording, RecordingThread
from ._relay import WATCH_KEY, BufferedResponse, ClientWatch, RelayResponse, until_disconnect
from ._speculation import Speculation
from ._tenancy import Tenancy
from ._upstream import (
    HeldRequest,
    UpstreamClient,
    UpstreamDropped,
    UpstreamError,
    UpstreamResponse,
)
from ._wire import (
    ANTHROPIC,
    CHAT,
    GEMINI,
    RESPONSES,
    dialect_for,
    error_body,
    is_context_error,
    is_probe,
    request_headers,
    session_key,
    upstream_of,
)

if TYPE_CHECKING:  # the gateway needs the export extra (numpy, pyarrow): imported on use
    from ._gateway import GatewayConfig, RLGateway

__all__ = ["CompactionProxy", "ProxyApp", "create_app"]

log = logging.getLogger("agentcompact.proxy")

#: a request needing to parse more than this many bytes, or with a body this large and a
#: compaction likely, is parsed and compacted in a worker thread (the event loop keeps
#: relaying other streams); a session's next turn is parsed and measured in place
_OFFLOOP_BYTES = 128 * 1024
#: per-session message cache of the token meter (bounds memory held per engine)
_METER_ENTRIES = 8192
#: a dialect request whose declared body is at least this large is started upstream while
#: its body arrives (``_hold``): below it the body's trip to the upstream is negligible
_HOLD_BYTES = 64 * 1024
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_STATUS_PATH = "/agentcompact/status"


@dataclass(frozen=True, slots=True)
class _Request:
    """A dialect request as parsed (the first half of *prepare*): what the engine decides
    on."""

    dialect: str
    raw: bytes
    body: dict[str, Any]
    parsed: Parsed
    messages: list[Any]
    session: str | None
    probe: bool
    #: the session's engine; ``None`` when there is nothing to compact (a probe, no
    #: messages, a continuation by ``previous_response_id``)
    engine: Engine | None
    #: whose request it is (``_tenancy``): its session and engine are the tenant's
    tenant: Tenant = SINGLE_TENANT


@dataclass(frozen=True, slots=True)
class _Outgoing:
    """A prepared request (what *prepare* gives *send*): the bytes to send upstream and
    the messages they carry, or the proxy's own refusal, and what the log line says of
    the preparation."""

    dialect: str
    path: str
    raw: bytes
    #: the body to send: ``raw`` itself (the very object) when it goes unchanged
    content: bytes
    #: ``None``: the body did not parse (it goes upstream as received)
    request: _Request | None
    result: CompactionResult | None = None
    #: the messages ``content`` carries (what ``--record`` logs as the model call's)
    messages: list[Any] | None = None
    refusal: BufferedResponse | None = None
    #: the engine's history differs from the client's (in shadow mode: would have)
    modified: bool = False
    error: str | None = None
    fallback: str | None = None
    fail_open: bool = False
    retried: bool = False
    #: the engine's decision still to make, on a body certified unchanged and already
    #: complete upstream (``_prepare``): gives the final ``_Outgoing`` (``_measured``)
    later: Callable[[], _Outgoing] | None = None

    @property
    def unchanged(self) -> bool:
        """The client's own body goes upstream (a held request may complete)."""
        return self.content is self.raw and self.refusal is None


@dataclass(frozen=True, slots=True)
class _Sent:
    """What *send* did: the answer whose head is in (or the proxy's own), what became of
    the held request, and the time spent before sending."""

    response: UpstreamResponse | BufferedResponse
    held: str | None
    added_ms: float


class EnginePool:
    """One engine per (dialect, session), LRU-bounded, all sharing one prefix store and one
    token counter. Per-session engines keep each session's token cache and digest chain
    apart and stamp its compaction events with the session as ``episode_id``."""

    def __init__(self, config: ProxyConfig, pm: pluggy.PluginManager, store: PrefixStore) -> None:
        self.config, self.pm, self.store = config, pm, store
        self.budget = config.budget
        self.counter = make_counter(config.counter)
        reg = registry(pm)
        reg.strategy_factory(config.strategy_settings.name)  # unknown: ConfigError at start-up
        self.dialects: dict[str, Dialect] = {d: reg.dialect(d) for d in (ANTHROPIC, CHAT,
                                                                          RESPONSES, GEMINI)}
        self._engines: OrderedDict[tuple[str, str], Engine] = OrderedDict()
        #: a session's own budget (the RL gateway's per-group trigger), else ``budget``
        self.budget_of: Callable[[str, Budget], Budget] | None = None
        #: tokens each engine sent last time (to tell a quiet request from a likely cliff)
        self.sent_tokens: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        #: what the proxy can know about its engines before they measure (token bounds)
        self.speculation = Speculation()
        self.is_async = hasattr(self._new(ANTHROPIC, "startup").strategy, "acompact")

    def get(self, dialect: str, session: str, tenant: Tenant = SINGLE_TENANT) -> Engine:
        """The session's engine (``session`` already scoped by ``tenant``: ``session_key``);
        a new one archives into the tenant's view of the archive."""
        key = (dialect, session)
        with self._lock:
            engine = self._engines.pop(key, None)
            if engine is None:
                engine = self._new(dialect, session, tenant)
            self._engines[key] = engine
            while len(self._engines) > self.config.max_sessions:
                self._engines.popitem(last=False)
            return engine

    def quiet(self, engine: Engine, new_bytes: int) -> bool:
        """True when ``engine`` cannot be expected to compact on a request adding
        ``new_bytes`` bytes to its last one: measuring the new messages is then all it
        does."""
        last = self.sent_tokens.get(engine)
        return last is not None and self.stays_under(last, new_bytes)

    def stays_under(self, tokens: int, new_bytes: int) -> bool:
        """The guess that a body of ``tokens`` grown by ``new_bytes`` bytes stays within
        the trigger: a token is at least two bytes of JSON here, on the safe side. A
        guess, not a bound (images count more): it only decides where work is done."""
        return tokens + new_bytes // 2 <= self.budget.trigger

    def may_stay_under(self, body_bytes: int) -> bool:
        """The guess, before a body is read, that a body of ``body_bytes`` bytes stays
        within the trigger: a token is about four bytes of JSON, three on the safe side.
        A guess only (it decides whether a body starts upstream before the engine
        decides: a wrong one costs a request dropped unfinished, never a wrong body)."""
        return body_bytes // 3 <= self.budget.trigger

    def _new(self, dialect: str, session: str, tenant: Tenant = SINGLE_TENANT) -> Engine:
        strategy = self.config.strategy_settings
        options = strategy.options or {}
        archive: Any = options.get("archive")
        if tenant.id and hasattr(archive, "for_tenant"):
            strategy = replace(strategy, options={**options, "archive": archive.for_tenant(tenant)})
        meter = MessageMeter(self.counter, self.dialects[dialect], max_entries=_METER_ENTRIES)
        budget = self.budget if self.budget_of is None else self.budget_of(session, self.budget)
        engine = Engine(strategy=strategy, dialect=self.dialects[dialect],
                        budget=budget, store=self.store, counter=meter,
                        plugins=self.pm, episode_id=session)
        return self.speculation.watch(engine, meter)


class CompactionProxy:
    """The proxy's state and request handling; ``create_app`` wraps it in an ASGI app."""

    def __init__(self, config: ProxyConfig, *, plugins: pluggy.PluginManager | None = None,
                 store: PrefixStore | None = None, gateway: GatewayConfig | None = None
                 ) -> None:
        self.pm = plugins if plugins is not None else get_plugin_manager()
        self.store = store if store is not None else _store(config.store_url())
        #: how requests are scoped into tenants (``_tenancy``)
        self.tenancy = Tenancy.of(config.tenancy, config.tenant_header, config.tenant_secret,
                                  shared_store=config.shares_store())
        #: the archive of dropped originals, beside the store or in ``--archive``'s file
        #: (``None``: the strategy keeps none); engines get their tenant's view of it
        self.archive = _archive(config, self.pm)
        if self.tenancy.mode != "single" and self.archive is not None and not hasattr(
                self.archive, "for_tenant"):
            log.warning("the archive (%s) has no for_tenant: what it keeps is not scoped "
                        "per tenant", type(self.archive).__name__)
        if self.archive is not None:
            config = config.with_strategy_options(archive=self.archive)
        self.config = config
        self.engines = EnginePool(config, self.pm, self.store)
        #: the engines read and write a file or a server: they never run on the event
        #: loop (``_offloop``), so a locked or slow store stalls no other session
        self.store_io = does_io(self.store) or does_io(
            self.archive if self.archive is not None
            else (config.strategy_settings.options or {}).get("archive"))
        self.engine_loop = EngineLoop()
        #: recent bodies with their parsed messages: a session's next request only parses
        #: what is new (and keeps the engine's per-message caches hitting, by identity)
        self.bodies = BodyCache(max_entries=config.max_sessions)
        self.stats = ProxyStats(config.max_sessions)
        self.dumper = DebugDumper(config.debug_dir) if config.debug_dir else None
        #: the RL gateway (``--rl-tokenizer``): episodes, rewards, rows
        self.gateway: RLGateway | None = None
        if gateway is not None:
            from ._gateway import RLGateway

            self.gateway = RLGateway(gateway, config.budget.trigger, self.pm)
        #: where the recorder listens: the gateway's sinks see the events in order
        self._recorder_pm = self.gateway.sinks if self.gateway is not None else self.pm
        self.recorder = (_register_recorder(self._recorder_pm, config.record) if config.record
                         else None)
        #: where answers are decoded and reassembled to be logged (``--record``, the RL
        #: gateway): off the loop, in order
        self.recording = (RecordingThread() if config.record or self.gateway is not None
                          else None)
        self.client = UpstreamClient(config.connect_timeout, config.read_timeout)
        #: a dialect request declaring a body this large or larger is started upstream
        #: while its body arrives (``None``: never; see ``_hold``)
        self.hold_bytes: int | None = _HOLD_BYTES
        #: bodies that went upstream unchanged, with their tokens: a held request extending
        #: one of them may be completed before it is measured (``_release_if_bounded``)
        self._unchanged: weakref.WeakKeyDictionary[Parsed, tuple[int, int | None, int]] = (
            weakref.WeakKeyDictionary())
        self._speculation = self.engines.speculation
        if self.gateway is not None:
            self.hold_bytes = None  # its bodies change (token ids asked for): never held
            self.engines.budget_of = self.gateway.budget
        #: an engine's measuring of a request sent before it measured, while it runs in a
        #: worker thread (``_answer``): the session's next request waits for it
        self._measuring: weakref.WeakKeyDictionary[Engine, asyncio.Future[Any]] = (
            weakref.WeakKeyDictionary())

    # --- lifecycle ----------------------------------------------------------------
    async def aclose(self) -> None:
        """Close the upstream client and the recorder (the app's lifespan calls this)."""
        await self.client.aclose()
        self.engine_loop.close()
        if self.recording is not None:
            await anyio.to_thread.run_sync(self.recording.close)  # what is recorded yet
        if self.gateway is not None:
            self.gateway.close()  # the queued events are recorded first
        if self.recorder is not None and self._recorder_pm.is_registered(self.recorder):
            self._recorder_pm.unregister(self.recorder)
            close = getattr(self.recorder, "close", None)
            if close is not None:
                close()

    # --- routes -------------------------------------------------------------------
    async def status(self, request: Request) -> JSONResponse:
        c = self.config
        return JSONResponse(self.stats.snapshot(
            version=__version__, strategy=c.strategy_settings.name, trigger=c.budget.trigger,
            target=self.engines.budget.target, shadow=c.shadow, strict=c.strict,
            recording=c.record is not None,
            store_entries=len(self.store) if isinstance(self.store, Sized) else None,
            store=_store_status(self.store), archive=_store_status(self.archive),
            parse_reuse={"bodies": len(self.bodies), "hits": self.bodies.hits,
                         "partial_hits": self.bodies.partial_hits,
                         "misses": self.bodies.misses},
        ))

    async def handle(self, request: Request) -> Any:
        """One request, in plain steps: receive → prepare → send (→ the reactive retry) →
        record and relay."""
        t0 = time.perf_counter()
        self.stats.count_request()
        path = request.scope["path"]
        if request.method == "OPTIONS" and path in ("*", ""):
            # ``OPTIONS *`` asks the server itself (RFC 9110 §9.3.7): no upstream URL has it
            return BufferedResponse(204, [(b"allow", ", ".join(_METHODS).encode())], b"")
        dialect = dialect_for(path) if request.method == "POST" else None
        if dialect is None:
            return await self._passthrough(request, await request.body())
        held = await self._hold(request)
        common = self._common(request, dialect)
        try:
            raw = await _receive(request, held, common)
        except BaseException:
            if held is not None:
                held.abort()  # the client left (or failed) before its body was in
            raise
        out = self._for_gateway(await self._prepare(request, dialect, raw, held, common))
        sent = await self._send_out(request, out, held, t0)
        if out.later is not None and (isinstance(sent.response, BufferedResponse)
                                      or sent.response.status_code >= 300):
            out = out.later()  # no model answer to relay first
        if self._may_retry(out, sent.response):
            out, sent = await self._reactive(request, out, sent)
        return self._answer(out, sent)

    def _for_gateway(self, out: _Outgoing) -> _Outgoing:
        """With the RL gateway, a Chat Completions body asks for token ids and logprobs."""
        req = out.request
        if (self.gateway is None or req is None or out.refusal is not None
                or out.dialect != CHAT):
            return out
        return replace(out, content=self.gateway.ask_for_tokens(out.content, req.body))

    # --- receiving -----------------------------------------------------------------
    async def _hold(self, request: Request) -> HeldRequest | None:
        """Start the request upstream before its body is in, when the body is large
        enough for its trip to the upstream to matter and its declared length cannot
        plausibly reach the trigger: the body then crosses to the upstream as it arrives,
        held by its last byte until the engine has decided (``_send_out``). A request
        missing its last byte is one the upstream never acts on: a body the engine changes
        after all is dropped unfinished and the new one sent. The guess only decides what
        is faster; what is processed is always what the engine decided."""
        length, least = _declared_length(request), self.hold_bytes
        if (length is None or least is None or length < least
                or not self.engines.may_stay_under(length)):
            return None
        return await self.client.hold(request.method, self._upstream_url(request),
                                      request_headers(request.headers.raw), length)

    def _common(self, request: Request, dialect: str) -> Common | None:
        """For a large body, the comparison with the session's earlier body done as it
        arrives (``Common``): after its last byte only the last chunk's is left."""
        length = _declared_length(request)
        if length is None or length < _HOLD_BYTES:
            return None
        return self.bodies.common(self.engines.dialects[dialect].messages_key)

    # --- prepare: parse, decide, encode ----------------------------------------------
    async def _prepare(self, request: Request, dialect: str, raw: bytes,
                       held: HeldRequest | None = None, common: Common | None = None
                       ) -> _Outgoing:
        """The request to send: parse what is new, let the session's engine decide,
        encode only what changed. A step with much to do runs in a worker thread (the
        event loop keeps relaying other streams); a session's next turn is parsed and
        measured in place. Any failure forwards the original bytes (fail-open)."""
        path, headers = request.scope["path"], request.headers
        req: _Request | None = None
        try:
            in_place = self.engines.is_async  # an async strategy awaits on the loop
            match, new_bytes = self.bodies.lookup(raw, self.engines.dialects[dialect]
                                                  .messages_key, common)
            if not in_place and new_bytes > _OFFLOOP_BYTES:
                req = await anyio.to_thread.run_sync(self._parse, dialect, raw, headers, match)
                await self._measured_before(req)
            else:
                req = self._parse(dialect, raw, headers, match)
                await self._measured_before(req)
                if held is not None and match is not None and not in_place:
                    known = self._unchanged.get(match[0])
                    if self.store_io:  # reads the store's version: off the loop
                        await anyio.to_thread.run_sync(self._release_if_bounded, req, held,
                                                       known)
                    else:
                        self._release_if_bounded(req, held, known)
                    if held.released and self.dumper is None and req.engine is not None:
                        # the body is complete upstream and certified unchanged: the
                        # engine measures it once the answer's first chunk is relayed
                        same = self._outgoing(path, req, None, True)
                        return replace(same, later=functools.partial(self._measured, path,
                                                                     req))
            result, version = await self._decide(req, new_bytes)
            out = self._outgoing(path, req, result, held is not None and held.released)
            self._sent_unchanged(out, version)
        except Exception as exc:  # fail-open: the original bytes go upstream
            out = self._failed_open(path, dialect, raw, req, exc)
        if self.dumper is not None and out.request is not None:
            self._dump(out, headers)
        return out

    async def _measured_before(self, req: _Request) -> None:
        """Wait for the session engine's measuring of the previous request, if it runs
        still (``_answer``): what this request may skip depends on it."""
        pending = self._measuring.get(req.engine) if req.engine is not None else None
        if pending is not None and not pending.done():
            await asyncio.wait({pending})

    def _sent_unchanged(self, out: _Outgoing, version: int | None) -> None:
        """Remember a body that went upstream unchanged, with its tokens (a later held
        request extending it may be completed before it is measured)."""
        result, req = out.result, out.request
        if version is not None and out.unchanged and result is not None and req is not None:
            # the body as sent (the original: shadow mode may have computed another)
            self._unchanged[req.parsed] = (result.tokens_original, version, _fixed(req))

    def _measured(self, path: str, req: _Request) -> _Outgoing:
        """The engine's decision on a body sent before it measured (``_prepare``): its
        figures for the log line and the next request. A failure is reported, the body
        being upstream already."""
        try:
            result, version = self._compact(req)
            out = self._outgoing(path, req, result, True)
        except Exception as exc:
            log.warning("measuring a request sent early failed (%s) (session %s)",
                        type(exc).__name__, req.session)
            return _Outgoing(req.dialect, path, req.raw, req.raw, req, messages=req.messages,
                             error=f"{type(exc).__name__}: {exc}")
        self._sent_unchanged(out, version)
        return out

    def _prepare_here(self, path: str, dialect: str, raw: bytes, headers: Any) -> _Outgoing:
        """``_prepare`` on the calling thread, without a held request, for a sync
        strategy: the proxy's own work on one request (the benchmarks time it in
        process, without HTTP)."""
        key = self.engines.dialects[dialect].messages_key
        req = self._parse(dialect, raw, headers, self.bodies.lookup(raw, key)[0])
        result = self._compact(req)[0] if req.engine is not None else None
        return self._outgoing(path, req, result, False)

    def _failed_open(self, path: str, dialect: str, raw: bytes, req: _Request | None,
                     exc: Exception) -> _Outgoing:
        session = req.session if req is not None else None
        # no traceback: a chained exception could carry the history it was raised over
        log.warning("compaction failed (%s); forwarding the original request (session %s)",
                    type(exc).__name__, session)
        return _Outgoing(dialect, path, raw, raw, req,
                         messages=req.messages if req is not None else None,
                         error=f"{type(exc).__name__}: {exc}", fail_open=True)

    def _parse(self, dialect: str, raw: bytes, headers: Any, match: Any) -> _Request:
        """The body parsed (only what is new since the session's last body: ``match``),
        its session, and the engine to decide on it."""
        d = self.engines.dialects[dialect]
        parsed = self.bodies.parse(raw, d.messages_key, match)
        body = parsed.body
        if not isinstance(body, dict):
            raise TypeError(f"request body is a JSON {type(body).__name__}, not an object")
        messages = d.messages_of(body)
        tenant = self.tenancy.tenant(headers)
        session = session_key(d, body, headers, messages, tenant.id)
        if self.gateway is not None:
            session = self.gateway.session(headers, session)
        probe = is_probe(body)
        engine = (self.engines.get(dialect, session, tenant)
                  if not probe and messages and not body.get("previous_response_id") else None)
        return _Request(dialect, raw, body, parsed, messages, session, probe, engine, tenant)

    async def _decide(self, req: _Request, new_bytes: int
                      ) -> tuple[CompactionResult | None, int | None]:
        """The engine's result (``None``: nothing to compact) and, for a sync strategy,
        the prefix store's version read before it. A large body that may compact is
        compacted off the event loop; a quiet one (a session's next turn well under the
        trigger: measuring the new messages is all the engine does) in place."""
        engine = req.engine
        if engine is None:
            return None, None
        if self.engines.is_async:
            return await self._acompact(engine, req.messages, fixed_tokens=_fixed(req)), None
        if self.store_io or (len(req.raw) > _OFFLOOP_BYTES
                             and not self.engines.quiet(engine, new_bytes)):
            return await anyio.to_thread.run_sync(self._compact, req)
        return self._compact(req)

    async def _acompact(self, engine: Engine, messages: list[Any], **options: Any
                        ) -> CompactionResult:
        """``engine.acompact``: on the engine loop when the store does I/O (its calls
        are sync), else on this loop."""
        if self.store_io:
            return await self.engine_loop.run(lambda: engine.acompact(messages, **options))
        return await engine.acompact(messages, **options)

    def _compact(self, req: _Request) -> tuple[CompactionResult, int | None]:
        engine = req.engine
        assert engine is not None
        version = self._speculation.store_version(engine)  # before: a put may follow
        fixed = _fixed(req)
        result = engine.compact(req.messages, fixed_tokens=fixed)
        self.engines.sent_tokens[engine] = result.tokens_after
        return result, version

    def _release_if_bounded(self, req: _Request, held: HeldRequest,
                            known: tuple[int, int | None, int] | None) -> None:
        """Complete the held request before measuring when the engine is certain to leave
        the body unchanged: the messages it shares with the earlier body count what they
        counted then, the new ones at most their UTF-8 bytes (plus overheads), and no
        prefix was stored since (``Speculation.leaves_unchanged``). The upstream then works on
        the request while the engine tokenizes the new messages for its exact figures.
        ``known``: the earlier body went upstream unchanged: its tokens, the prefix
        store's version then, and its fixed tokens."""
        engine, parsed = req.engine, req.parsed
        if engine is None or known is None:
            return
        tokens, version, fixed = known
        if parsed.reused:  # the earlier body's messages, as counted
            new = self._speculation.token_bound(engine, req.messages[parsed.reused:])
            bound = None if new is None else tokens - fixed + new
        else:
            bound = self._speculation.token_bound(engine, req.messages)
        if bound is not None and self._speculation.leaves_unchanged(engine, bound + _fixed(req),
                                                                    version):
            held.release()

    def _outgoing(self, path: str, req: _Request, result: CompactionResult | None,
                  sent_early: bool) -> _Outgoing:
        """What goes upstream after the engine's ``result``: the client's own bytes unless
        the history changed (and not in shadow mode), else the engine's encoded; in strict
        mode a refusal for a request over the limit. ``sent_early``: the original body is
        upstream already (completed before the engine finished)."""
        same = _Outgoing(req.dialect, path, req.raw, req.raw, req, result, req.messages)
        if result is None:
            return same
        error, fallback = _failure(result)
        same = replace(same, modified=result.modified, error=error, fallback=fallback)
        self._warn(req, error, fallback)
        if self.config.strict and not self.config.shadow and (
                result.over_budget or result.tokens_after > self.engines.budget.limit):
            return replace(same, refusal=self._refuse(req.dialect, result))  # modified or not
        if self.config.shadow or not result.modified:
            if result.modified:
                log.info("shadow: would send %d tokens instead of %d (session %s)",
                         result.tokens_after, result.tokens_original, req.session)
            return same
        if sent_early:
            # cannot happen while Speculation.leaves_unchanged holds; the body is upstream
            log.error("a body sent before the engine finished was changed by it; "
                      "the original went upstream (session %s)", req.session)
            return replace(same, modified=False)
        return replace(same, content=self._encode(req, result.messages),
                       messages=result.messages)

    def _warn(self, req: _Request, error: str | None, fallback: str | None) -> None:
        """Warn once per session about a failed compaction, and about a trigger the
        client's fixed part leaves no room under."""
        if error is not None and self.stats.first_failure(req.session):
            log.warning("compaction failed in session %s (%s; fallback %s); later failures "
                        "of this session are in the log lines only", req.session, error,
                        fallback or "none")
        if req.engine is not None and self.stats.first_request(req.session):
            self._warn_fixed(req)

    def _warn_fixed(self, req: _Request) -> None:
        """Warn when the part of a request compaction cannot shrink (system prompt, tools,
        instruction items) takes half the trigger or more."""
        engine = req.engine
        assert engine is not None
        kept = [m for m in req.messages if _is_kept(engine.dialect, m)]
        fixed = _fixed(req) + (engine.count(kept) if kept else 0)
        trigger = self.engines.budget.trigger
        if fixed * 2 >= trigger:
            log.warning("trigger %d tokens is too small for this client: its fixed prompt "
                        "(system, tools, instructions) is %d tokens, which compaction keeps; "
                        "use --trigger %d or more (session %s)", trigger, fixed,
                        _round_up(fixed * 3), req.session)

    def _encode(self, req: _Request, messages: list[Any]) -> bytes:
        """The body to send with ``messages``: unchanged messages as the client's own bytes
        (no re-serialization), new ones encoded; in full for a dialect that rewrites more
        than the message list."""
        dialect = self.engines.dialects[req.dialect]
        if (req.parsed.messages is not None
                and type(dialect).with_messages is Dialect.with_messages):
            return encode(req.parsed, messages)
        return orjson.dumps(dialect.with_messages(req.body, messages))

    def _refuse(self, dialect: str, result: CompactionResult) -> BufferedResponse:
        limit = self.engines.budget.limit
        message = (f"prompt is too long: {result.tokens_after} tokens > {limit} maximum "
                   "(agentcompact strict mode: still over budget after compaction)")
        body = error_body(dialect, 400, message, code="context_length_exceeded")
        return BufferedResponse(400, [(b"content-type", b"application/json")],
                                orjson.dumps(body))

    def _dump(self, out: _Outgoing, headers: Any) -> None:
        req, result = out.request, out.result
        assert self.dumper is not None and req is not None
        outgoing = None
        if result is not None and result.modified and out.content is not out.raw:
            outgoing = orjson.loads(out.content)
        ex = self._exchange(out)
        summary = {"dialect": out.dialect, "session": req.session, "tenant": req.tenant.id,
                   "compacted": ex.compacted, "modified": ex.modified,
                   "tokens_in": ex.tokens_in, "tokens_out": ex.tokens_out,
                   "shadow": self.config.shadow, "error": ex.error}
        self.dumper.dump(req.session, out.path, headers, req.body, outgoing, summary)

    # --- send ------------------------------------------------------------------------
    def _upstream_url(self, request: Request) -> str:
        """The upstream URL: the path and query exactly as the client sent them."""
        scope = request.scope
        c, whose = self.config, upstream_of(scope["path"])
        base = (c.anthropic_upstream if whose == ANTHROPIC else
                c.gemini_upstream if whose == GEMINI else c.openai_upstream)
        raw_path = scope.get("raw_path")
        path = raw_path.decode("latin-1") if raw_path else quote(scope["path"])
        query = scope.get("query_string", b"").decode("latin-1")
        return f"{base}{path}?{query}" if query else f"{base}{path}"

    async def _send_out(self, request: Request, out: _Outgoing, held: HeldRequest | None,
                        t0: float) -> _Sent:
        """Send the prepared request: complete the held one when its body is the one to
        send, else drop it and send the new body; a refusal is the answer as it is."""
        state = None
        try:
            if held is not None and not out.unchanged:
                held.abort()  # the body changed: the held one never reaches the upstream
                held, state = None, "dropped"
            elif held is not None:
                state = "sent-early" if held.released else "sent"
            added = _ms_since(t0)
            if out.refusal is not None:
                return _Sent(out.refusal, state, added)
            resp = await self._send(request, out.content, out.dialect, held)
        finally:
            if held is not None and not held.done:
                held.abort()  # the client left first
                state = "dropped"
        return _Sent(resp, state, added)

    async def _send(self, request: Request, content: bytes, dialect: str | None,
                    held: HeldRequest | None = None) -> UpstreamResponse | BufferedResponse:
        """Send upstream (or send the held request's last byte) and wait for the response
        headers, watching the client meanwhile: a client that leaves first cancels the
        upstream request (status 499)."""
        send = (held.commit(content) if held is not None else
                self.client.send(request.method, self._upstream_url(request),
                                 request_headers(request.headers.raw), content))
        try:
            scope = request.scope
            watch = scope.get(WATCH_KEY, False)
            if watch is None:  # ProxyApp's fast path: one watcher for the whole request
                watch = scope[WATCH_KEY] = ClientWatch(request.receive)
            answered, result = await (watch.run(send) if watch
                                      else until_disconnect(send, request.receive))
        except UpstreamError as error:
            log.warning("upstream unreachable: %s %s: %s", request.method,
                        request.scope["path"], error)
            body = error_body(dialect, 502, f"agentcompact proxy: upstream unreachable: {error}",
                              code="upstream_unreachable")
            return BufferedResponse(502, [(b"content-type", b"application/json")],
                                    orjson.dumps(body))
        if not answered or result is None:  # the client left before the answer began
            log.info("client left before the upstream answered: %s %s (request cancelled)",
                     request.method, request.scope["path"])
            return BufferedResponse(499, [], b"")
        return result

    async def _passthrough(self, request: Request, raw: bytes) -> Any:
        resp = await self._send(request, raw, upstream_of(request.scope["path"]))
        if isinstance(resp, BufferedResponse):
            return resp
        self.stats.stream_opened(1)
        return RelayResponse(resp, on_close=lambda _ok: self.stats.stream_opened(-1))

    def _may_retry(self, out: _Outgoing, resp: UpstreamResponse | BufferedResponse) -> bool:
        """A 400/413 answer that may be a context-length error worth one harder retry."""
        return (not isinstance(resp, BufferedResponse) and resp.status_code in (400, 413)
                and self.config.reactive and not self.config.shadow and not out.fail_open
                and out.request is not None and out.request.engine is not None)

    async def _reactive(self, request: Request, out: _Outgoing, sent: _Sent
                        ) -> tuple[_Outgoing, _Sent]:
        """Context-length error: compact one level harder and replay once."""
        resp = sent.response
        assert not isinstance(resp, BufferedResponse)
        try:
            data = await resp.read()
        except UpstreamDropped:
            return out, replace(sent, response=BufferedResponse(502, [], b""))
        first = replace(sent, response=BufferedResponse(resp.status_code, resp.raw_headers,
                                                        data))
        if not is_context_error(resp.status_code, data):
            return out, first
        req = out.request
        assert req is not None and req.engine is not None
        try:
            engine, messages, fixed = req.engine, req.messages, _fixed(req)
            if self.engines.is_async:
                result = await self._acompact(engine, messages, force=True, fixed_tokens=fixed)
            else:
                result = await anyio.to_thread.run_sync(
                    lambda: engine.compact(messages, force=True, fixed_tokens=fixed))
            retry = self._encode(req, result.messages)
        except Exception as exc:
            log.exception("reactive compaction failed; returning the provider's error")
            return replace(out, error=f"reactive: {type(exc).__name__}: {exc}"), first
        if not result.modified or retry == out.content:
            return out, first
        log.info("reactive: context-length error from upstream; replaying %d tokens "
                 "(was %s), session %s", result.tokens_after,
                 out.result.tokens_after if out.result is not None else None, req.session)
        out = self._for_gateway(replace(out, content=retry, result=result,
                                        messages=result.messages, modified=True, retried=True))
        retry = out.content
        return out, replace(sent, response=await self._send(request, retry, out.dialect))

    # --- record and relay ----------------------------------------------------------------
    def _answer(self, out: _Outgoing, sent: _Sent) -> Any:
        """Record the exchange (counters, the log line), then relay the answer; for a
        request the engine has still to measure (``later``), relay first: it measures,
        and the exchange is recorded, once the answer's first chunk is on its way."""
        resp = sent.response
        if out.later is not None and not isinstance(resp, BufferedResponse):
            settled: list[_Outgoing] = []
            later = out.later

            def done(result: _Outgoing) -> None:
                settled.append(result)
                self._record_exchange(result, sent)

            if not self.store_io:
                return self._relay(out, resp, lambda: done(later()), settled)
            # the engine measures in a worker thread (it reads the store): the exchange
            # is recorded when it is done, the answer relayed meanwhile
            measuring: list[asyncio.Future[_Outgoing]] = []

            engine = out.request.engine if out.request is not None else None

            def measure() -> asyncio.Future[_Outgoing]:
                task = asyncio.ensure_future(anyio.to_thread.run_sync(later))
                task.add_done_callback(lambda t: None if t.cancelled() or t.exception()
                                       else done(t.result()))
                measuring.append(task)
                if engine is not None:  # the session's next request waits for it
                    self._measuring[engine] = task
                return task  # the answer's last bytes wait for it

            return self._relay(out, resp, measure, settled, measuring)
        self._record_exchange(out, sent)
        if isinstance(resp, BufferedResponse):
            return resp
        return self._relay(out, resp)

    def _record_exchange(self, out: _Outgoing, sent: _Sent) -> None:
        """The exchange's counters and log line."""
        ex = self._exchange(out, sent)
        saved = 0
        if ex.modified and ex.tokens_in is not None and ex.tokens_out is not None:
            saved = ex.tokens_in - ex.tokens_out
        self.stats.record(ex, saved)
        if self.config.log_requests:
            ex.emit()

    def _exchange(self, out: _Outgoing, sent: _Sent | None = None) -> ExchangeLog:
        """The log line of a prepared request, and of what sending it did."""
        req, result = out.request, out.result
        return ExchangeLog(
            out.path, out.dialect, session=req.session if req is not None else None,
            status=sent.response.status_code if sent is not None else None,
            tokens_in=result.tokens_original if result is not None else None,
            tokens_out=result.tokens_after if result is not None else None,
            compacted=out.retried or (result is not None and result.compacted),
            reasons=[e.reason for e in result.events] if result is not None else [],
            modified=out.modified,
            strategy=(req.engine.strategy_name
                      if result is not None and req is not None and req.engine is not None
                      else None),
            added_ms=sent.added_ms if sent is not None else 0.0,
            probe=req is not None and req.probe, shadow=self.config.shadow,
            retried=out.retried, refused=out.refusal is not None,
            held=sent.held if sent is not None else None,
            error=out.error, fallback=out.fallback, fail_open=out.fail_open)

    def _relay(self, out: _Outgoing, resp: UpstreamResponse,
               after_first: Callable[[], Any] | None = None,
               settled: list[_Outgoing] | None = None,
               measuring: list[asyncio.Future[_Outgoing]] | None = None) -> RelayResponse:
        """Relay the answer; with ``--record``, keep a copy of it to log the model call
        at its end (``_record``). ``after_first`` runs once the first chunk is relayed,
        and puts the final ``_Outgoing`` in ``settled`` (at once, or once the task it
        puts in ``measuring`` is done)."""
        recording = self._recording(out, resp)
        if self.gateway is not None and out.request is not None:
            self.gateway.opened(out.request.session)
        self.stats.stream_opened(1)

        def closed(ok: bool) -> None:
            self.stats.stream_opened(-1)
            if measuring and not measuring[0].done():
                measuring[0].add_done_callback(
                    lambda _: self._record(settled[0] if settled else out, ok, recording))
                return
            self._record(settled[0] if settled else out, ok, recording)

        return RelayResponse(resp, tee=recording.feed if recording is not None else None,
                             after_first=after_first, on_close=closed)

    def _recording(self, out: _Outgoing, resp: UpstreamResponse) -> Recording | None:
        """With ``--record`` or the RL gateway, the recording of a successful answer."""
        if self.recording is None or resp.status_code >= 300:
            return None
        session = out.request.session if out.request is not None else None
        return Recording(self.recording, out.dialect,
                         streamed="text/event-stream" in resp.headers.get("content-type", ""),
                         content_encoding=resp.headers.get("content-encoding"),
                         describe=f"the {out.dialect} answer to {out.path} (session {session})")

    def _record(self, out: _Outgoing, complete: bool, recording: Recording | None) -> None:
        """Log the model call once its answer is reassembled (in the recording thread)."""
        req = out.request
        if recording is None or not complete or req is None:
            if recording is not None:
                recording.discard()
            if self.gateway is not None and req is not None:
                self.gateway.closed(req.session)
            return
        if self.gateway is None:
            recording.finish(functools.partial(self._log_call, out, {}))
            return
        # the RL gateway: reported on its worker in the order the answers ended, with the
        # compactions it queued; the answer is reassembled in the recording thread meanwhile
        fields = self.gateway.call_fields(req.session)
        got: concurrent.futures.Future[Reassembled | None] = concurrent.futures.Future()
        recording.finish(got.set_result, unread=lambda: got.set_result(None))
        self.gateway.submit(lambda: self._log_read_call(out, fields, got))
        self.gateway.recorded(req.session)

    def _log_read_call(self, out: _Outgoing, fields: dict[str, Any],
                       got: concurrent.futures.Future[Reassembled | None]) -> None:
        answer = got.result()
        if answer is not None:  # unreadable: the recording thread warned
            self._log_call(out, fields, answer)

    def _log_call(self, out: _Outgoing, fields: dict[str, Any], got: Reassembled) -> None:
        """Report the model call of a relayed answer (``--record``, the RL gateway)."""
        req = out.request
        assert req is not None
        dialect = self.engines.dialects[out.dialect]
        request = {k: v for k, v in req.body.items() if k != dialect.messages_key}
        model = got.model or req.body.get("model")
        log_model_call(ModelCall(
            episode_id=req.session or "unknown", dialect=out.dialect,
            messages=list(out.messages or []), response=got.response, request=request,
            usage=got.usage, model=model if isinstance(model, str) else None,
            compacted=out.modified and not self.config.shadow, **got.model_call_fields(),
            **fields), self.pm)


async def _receive(request: Request, held: HeldRequest | None,
                   common: Common | None = None) -> bytes:
    """The request's body, fed on to ``held`` as it arrives (the next chunk may be in
    already: the loop runs in between, so the upstream request progresses with it) and
    compared with an earlier body by ``common``."""
    chunks: list[bytes] = []
    async for chunk in request.stream():
        if chunk:
            chunks.append(chunk)
            if held is not None:
                held.feed(chunk)
            if common is not None:
                common.feed(chunk)
            if held is not None:
                await asyncio.sleep(0)  # the upstream request's task sends it on meanwhile
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None or not value.isdigit():
        return None
    return int(value)


def _register_recorder(pm: pluggy.PluginManager, run_dir: str) -> Any:
    from agentcompact.plugins.recorder import Recorder

    recorder = Recorder(run_dir, metadata={"source": "agentcompact proxy"})
    pm.register(recorder, name=f"agentcompact-proxy-recorder-{id(recorder)}")
    return recorder


def _is_kept(dialect: Dialect, message: Any) -> bool:
    """The engine's rule for what it never drops (``Dialect.is_kept``; instructions only
    with a base class that predates it)."""
    kept = getattr(dialect, "is_kept", None)
    return bool(kept(message)) if kept is not None else dialect.role(message) in (
        "system", "developer")


def _round_up(tokens: int) -> int:
    return -(-tokens // 10_000) * 10_000


def _fixed(req: _Request) -> int:
    """Tokens the request spends besides its messages (system, instructions, tools): they
    count against the budget like the messages do (Claude Code sends ~15k tokens of tools)."""
    if req.engine is None:
        return 0
    return req.engine.fixed_tokens(req.body)


def _failure(result: CompactionResult) -> tuple[str | None, str | None]:
    """A failed or fallen-back compaction's first error and fallback (the log line's
    ``error``, ``fallback``)."""
    error = fallback = None
    for event in result.events or ([result.event] if result.event else []):
        error = error or event.error
        fallback = fallback or event.fallback
    return error, fallback


def _ms_since(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)


class ProxyApp(Starlette):
    """The proxy's Starlette app. It declares every route (the status page, and every
    other path handled by :meth:`CompactionProxy.handle`), runs the lifespan and serves
    the status page and methods outside ``_METHODS`` through Starlette's router and
    middleware; a proxied request is dispatched straight to the handler, without the
    router and middleware wrapping every ``send`` (a streamed answer is relayed in
    dozens of sends). ``app.state.proxy`` is the ``CompactionProxy``."""

    def __init__(self, proxy: CompactionProxy) -> None:
        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            try:
                yield
            finally:
                await proxy.aclose()

        super().__init__(routes=[
            Route(_STATUS_PATH, proxy.status, methods=["GET"]),
            *(proxy.gateway.routes() if proxy.gateway is not None else []),
            Route("/{path:path}", proxy.handle, methods=_METHODS),
        ], lifespan=lifespan)
        self.proxy = proxy
        self.state.proxy = proxy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not _origin_form(scope):
            await _NOT_ORIGIN_FORM(scope, receive, send)
            return
        gateway = self.proxy.gateway
        if gateway is not None and scope["type"] == "http":
            scope = gateway.route(scope)  # /rl/g/{group}/e/{episode}/... -> /...
        if (scope["type"] != "http" or scope["path"] == _STATUS_PATH
                or scope["method"] not in _METHODS
                or (gateway is not None and scope["path"].startswith("/rl/"))):
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        scope[WATCH_KEY] = None if ClientWatch.usable() else False
        try:
            response = await self.proxy.handle(Request(scope, receive))
            await response(scope, receive, send)
        finally:
            watch = scope[WATCH_KEY]
            if watch:
                watch.close()


def _origin_form(scope: Any) -> bool:
    """Whether the request-target is origin-form (``/path?query``), or ``*`` of ``OPTIONS``:
    the only forms the proxy joins onto an upstream URL. Another form (``@host:port/…``,
    ``http://host/…``, ``path`` without its slash) would put a host or userinfo of the
    client's choosing into it: every server refuses it alike (HTTP parsers differ)."""
    target: bytes = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
    return target[:1] == b"/" or (target == b"*" and scope["method"] == "OPTIONS")


_NOT_ORIGIN_FORM = BufferedResponse(
    400, [(b"content-type", b"text/plain; charset=utf-8")],
    b"agentcompact proxy: the request-target must be a path starting with '/' "
    b"(origin-form, RFC 9112 section 3.2.1)\n")


def _store(url: str) -> PrefixStore:
    if url == "memory:":
        return InMemoryPrefixStore()
    from agentcompact.stores import store_from_url

    return store_from_url(url)


def _archive(config: ProxyConfig, pm: pluggy.PluginManager) -> Any:
    """For a strategy that takes an archive (``archive``): the one its options name (a
    file, ``--archive``), else the store URL's; ``None`` for a strategy without one.
    Opened here, once, so each engine can be given its tenant's view of it."""
    from agentcompact import open_archive

    strategy = config.strategy_settings
    factory = registry(pm).strategy_factory(strategy.name)
    if "archive" not in _parameters(factory):
        return None
    return open_archive((strategy.options or {}).get("archive", config.store_url()))


def _parameters(factory: Any) -> Mapping[str, Any]:
    try:
        return inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return {}


def _store_status(store: object) -> dict[str, Any] | None:
    """A shared store's counters (backend, availability, failures), else ``None``."""
    status = getattr(store, "status", None)
    return status() if callable(status) else None


def create_app(config: ProxyConfig | None = None, *, plugins: pluggy.PluginManager | None = None,
               store: PrefixStore | None = None, gateway: GatewayConfig | None = None
               ) -> ProxyApp:
    """The proxy as a Starlette app (its state is ``app.state.proxy``).

    :param config: settings (default: ``ProxyConfig.from_env()``).
    :param plugins: plugin manager (default: the process-wide one).
    :param store: the prefix store shared by the engines (default: in-memory LRU); pass a
        shared store to run several workers.
    :param gateway: run as an RL rollout gateway (``docs/gateway.md``).
    """
    return ProxyApp(CompactionProxy(config if config is not None else ProxyConfig.from_env(),
                                    plugins=plugins, store=store, gateway=gateway))
