"""A lean HTTP/1.1 client for the proxy's hop to the providers.

One ``asyncio`` protocol per connection, ``httptools`` (llhttp, the parser uvicorn serves
with) to read the answers, a keep-alive pool per upstream origin. A proxied request is
one ``writelines`` of the request head and the body as given (never copied or
re-encoded); the answer's body is handed on as the bytes that arrived (chunked transfer
coding removed, content coding kept). Nothing else happens per request: no cookie jar,
no redirects, no header objects, no tracing hooks, no per-request timer tasks.

This is the part of a proxied request a general-purpose client makes expensive: measured
in the proxy's process at 50k-token bodies, ``aiohttp`` spent ~0.2 ms of CPU per request
on it, this client about a third of that (``benchmarks/proxy_latency.py``). Requests to
an origin reached through ``HTTP(S)_PROXY`` go through ``aiohttp``
(:mod:`.upstream`), which does CONNECT tunnelling and proxy authentication.

Semantics kept from the general clients: connect and read timeouts (a read timeout
bounds each wait for bytes, as ``sock_read`` does); TLS verified against the given
context with SNI; a kept-alive connection found closed before use is replaced; a
request whose reused connection was closed before any answer byte is retried on a fresh
one only for idempotent methods (as ``aiohttp`` does: a POST may have been received);
backpressure (reading pauses while more than ``_HIGH_WATER`` bytes wait unread); a
connection whose answer was not read to its end is closed, never reused (so the
upstream sees the request cancelled).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Sequence
from typing import cast
from urllib.parse import urlsplit

import httptools

from ...errors import UpstreamDropped, UpstreamError

__all__ = ["H1Client", "H1Response", "Held", "Origin", "UpstreamDropped", "UpstreamError",
           "hold_back"]

#: unread answer bytes above which the connection stops reading (until the relay drains)
_HIGH_WATER = 1 << 20
#: asyncio's default ``writelines`` (concatenates, then writes: a copy of the body)
_JOINING_WRITELINES = asyncio.WriteTransport.writelines
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})



class AnswerFailed(UpstreamDropped):
    """The connection failed or a read timed out; ``before_answer`` when no byte of the
    answer had arrived."""

    def __init__(self, message: str, *, before_answer: bool) -> None:
        super().__init__(message)
        self.before_answer = before_answer


def ssl_context() -> ssl.SSLContext:
    """The system's CA store (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` honoured) plus certifi's
    bundle when installed (what httpx trusts), so either kind of set-up verifies."""
    context = ssl.create_default_context()
    try:
        import certifi

        context.load_verify_locations(certifi.where())
    except (ImportError, OSError):
        pass
    return context


class Origin:
    """Where a base URL's requests go: address, TLS, and the ``Host`` header."""

    __slots__ = ("host", "host_header", "key", "port", "server_hostname", "ssl")

    def __init__(self, scheme: str, host: str, port: int | None,
                 context: ssl.SSLContext | None) -> None:
        tls = scheme == "https"
        default = 443 if tls else 80
        self.host = host
        self.port = port or default
        self.ssl = context if tls else None
        self.server_hostname = host if tls else None
        name = f"[{host}]" if ":" in host else host
        self.host_header = (name if self.port == default else f"{name}:{self.port}").encode(
            "idna" if not host.isascii() else "ascii")
        self.key = (scheme, host, self.port)

    @classmethod
    def split(cls, url: str, context: ssl.SSLContext | None) -> tuple[Origin, bytes]:
        """The origin of an absolute ``url`` and its request target (path and query, as
        written)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        target = parts.path or "/"
        if parts.query:
            target = f"{target}?{parts.query}"
        return (cls(parts.scheme, parts.hostname, parts.port, context),
                target.encode("latin-1"))


class _Connection(asyncio.Protocol):
    """One upstream connection: writes a request, parses its answer, then is reused."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[None] | None = None
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.waiter: asyncio.Future[None] | None = None
        self.complete = False
        self.answered = False  # any byte of the current answer arrived
        self.error: AnswerFailed | None = None
        self.paused = False
        self.until_close = False  # a body without length or chunking: ends at close
        self.no_body = False  # a HEAD request's answer has no body
        self.keep_alive = False

    # --- transport events --------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        if self.head is None:  # bytes while idle: the connection cannot be reused
            self._close()
            return
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"malformed answer from upstream: {exc}")
            self._close()

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head is None or self.complete:
            return
        if self.until_close and self.head.done() and exc is None:
            self.complete = True
            self._wake()
        else:
            self._fail(f"upstream closed the connection{f': {exc}' if exc else ''}")

    # --- parser callbacks --------------------------------------------------------
    def on_header(self, name: bytes, value: bytes | None) -> None:
        if self.status:  # a chunked body's trailer: not a header of the answer
            return
        self.raw_headers.append((name, value or b""))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.raw_headers = []  # an interim answer (100 Continue): wait for the real one
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()  # reset once the message ends
        chunked = length = False
        for name, value in self.raw_headers:
            lower = name.lower()
            if lower == b"content-length":
                length = True
            elif lower == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        self.until_close = not (chunked or length or status in (204, 304))
        assert self.head is not None
        if not self.head.done():
            self.head.set_result(None)
        if self.no_body:
            self.complete = True

    def on_body(self, body: bytes) -> None:
        if self.no_body:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status:  # not an interim answer's end
            self.complete = True
            self._wake()

    # --- state -------------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = AnswerFailed(message, before_answer=not self.answered)
        head = self.head
        if head is not None and not head.done():
            head.set_exception(self.error)
        self._wake()

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def start(self, parts: Sequence[bytes | memoryview], *, no_body: bool
              ) -> asyncio.Future[None]:
        """Write a request (its head and body, or the first part of them); the returned
        future resolves when the answer's head is in."""
        self._reset()
        self.no_body = no_body
        self.head = self.loop.create_future()
        transport = self.transport
        assert transport is not None
        if type(transport).writelines is _JOINING_WRITELINES:
            for part in parts:  # no copy of the body into one buffer (asyncio before 3.12)
                transport.write(part)
        else:
            transport.writelines(parts)  # uvloop: one writev
        return self.head

    def reusable(self) -> bool:
        return (self.complete and not self.closed and not self.until_close and not self.no_body
                and not self.chunks and self.keep_alive)


