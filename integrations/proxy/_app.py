"""The compaction proxy as a Starlette app.

``create_app(config)`` returns an ASGI app that harnesses point their base URL at. For
``POST`` to ``/v1/messages`` (Anthropic), ``…/chat/completions`` (OpenAI Chat) and any path
ending in ``/responses`` (OpenAI Responses, incl. Codex's ChatGPT backend) it compacts the
request's messages with an engine of that dialect, then forwards; every other request
passes through untouched. Only request bodies are rewritten: responses (SSE included) are
relayed as they arrive.

Per request, in steps: receive the body (a large one that may stay under the trigger is
sent on upstream as it arrives, held by its last byte: ``_hold``) → prepare (parse, probe?,
session key, the session's engine compacts — off the event loop when the body is large —,
encode only if modified, else the original bytes) → send (or complete the held request;
on a context-length error, compact harder and replay once) → relay the answer → record
(the log line; with ``--record``, the model call with the reassembled response). Any
failure before sending forwards the original bytes (fail-open).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sized
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import anyio
import orjson
import pluggy
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentcompact import __version__
from agentcompact._budget import Budget
from agentcompact._engine import CompactionResult, Engine
from agentcompact._events import ModelCall
from agentcompact._logging_hooks import log_model_call
from agentcompact._settings import StrategySettings
from agentcompact._store import InMemoryPrefixStore, PrefixStore
from agentcompact._tokens import MessageMeter, make_counter
from agentcompact.dialects._base import Dialect
from agentcompact.plugins import get_plugin_manager, registry

from ._bodies import BodyCache, Parsed, encode
from ._config import ProxyConfig
from ._observe import DebugDumper, ExchangeLog, ProxyStats
from ._reassemble import reassemble
from ._relay import WATCH_KEY, BufferedResponse, ClientWatch, RelayResponse, until_disconnect
from ._speculation import Speculation
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
    RESPONSES,
    dialect_for,
    error_body,
    is_anthropic_path,
    is_context_error,
    is_probe,
    request_headers,
    session_key,
)

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


@dataclass
class _Plan:
    """One dialect request on its way upstream."""

    dialect: str
    raw: bytes
    out: bytes
    ex: ExchangeLog
    body: dict[str, Any] | None = None
    parsed: Parsed | None = None
    messages: list[Any] | None = None
    engine: Engine | None = None
    result: CompactionResult | None = None
    sent_messages: list[Any] | None = None
    refusal: BufferedResponse | None = None


class EnginePool:
    """One engine per (dialect, session), LRU-bounded, all sharing one prefix store and one
    token counter. Per-session engines keep each session's token cache and digest chain
    apart and stamp its compaction events with the session as ``episode_id``."""

    def __init__(self, config: ProxyConfig, pm: pluggy.PluginManager, store: PrefixStore) -> None:
        self.config, self.pm, self.store = config, pm, store
        self.budget = Budget(trigger_tokens=config.trigger, target_tokens=config.target)
        self.counter = make_counter(config.counter)
        reg = registry(pm)
        reg.strategy_factory(config.strategy)  # unknown name: ConfigError at start-up
        self.dialects: dict[str, Dialect] = {d: reg.dialect(d) for d in (ANTHROPIC, CHAT,
                                                                          RESPONSES)}
        self._engines: OrderedDict[tuple[str, str], Engine] = OrderedDict()
        #: tokens each engine sent last time (to tell a quiet request from a likely cliff)
        self.sent_tokens: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        #: what the proxy can know about its engines before they measure (token bounds)
        self.speculation = Speculation()
        self.is_async = hasattr(self._new(ANTHROPIC, "startup").strategy, "acompact")

    def get(self, dialect: str, session: str) -> Engine:
        key = (dialect, session)
        with self._lock:
            engine = self._engines.pop(key, None)
            if engine is None:
                engine = self._new(dialect, session)
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

    def _new(self, dialect: str, session: str) -> Engine:
        strategy = StrategySettings(self.config.strategy, options=self.config.strategy_options)
        meter = MessageMeter(self.counter, self.dialects[dialect], max_entries=_METER_ENTRIES)
        engine = Engine(strategy=strategy, dialect=self.dialects[dialect],
                        budget=self.budget, store=self.store, counter=meter,
                        plugins=self.pm, episode_id=session)
        return self.speculation.watch(engine, meter)


class CompactionProxy:
    """The proxy's state and request handling; ``create_app`` wraps it in an ASGI app."""

    def __init__(self, config: ProxyConfig, *, plugins: pluggy.PluginManager | None = None,
                 store: PrefixStore | None = None) -> None:
        self.pm = plugins if plugins is not None else get_plugin_manager()
        self.store = store if store is not None else _store(config.store_url())
        #: the archive of dropped originals, beside the store (``None``: the strategy
        #: keeps none, or ``--archive`` names its own file)
        self.archive = _archive(config, self.pm)
        if self.archive is not None:
            config = config.replace(strategy_options={**config.strategy_options,
                                                      "archive": self.archive})
        self.config = config
        self.engines = EnginePool(config, self.pm, self.store)
        #: recent bodies with their parsed messages: a session's next request only parses
        #: what is new (and keeps the engine's per-message caches hitting, by identity)
        self.bodies = BodyCache(max_entries=config.max_sessions)
        self.stats = ProxyStats(config.max_sessions)
        self.dumper = DebugDumper(config.debug_dir) if config.debug_dir else None
        self.recorder = _register_recorder(self.pm, config.record) if config.record else None
        self.client = UpstreamClient(config.connect_timeout, config.read_timeout)
        #: a dialect request declaring a body this large or larger is started upstream
        #: while its body arrives (``None``: never; see ``_hold``)
        self.hold_bytes: int | None = _HOLD_BYTES
        #: bodies that went upstream unchanged, with their tokens: a held request extending
        #: one of them may be completed before it is measured (``_release_if_bounded``)
        self._unchanged: weakref.WeakKeyDictionary[Parsed, tuple[int, int | None, int]] = (
            weakref.WeakKeyDictionary())
        self._speculation = self.engines.speculation

    # --- lifecycle ----------------------------------------------------------------
    async def aclose(self) -> None:
        """Close the upstream client and the recorder (the app's lifespan calls this)."""
        await self.client.aclose()
        if self.recorder is not None and self.pm.is_registered(self.recorder):
            self.pm.unregister(self.recorder)
            close = getattr(self.recorder, "close", None)
            if close is not None:
                close()

    # --- routes -------------------------------------------------------------------
    async def status(self, request: Request) -> JSONResponse:
        c = self.config
        return JSONResponse(self.stats.snapshot(
            version=__version__, strategy=c.strategy, trigger=c.trigger,
            target=self.engines.budget.target, shadow=c.shadow, strict=c.strict,
            recording=c.record is not None,
            store_entries=len(self.store) if isinstance(self.store, Sized) else None,
            store=_store_status(self.store), archive=_store_status(self.archive),
            parse_reuse={"bodies": len(self.bodies), "hits": self.bodies.hits,
                         "partial_hits": self.bodies.partial_hits,
                         "misses": self.bodies.misses},
        ))

    async def handle(self, request: Request) -> Any:
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
        try:
            raw = await _receive(request, held)
        except BaseException:
            if held is not None:
                held.abort()  # the client left (or failed) before its body was in
            raise
        plan = await self._prepare(request, dialect, raw, held)
        try:
            if held is not None and (plan.out is not raw or plan.refusal is not None):
                held.abort()  # the body changed: the held one never reaches the upstream
                held, plan.ex.held = None, "dropped"
            elif held is not None:
                plan.ex.held = "sent-early" if held.released else "sent"
            if plan.refusal is not None:
                return self._done(plan, plan.refusal, t0)
            plan.ex.added_ms = round((time.perf_counter() - t0) * 1000, 3)
            resp = await self._send(request, plan.out, dialect, held)
        finally:
            if held is not None and not held.done:
                held.abort()  # the client left first
                plan.ex.held = "dropped"
        if isinstance(resp, BufferedResponse):
            return self._done(plan, resp, t0)
        if resp.status_code in (400, 413) and self._may_retry(plan):
            return await self._reactive(request, plan, resp, t0)
        return self._done(plan, resp, t0)

    # --- preparing the request ------------------------------------------------------
    async def _hold(self, request: Request) -> HeldRequest | None:
        """Start the request upstream before its body is in, when the body is large
        enough for its trip to the upstream to matter and its declared length cannot
        plausibly reach the trigger: the body then crosses to the upstream as it arrives,
        held by its last byte until the engine has decided (``handle``). A request missing
        its last byte is one the upstream never acts on: a body the engine changes after
        all is dropped unfinished and the new one sent. The guess only decides what is
        faster; what is processed is always what the engine decided."""
        length, least = _declared_length(request), self.hold_bytes
        if (length is None or least is None or length < least
                or not self.engines.may_stay_under(length)):
            return None
        return await self.client.hold(request.method, self._upstream_url(request),
                                      request_headers(request.headers.raw), length)

    async def _prepare(self, request: Request, dialect: str, raw: bytes,
                       held: HeldRequest | None = None) -> _Plan:
        plan = _Plan(dialect, raw, raw, ExchangeLog(request.scope["path"], dialect,
                                                    shadow=self.config.shadow))
        headers = request.headers
        try:
            if self.engines.is_async:
                self._parse(plan, headers)
                if plan.engine is not None and plan.messages is not None:
                    plan.result = await plan.engine.acompact(plan.messages,
                                                              fixed_tokens=_fixed(plan))
                    self._apply(plan)
            elif not self._prepare_sync(plan, headers, _OFFLOOP_BYTES, held, on_loop=True):
                # more to parse, or a compaction likely: off the event loop
                await anyio.to_thread.run_sync(self._prepare_sync, plan, headers, None, held)
        except Exception as exc:  # fail-open: the original bytes go upstream
            # no traceback: a chained exception could carry the history it was raised over
            log.warning("compaction failed (%s); forwarding the original request (session %s)",
                        type(exc).__name__, plan.ex.session)
            plan.out, plan.result, plan.sent_messages = raw, None, plan.messages
            plan.ex.error = f"{type(exc).__name__}: {exc}"
            plan.ex.fail_open = True
        if self.dumper is not None and plan.body is not None:
            self._dump(plan, headers)
        return plan

    def _prepare_sync(self, plan: _Plan, headers: Any, limit: int | None,
                      held: HeldRequest | None = None, *, on_loop: bool = False) -> bool:
        """Parse and compact. With ``limit`` (on the event loop), stop before a step that
        would parse more than ``limit`` bytes or may compact, and return ``False``; the
        caller finishes in a worker thread (a call without ``limit``). ``held``: the
        original body on its way upstream but for its last byte (``_hold``); ``on_loop``,
        it may be completed before measuring (``_release_if_bounded``)."""
        new_bytes = len(plan.raw)
        if plan.parsed is None:
            key = self.engines.dialects[plan.dialect].messages_key
            match, new_bytes = self.bodies.lookup(plan.raw, key)
            if limit is not None and new_bytes > limit:
                return False
            self._parse(plan, headers, match)
            if held is not None and on_loop and match is not None:
                self._release_if_bounded(plan, held, self._unchanged.get(match[0]))
        engine = plan.engine
        if engine is not None and plan.messages is not None and plan.result is None:
            if (limit is not None and len(plan.raw) > limit
                    and not self.engines.quiet(engine, new_bytes)):
                return False
            version = self._speculation.store_version(engine)  # before: a put may follow
            fixed = _fixed(plan)
            plan.result = engine.compact(plan.messages, fixed_tokens=fixed)
            self.engines.sent_tokens[engine] = plan.result.tokens_after
            self._apply(plan)
            if held is not None and held.released and plan.out is not plan.raw:
                # cannot happen while Speculation.leaves_unchanged holds; the body is upstream
                log.error("a body sent before the engine finished was changed by it; "
                          "the original went upstream (session %s)", plan.ex.session)
                plan.out, plan.sent_messages, plan.refusal = plan.raw, plan.messages, None
                plan.ex.modified = False
            if plan.out is plan.raw and plan.parsed is not None:
                # the body as sent (the original: shadow mode may have computed another)
                self._unchanged[plan.parsed] = (plan.result.tokens_original, version, fixed)
        return True

    def _release_if_bounded(self, plan: _Plan, held: HeldRequest,
                            known: tuple[int, int | None, int] | None) -> None:
        """Complete the held request before measuring when the engine is certain to leave
        the body unchanged: the messages it shares with the earlier body count what they
        counted then, the new ones at most their UTF-8 bytes (plus overheads), and no
        prefix was stored since (``Speculation.leaves_unchanged``). The upstream then works on
        the request while the engine tokenizes the new messages for its exact figures.
        ``known``: the earlier body went upstream unchanged: its tokens, the prefix
        store's version then, and its fixed tokens."""
        engine, parsed = plan.engine, plan.parsed
        if engine is None or plan.messages is None or known is None:
            return
        tokens, version, fixed = known
        if parsed is not None and parsed.reused:  # the earlier body's messages, as counted
            new = self._speculation.token_bound(engine, plan.messages[parsed.reused:])
            bound = None if new is None else tokens - fixed + new
        else:
            bound = self._speculation.token_bound(engine, plan.messages)
        if bound is not None and self._speculation.leaves_unchanged(engine, bound + _fixed(plan),
                                                                    version):
            held.release()

    def _parse(self, plan: _Plan, headers: Any, match: Any = True) -> None:
        dialect = self.engines.dialects[plan.dialect]
        parsed = self.bodies.parse(plan.raw, dialect.messages_key, match)
        body = parsed.body
        if not isinstance(body, dict):
            raise TypeError(f"request body is a JSON {type(body).__name__}, not an object")
        plan.body, plan.parsed = body, parsed
        messages = dialect.messages_of(body)
        plan.messages = plan.sent_messages = messages
        plan.ex.session = session_key(dialect, body, headers, messages)
        if is_probe(body):
            plan.ex.probe = True
        elif messages and not body.get("previous_response_id"):
            plan.engine = self.engines.get(plan.dialect, plan.ex.session)

    def _apply(self, plan: _Plan) -> None:
        """Fill the log fields from the result and encode the body to send, if it changed."""
        result, ex = plan.result, plan.ex
        assert result is not None and plan.engine is not None and plan.body is not None
        ex.tokens_in, ex.tokens_out = result.tokens_original, result.tokens_after
        ex.compacted, ex.modified = result.compacted, result.modified
        ex.strategy = plan.engine.strategy_name
        self._report_failure(plan, result)
        if self.config.strict and not self.config.shadow and (
                result.over_budget or result.tokens_after > self.engines.budget.limit):
            plan.refusal = self._refuse(plan, result)  # modified or not: over the limit
            return
        if self.config.shadow or not result.modified:
            if result.modified:
                log.info("shadow: would send %d tokens instead of %d (session %s)",
                         result.tokens_after, result.tokens_original, ex.session)
            return
        plan.out = self._encode(plan, result.messages)
        plan.sent_messages = result.messages

    def _report_failure(self, plan: _Plan, result: CompactionResult) -> None:
        """Put a failed or fallen-back compaction into the log line (``error``,
        ``fallback``) and warn once per session about a trigger the client's fixed part
        leaves no room under."""
        ex = plan.ex
        for event in result.events or ([result.event] if result.event else []):
            if event.error and ex.error is None:
                ex.error = event.error
            if event.fallback and ex.fallback is None:
                ex.fallback = event.fallback
        if ex.error is not None and self.stats.first_failure(ex.session):
            log.warning("compaction failed in session %s (%s; fallback %s); later failures "
                        "of this session are in the log lines only", ex.session, ex.error,
                        ex.fallback or "none")
        if plan.engine is not None and self.stats.first_request(ex.session):
            self._warn_fixed(plan)

    def _warn_fixed(self, plan: _Plan) -> None:
        """Warn when the part of a request compaction cannot shrink (system prompt, tools,
        instruction items) takes half the trigger or more."""
        engine, messages = plan.engine, plan.messages or []
        assert engine is not None
        kept = [m for m in messages if _is_kept(engine.dialect, m)]
        fixed = _fixed(plan) + (engine.count(kept) if kept else 0)
        trigger = self.engines.budget.trigger
        if fixed * 2 >= trigger:
            log.warning("trigger %d tokens is too small for this client: its fixed prompt "
                        "(system, tools, instructions) is %d tokens, which compaction keeps; "
                        "use --trigger %d or more (session %s)", trigger, fixed,
                        _round_up(fixed * 3), plan.ex.session)

    def _encode(self, plan: _Plan, messages: list[Any]) -> bytes:
        """The body to send with ``messages``: unchanged messages as the client's own bytes
        (no re-serialization), new ones encoded; in full for a dialect that rewrites more
        than the message list."""
        assert plan.engine is not None and plan.body is not None
        dialect = plan.engine.dialect
        if (plan.parsed is not None and plan.parsed.messages is not None
                and type(dialect).with_messages is Dialect.with_messages):
            return encode(plan.parsed, messages)
        return orjson.dumps(dialect.with_messages(plan.body, messages))

    def _refuse(self, plan: _Plan, result: CompactionResult) -> BufferedResponse:
        plan.ex.refused = True
        limit = self.engines.budget.limit
        message = (f"prompt is too long: {result.tokens_after} tokens > {limit} maximum "
                   "(agentcompact strict mode: still over budget after compaction)")
        body = error_body(plan.dialect, 400, message, code="context_length_exceeded")
        return BufferedResponse(400, [(b"content-type", b"application/json")],
                                orjson.dumps(body))

    def _dump(self, plan: _Plan, headers: Any) -> None:
        result = plan.result
        outgoing = None
        if result is not None and result.modified and plan.out is not plan.raw:
            outgoing = orjson.loads(plan.out)
        summary = {"dialect": plan.dialect, "session": plan.ex.session,
                   "compacted": plan.ex.compacted, "modified": plan.ex.modified,
                   "tokens_in": plan.ex.tokens_in, "tokens_out": plan.ex.tokens_out,
                   "shadow": self.config.shadow, "error": plan.ex.error}
        assert self.dumper is not None
        self.dumper.dump(plan.ex.session, plan.ex.path, headers, plan.body, outgoing, summary)

    # --- talking to the upstream ----------------------------------------------------
    def _upstream_url(self, request: Request) -> str:
        """The upstream URL: the path and query exactly as the client sent them."""
        scope = request.scope
        base = (self.config.anthropic_upstream if is_anthropic_path(scope["path"])
                else self.config.openai_upstream)
        raw_path = scope.get("raw_path")
        path = raw_path.decode("latin-1") if raw_path else quote(scope["path"])
        query = scope.get("query_string", b"").decode("latin-1")
        return f"{base}{path}?{query}" if query else f"{base}{path}"

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
        resp = await self._send(request, raw, ANTHROPIC if is_anthropic_path(request.scope["path"])
                                else CHAT)
        if isinstance(resp, BufferedResponse):
            return resp
        self.stats.stream_opened(1)
        return RelayResponse(resp, on_close=lambda _ok: self.stats.stream_opened(-1))

    def _may_retry(self, plan: _Plan) -> bool:
        return (self.config.reactive and not self.config.shadow and plan.engine is not None
                and plan.messages is not None and not plan.ex.fail_open)

    async def _reactive(self, request: Request, plan: _Plan, resp: UpstreamResponse,
                        t0: float) -> Any:
        """Context-length error: compact one level harder and replay once."""
        try:
            data = await resp.read()
        except UpstreamDropped:
            return self._done(plan, BufferedResponse(502, [], b""), t0)
        first = BufferedResponse(resp.status_code, resp.raw_headers, data)
        if not is_context_error(resp.status_code, data):
            return self._done(plan, first, t0)
        assert plan.engine is not None and plan.messages is not None and plan.body is not None
        try:
            engine, messages, fixed = plan.engine, plan.messages, _fixed(plan)
            if self.engines.is_async:
                result = await engine.acompact(messages, force=True, fixed_tokens=fixed)
            else:
                result = await anyio.to_thread.run_sync(
                    lambda: engine.compact(messages, force=True, fixed_tokens=fixed))
            retry = self._encode(plan, result.messages)
        except Exception as exc:
            log.exception("reactive compaction failed; returning the provider's error")
            plan.ex.error = f"reactive: {type(exc).__name__}: {exc}"
            return self._done(plan, first, t0)
        if not result.modified or retry == plan.out:
            return self._done(plan, first, t0)
        log.info("reactive: context-length error from upstream; replaying %d tokens "
                 "(was %s), session %s", result.tokens_after, plan.ex.tokens_out, plan.ex.session)
        plan.result, plan.out, plan.sent_messages = result, retry, result.messages
        plan.ex.retried, plan.ex.compacted, plan.ex.modified = True, True, True
        plan.ex.tokens_out = result.tokens_after
        resp2 = await self._send(request, retry, plan.dialect)
        return self._done(plan, resp2, t0)

    # --- answering ---------------------------------------------------------------------
    def _done(self, plan: _Plan, resp: UpstreamResponse | BufferedResponse, t0: float) -> Any:
        ex = plan.ex
        ex.status = resp.status_code
        if not ex.added_ms:
            ex.added_ms = round((time.perf_counter() - t0) * 1000, 3)
        saved = 0
        if ex.modified and ex.tokens_in is not None and ex.tokens_out is not None:
            saved = ex.tokens_in - ex.tokens_out
        self.stats.record(ex, saved)
        if self.config.log_requests:
            ex.emit()
        if isinstance(resp, BufferedResponse):
            return resp
        return self._relay(plan, resp)

    def _relay(self, plan: _Plan, resp: UpstreamResponse) -> RelayResponse:
        """Relay the answer; with ``--record``, keep a copy of it to log the model call
        at its end (``_record``)."""
        kept: list[bytes] | None = (
            [] if self.config.record is not None and resp.status_code < 300 else None)
        self.stats.stream_opened(1)
        return RelayResponse(resp, tee=kept.append if kept is not None else None,
                             on_close=lambda ok: self._record(plan, resp, ok, kept))

    def _record(self, plan: _Plan, resp: UpstreamResponse, complete: bool,
                kept: list[bytes] | None) -> None:
        self.stats.stream_opened(-1)
        if kept is None or not complete or plan.body is None:
            return
        streamed = "text/event-stream" in resp.headers.get("content-type", "")
        got = reassemble(plan.dialect, b"".join(kept), streamed=streamed)
        dialect = self.engines.dialects[plan.dialect]
        request = {k: v for k, v in plan.body.items() if k != dialect.messages_key}
        model = got.model or plan.body.get("model")
        log_model_call(ModelCall(
            episode_id=plan.ex.session or "unknown", dialect=plan.dialect,
            messages=list(plan.sent_messages or []), response=got.response, request=request,
            usage=got.usage, model=model if isinstance(model, str) else None,
            compacted=plan.ex.modified and not self.config.shadow, **got.model_call_fields(),
        ), self.pm)


