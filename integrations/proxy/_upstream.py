"""The proxy's HTTP client to the providers: one, ``aiohttp``.

Direct upstreams and upstreams behind ``HTTP(S)_PROXY`` (``NO_PROXY`` honoured; read once,
looked up once per host: aiohttp's own ``trust_env`` re-reads them, and ``~/.netrc``, in a
worker thread on every request; aiohttp does the CONNECT tunnelling and proxy
authentication) go through one ``aiohttp`` session. The body goes out as the bytes given
(no re-encoding, no copy), or as it arrives from the client (a held request,
:class:`HeldRequest`), the answer comes back undecoded (no content decoding) as it
arrives, and there is no cookie jar: cookies an upstream sets for one client never reach
another.

**One client, by measurement** (#17's rule: a hand-written client stays only if it saves
>= 5 ms p50 at user scale). Until this module's commit a lean HTTP/1.1 client of the
proxy's own (``_h1.py``, on ``httptools``) served direct upstreams. Side by side in one run,
``benchmarks/proxy_claude_code.py --steps 12 --no-cliff --client h1,aiohttp --buffered``
(``--link-mbps 0`` and ``1000``) at commit c825b40 of branch s4-proxy, the last tree with
both, three runs on a 2-core machine at load 3.4-6: the first answer byte came sooner
through it, p50 of the paired difference, by 1.2 / 4.96 / 3.0 ms at 200k / 1M / 3M tokens
on loopback and 2.6 / 3.8 / 3.2 ms through a 1 Gbit/s link (medians of the three runs;
each run's spread is larger). Under 5 ms at every size: it went. (A fourth run through
the link, at a lower load, gave 2.8 / 0.9 / 12.0 ms: the 3M median of four is 5.7 ms, on
the line; benchmarks/README.md, "The upstream client, side by side".) Held forwarding through
aiohttp stays by the same rule: through the link it saved 2.4 / 7.3 / 27.2 ms p50
against sending the body on once it is all in (docs/proxy.md, "Latency").
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from ...errors import UpstreamDropped, UpstreamError

__all__ = ["HeldRequest", "UpstreamClient", "UpstreamDropped", "UpstreamError",
           "UpstreamResponse", "hold_back", "ssl_context"]

#: headers aiohttp would otherwise add on its own: the client's own (or none) go upstream
_SKIP_AUTO = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})
_NO_BODY = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})
_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)


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


def hold_back(chunk: bytes, fed: int, length: int) -> tuple[bytes, bytes]:
    """``chunk``, the bytes of a ``length``-byte body from offset ``fed`` on, split into
    what may be sent on now and the body's last byte when ``chunk`` ends the body (else
    ``b""``): the last byte is held back."""
    now = length - 1 - fed
    if now >= len(chunk):
        return chunk, b""
    last = chunk[-1:] if fed + len(chunk) == length else b""
    return (chunk[:now] if now > 0 else b""), last


class UpstreamResponse:
    """An upstream answer whose headers have arrived; the body is read as it comes."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._r = response
        self._content = response.content
        self.status_code = response.status
        self.raw_headers: Sequence[tuple[bytes, bytes]] = response.raw_headers
        self.headers = response.headers

    async def next_chunk(self) -> bytes:
        """The body bytes that have arrived since the last call, waiting for some if none
        has (transfer coding removed, content coding kept); ``b""`` at the end."""
        try:
            return await self._content.readany()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise UpstreamDropped(f"{type(exc).__name__}: {exc}") from exc

    async def read(self) -> bytes:
        """The whole body (errors, the reactive retry's first answer)."""
        try:
            return await self._r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise UpstreamDropped(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._r.release()

    def close(self, complete: bool) -> None:
        """Give the connection back to the pool when the body was read to its end, else
        close it (the upstream sees the request cancelled)."""
        if complete:
            self._r.release()
        else:
            self._r.close()


class HeldRequest:
    """A request whose body is sent as it arrives, all of it but its last byte until
    :meth:`release` (:meth:`UpstreamClient.hold`). The request runs in a task of its own;
    its body is what :meth:`feed` gets."""

    def __init__(self, client: UpstreamClient, method: str, target: URL, proxy: str | None,
                 headers: Sequence[tuple[bytes, bytes]], length: int) -> None:
        self._client, self._length = client, length
        self._request = (method, target, proxy, headers)
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._fed = 0
        self._last = b""
        self.done = False
        self.released = False
        sized = [*headers, (b"content-length", str(length).encode())]
        self._task = asyncio.get_running_loop().create_task(
            client._request(method, target, proxy, sized, self._body()))
        self._task.add_done_callback(_retrieved)

    async def _body(self) -> AsyncIterator[bytes]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk

    def feed(self, chunk: bytes) -> None:
        """Send the next body bytes on, all but the body's last one (kept for
        :meth:`release`)."""
        now, last = hold_back(chunk, self._fed, self._length)
        self._fed += len(chunk)
        self._last = last or self._last
        if now:
            self._queue.put_nowait(now)

    def release(self) -> bool:
        """Send the last byte now (the request is complete upstream); ``False`` when the
        body is not all in or the request already ended (then :meth:`commit` sends it
        anew)."""
        if self.done or self.released:
            return self.released
        if not self._last or self._task.done():
            return False
        self._queue.put_nowait(self._last)
        self._queue.put_nowait(None)
        self.released = True
        return True

    async def commit(self, content: bytes) -> UpstreamResponse:
        """Send the last byte (unless :meth:`release` did) of ``content``, the whole body
        fed; return once the answer's headers are in (errors as ``send``). A request that
        ended before that byte went out, or whose body was not ``content``, was never
        complete upstream: it is dropped and the request sent anew."""
        complete = self._fed == self._length == len(content)
        released = self.release() if complete else self.released
        self.done = True
        if not released:
            self._cancel()
            method, target, proxy, headers = self._request
            return await self._client._send(method, target, proxy, headers, content)
        return await self._task

    def abort(self) -> None:
        """Drop the request: the upstream sees an incomplete one on a closed connection."""
        if not self.done:
            self.done = True
            self._cancel()

    def _cancel(self) -> None:
        task = self._task
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:
            task.result().close(False)  # an early answer (an error): its connection goes


def _retrieved(task: asyncio.Task[UpstreamResponse]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a dropped request's failure is not logged


class UpstreamClient:
    """A keep-alive connection pool to the upstreams, created in the serving event loop."""

    def __init__(self, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._session: aiohttp.ClientSession | None = None
        self._env_proxies = urllib.request.getproxies()
        self._proxy_for: dict[tuple[str, str], str | None] = {}

    def route(self, url: str) -> tuple[URL, str | None]:
        """``url`` as aiohttp takes it (the path and query as the client wrote them) and
        the proxy from the environment to reach it through (``None``: connect directly).
        Raises :class:`UpstreamError` for what is not an http(s) URL."""
        try:
            target = URL(url, encoded=True)
        except ValueError as exc:
            raise UpstreamError(f"not an http(s) URL: {type(exc).__name__}") from exc
        if target.scheme not in ("http", "https") or not target.host:
            raise UpstreamError(f"not an http(s) URL (scheme {target.scheme!r})")
        if not self._env_proxies:
            return target, None
        key = (target.scheme, target.host)
        if key not in self._proxy_for:
            proxy = self._env_proxies.get(target.scheme)
            if proxy and urllib.request.proxy_bypass(target.host):
                proxy = None
            self._proxy_for[key] = proxy or None
        return target, self._proxy_for[key]

    async def send(self, method: str, url: str, headers: Sequence[tuple[bytes, bytes]],
                   content: bytes) -> UpstreamResponse:
        """Send a request; return once the response headers are in."""
        target, proxy = self.route(url)
        return await self._send(method, target, proxy, headers, content)

    async def hold(self, method: str, url: str, headers: Sequence[tuple[bytes, bytes]],
                   length: int) -> HeldRequest | None:
        """Start a request whose body of ``length`` bytes arrives later (:meth:`HeldRequest.feed`),
        all of it but its last byte: :meth:`HeldRequest.commit` sends that byte and waits
        for the answer as :meth:`send` does, :meth:`HeldRequest.abort` drops the connection.

        Until the last byte arrives the upstream cannot act on the request (its length
        is announced), so a request held then aborted never reached it; meanwhile the
        body crosses the network while it still arrives and while the caller works out
        whether it is the body to send. ``None`` for a body under two bytes, a bad URL or
        an upstream that refuses the connection (``send`` reports them)."""
        if length < 2:
            return None
        try:
            target, proxy = self.route(url)
            return HeldRequest(self, method, target, proxy, headers, length)
        except (UpstreamError, ValueError):
            return None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=15,
                                         ttl_dns_cache=300, ssl=ssl_context())
        timeout = aiohttp.ClientTimeout(total=None, connect=None,
                                        sock_connect=self.connect_timeout,
                                        sock_read=self.read_timeout)
        return aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     auto_decompress=False, trust_env=False,
                                     cookie_jar=aiohttp.DummyCookieJar(),
                                     skip_auto_headers=_SKIP_AUTO)

    async def _send(self, method: str, target: URL, proxy: str | None,
                    headers: Sequence[tuple[bytes, bytes]], content: bytes
                    ) -> UpstreamResponse:
        with_body = bool(content) or method not in _NO_BODY
        return await self._request(method, target, proxy, headers,
                                   content if with_body else None)

    async def _request(self, method: str, target: URL, proxy: str | None,
                       headers: Sequence[tuple[bytes, bytes]], data: Any
                       ) -> UpstreamResponse:
        if self._session is None:
            self._session = self._open()
        hdrs: CIMultiDict[str] = CIMultiDict(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in headers)
        kwargs: dict[str, Any] = {"headers": hdrs, "allow_redirects": False,
                                  "compress": None, "chunked": None, "proxy": proxy}
        if data is not None:
            kwargs["data"] = data
        try:
            response = await self._session.request(method, target, **kwargs)
        except _ERRORS as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc
        return UpstreamResponse(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