def _timed_out(waiter: asyncio.Future[None], conn: _Connection, what: str) -> None:
    if not waiter.done():
        conn._fail(f"upstream read timeout ({what})")


class _Stale(Exception):
    """A reused connection closed before any byte of the answer (the upstream had closed
    it while idle)."""


def hold_back(chunk: bytes, fed: int, length: int) -> tuple[bytes, bytes]:
    """``chunk``, the bytes of a ``length``-byte body from offset ``fed`` on, split into
    what may be sent on now and the body's last byte when ``chunk`` ends the body (else
    ``b""``): the last byte is held back."""
    now = length - 1 - fed
    if now >= len(chunk):
        return chunk, b""
    last = chunk[-1:] if fed + len(chunk) == length else b""
    return (chunk[:now] if now > 0 else b""), last


class Held:
    """A request whose body is sent as it arrives but for its last byte
    (:meth:`H1Client.hold`)."""

    __slots__ = ("_client", "_conn", "_fed", "_last", "_length", "_origin", "_ready",
                 "_request", "done", "released")

    def __init__(self, client: H1Client, origin: Origin, conn: _Connection,
                 ready: asyncio.Future[None],
                 request: tuple[str, str, Sequence[tuple[bytes, bytes]]], length: int) -> None:
        self._client, self._origin, self._conn = client, origin, conn
        self._ready, self._request, self._length = ready, request, length
        self._fed = 0
        self._last = b""
        self.done = False
        self.released = False

    def feed(self, chunk: bytes) -> None:
        """Send the next body bytes on, all but the body's last one (kept for
        :meth:`release`)."""
        now, last = hold_back(chunk, self._fed, self._length)
        self._fed += len(chunk)
        self._last = last or self._last
        conn = self._conn
        if now and not (self.done or conn.closed or conn.transport is None):
            conn.transport.write(now)

    def release(self) -> bool:
        """Send the last byte now (the request is complete upstream); ``False`` when the
        connection had closed meanwhile or the body is not all in (then :meth:`commit`
        sends the request anew)."""
        if self.done or self.released:
            return self.released
        conn = self._conn
        if conn.closed or conn.transport is None or not self._last:
            return False
        conn.transport.write(self._last)
        self.released = True
        return True

    async def commit(self, content: bytes) -> H1Response:
        """Send the last byte (unless :meth:`release` did) of ``content``, the whole body
        fed; return once the answer's head is in (errors as ``send``:
        :class:`UpstreamError` before the head). A connection the upstream closed before
        that byte went out had carried no complete request, nor one whose body was not
        ``content``: the request is sent anew."""
        conn = self._conn
        complete = self._fed == self._length == len(content)
        released = self.release() if complete else self.released
        self.done = True
        if not released:  # no complete request went out on this connection
            conn.abort()
            if self._ready.done() and not self._ready.cancelled():
                self._ready.exception()  # retrieved: the closed connection's is not logged
            return await self._client.send(*self._request, content)
        try:
            return await self._client._answer(self._origin, conn, self._ready)
        except _Stale:
            raise UpstreamError("upstream closed the kept-alive connection") from None

    def abort(self) -> None:
        """Drop the request: the upstream sees an incomplete one on a closed connection."""
        if not self.done:
            self.done = True
            self._conn.abort()
            ready = self._ready
            if not ready.done():
                ready.cancel()
            elif not ready.cancelled():
                ready.exception()  # retrieved: an early answer's failure is not logged