async def _receive(request: Request, held: HeldRequest | None) -> bytes:
    """The request's body, fed on to ``held`` as it arrives (the next chunk may be in
    already: the loop runs in between, so the upstream request progresses with it)."""
    chunks: list[bytes] = []
    async for chunk in request.stream():
        if chunk:
            chunks.append(chunk)
            if held is not None:
                held.feed(chunk)
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


def _fixed(plan: _Plan) -> int:
    """Tokens the request spends besides its messages (system, instructions, tools): they
    count against the budget like the messages do (Claude Code sends ~15k tokens of tools)."""
    if plan.engine is None or not isinstance(plan.body, dict):
        return 0
    return plan.engine.fixed_tokens(plan.body)


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
            Route("/{path:path}", proxy.handle, methods=_METHODS),
        ], lifespan=lifespan)
        self.proxy = proxy
        self.state.proxy = proxy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (scope["type"] != "http" or scope["path"] == _STATUS_PATH
                or scope["method"] not in _METHODS):
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


def _store(url: str) -> PrefixStore:
    if url == "memory:":
        return InMemoryPrefixStore()
    from agentcompact.stores import store_from_url

    return store_from_url(url)


def _archive(config: ProxyConfig, pm: pluggy.PluginManager) -> Any:
    """The archive of the store URL, for a strategy that takes one (``archive``) and has
    none set; else ``None``."""
    from agentcompact._archive import open_archive

    factory = registry(pm).strategy_factory(config.strategy)
    if "archive" in config.strategy_options or "archive" not in _parameters(factory):
        return None
    return open_archive(config.store_url())


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
               store: PrefixStore | None = None) -> ProxyApp:
    """The proxy as a Starlette app (its state is ``app.state.proxy``).

    :param config: settings (default: ``ProxyConfig.from_env()``).
    :param plugins: plugin manager (default: the process-wide one).
    :param store: the prefix store shared by the engines (default: in-memory LRU); pass a
        shared store to run several workers.
    """
    return ProxyApp(CompactionProxy(config if config is not None else ProxyConfig.from_env(),
                                    plugins=plugins, store=store))