class H1Response:
    """An answer whose head has arrived; the body is read as it comes."""

    __slots__ = ("_client", "_conn", "_headers", "_origin", "raw_headers", "status_code")

    def __init__(self, client: H1Client, origin: Origin, conn: _Connection) -> None:
        self._client = client
        self._origin = origin
        self._conn = conn
        self.status_code = conn.status
        self.raw_headers: Sequence[tuple[bytes, bytes]] = conn.raw_headers
        self._headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str]:
        """Lower-cased header names to values (the last one of a repeated header)."""
        if self._headers is None:
            self._headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                             for k, v in self.raw_headers}
        return self._headers

    async def next_chunk(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some if none
        has; ``b""`` at the end. Raises :class:`AnswerFailed` when the connection fails
        or a read times out first (an :class:`UpstreamDropped`)."""
        conn = self._conn
        while not conn.chunks:
            if conn.complete:
                return b""
            if conn.error is not None:
                raise conn.error
            waiter = conn.waiter = conn.loop.create_future()
            timer = conn.loop.call_later(self._client.read_timeout, _timed_out, waiter, conn,
                                         "waiting for the body")
            try:
                await waiter
            finally:
                timer.cancel()
                conn.waiter = None
        chunks = conn.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        conn.buffered = 0
        if conn.paused and conn.transport is not None:
            conn.paused = False
            conn.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        """The whole body (then the connection goes back to the pool)."""
        parts = []
        try:
            while chunk := await self.next_chunk():
                parts.append(chunk)
        except BaseException:
            self.close(False)
            raise
        self.close(True)
        return b"".join(parts)

    def close(self, complete: bool) -> None:
        """Back to the pool when the answer was read to its end, else closed."""
        conn = self._conn
        if complete and conn.reusable():
            self._client._release(self._origin, conn)
        else:
            conn.abort()


class H1Client:
    """Keep-alive connections to the upstream origins; create it in the serving loop."""

    def __init__(self, connect_timeout: float, read_timeout: float, *,
                 ssl_context: ssl.SSLContext | None = None, keepalive: float = 15.0,
                 max_idle_per_origin: int = 128) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive = keepalive
        self.max_idle = max_idle_per_origin
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._origins: dict[str, tuple[Origin, bytes]] = {}
        self._by_key: dict[tuple[str, str, int], Origin] = {}

    def origin(self, url: str) -> tuple[Origin, bytes]:
        """The origin and request target of ``url`` (remembered: a proxy sends to a few
        URLs over and over)."""
        known = self._origins.get(url)
        if known is not None:
            return known
        if self._ssl is None and url.startswith("https:"):
            self._ssl = ssl_context()
        origin, target = Origin.split(url, self._ssl)
        same = self._by_key.setdefault(origin.key, origin)  # one Origin per key
        if len(self._origins) >= 1024:
            self._origins.clear()
        self._origins[url] = (same, target)
        return same, target

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop), origin.host, origin.port, ssl=origin.ssl,
                    server_hostname=origin.server_hostname)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise UpstreamError(f"cannot connect to {origin.host}:{origin.port}: "
                                   f"{type(exc).__name__}: {exc}") from exc
        return conn

    def _take(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin.key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive:
                return conn
            conn.abort()
        return None

    def _release(self, origin: Origin, conn: _Connection) -> None:
        conn.head = None
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(origin.key, [])
        if len(idle) >= self.max_idle:
            idle.pop(0).abort()
        idle.append(conn)

    @staticmethod
    def _head(method: str, origin: Origin, target: bytes,
              headers: Sequence[tuple[bytes, bytes]], length: int) -> bytes:
        lines = [b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (method.encode("ascii"), target,
                                                      origin.host_header)]
        lines += [b"%s: %s\r\n" % (k, v) for k, v in headers]
        if length or method not in ("GET", "HEAD", "OPTIONS", "DELETE", "TRACE"):
            lines.append(b"content-length: %d\r\n" % length)
        lines.append(b"\r\n")
        return b"".join(lines)

    async def send(self, method: str, url: str, headers: Sequence[tuple[bytes, bytes]],
                   content: bytes) -> H1Response:
        """Send a request and return once the answer's head is in. ``headers`` go out as
        given, plus ``Host`` and ``Content-Length`` (the caller drops hop-by-hop ones and
        any ``Host``/``Content-Length`` of its own)."""
        origin, target = self.origin(url)
        head = self._head(method, origin, target, headers, len(content))
        parts = (head, content) if content else (head,)
        retry = method in _IDEMPOTENT
        while True:
            conn = self._take(origin)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(origin)
            ready = conn.start(parts, no_body=method == "HEAD")
            try:
                return await self._answer(origin, conn, ready)
            except _Stale:
                if not (reused and retry):
                    raise UpstreamError("upstream closed the kept-alive connection") from None
                retry = False  # a kept-alive connection the upstream had closed: once more

    async def _answer(self, origin: Origin, conn: _Connection, ready: asyncio.Future[None]
                      ) -> H1Response:
        """Wait for the answer's head to a request written on ``conn``."""
        timer = conn.loop.call_later(self.read_timeout, _timed_out, ready, conn,
                                     "waiting for the answer")
        try:
            await ready
        except AnswerFailed as exc:
            stale = conn.closed and exc.before_answer  # not a timeout
            conn.abort()
            if stale:
                raise _Stale from exc
            raise UpstreamError(str(exc)) from exc
        except BaseException:
            conn.abort()  # cancelled: the upstream sees the request dropped
            raise
        finally:
            timer.cancel()
        return H1Response(self, origin, conn)

    async def hold(self, method: str, url: str, headers: Sequence[tuple[bytes, bytes]],
                   length: int) -> Held | None:
        """Start a request whose body of ``length`` bytes arrives later: the head goes out
        now on a kept-alive connection, the body as :meth:`Held.feed`
        gets it, all of it but its last byte: :meth:`Held.commit` sends that byte (and
        waits for the answer as :meth:`send` does), :meth:`Held.abort` drops the
        connection.

        Until the last byte arrives the upstream cannot act on the request (its length
        is announced), so a request held then aborted never reached it; meanwhile the
        body crosses the network while it is still arriving and while the caller works
        out whether it is the body to send. ``None`` when no idle connection is at hand
        (no connection is opened for it: a slow or failing connect would delay the
        body's receipt, then ``send`` would wait for it again) or the body is shorter
        than two bytes."""
        if length < 2:
            return None
        origin, target = self.origin(url)
        conn = self._take(origin)
        if conn is None:
            return None
        head = self._head(method, origin, target, headers, length)
        ready = conn.start((head,), no_body=method == "HEAD")
        return Held(self, origin, conn, ready, (method, url, headers), length)

    async def aclose(self) -> None:
        """Close the idle connections (answers being relayed close theirs at their end)."""
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()

    def __repr__(self) -> str:
        return f"<H1Client idle={sum(len(v) for v in self._idle.values())}>"


