"""The proxy's HTTP client to the providers.

Direct connections use :mod:`.h1`, a lean HTTP/1.1 client on ``httptools`` whose
per-request cost is a third of ``aiohttp``'s and a sixth of ``httpx``'s in the proxy's
process: the hop to the upstream is most of the latency a proxy adds. An upstream
reached through ``HTTP(S)_PROXY`` (``NO_PROXY`` honoured; read once, looked up once per
host: aiohttp's own ``trust_env`` re-reads them, and ``~/.netrc``, in a worker thread on
every request) goes through ``aiohttp``, which tunnels and authenticates. Either way the
body goes out as the bytes given (no re-encoding, no copy), the answer comes back
undecoded (no content decoding) as it arrives, and there is no cookie jar: cookies an
upstream sets for one client never reach another.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from .h1 import H1Client, H1Response, Held, UpstreamDropped, UpstreamError, ssl_context

__all__ = ["HeldRequest", "UpstreamClient", "UpstreamDropped", "UpstreamError",
           "UpstreamResponse"]

#: headers aiohttp would otherwise add on its own: the client's own (or none) go upstream
_SKIP_AUTO = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})


class ProxiedResponse:
    """An answer through ``aiohttp`` whose headers have arrived (the interface of
    :class:`.h1.H1Response`); the body is read as it comes."""

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


#: an upstream answer whose headers have arrived
UpstreamResponse = H1Response | ProxiedResponse


class ProxiedHeld:
    """:class:`.h1.Held` through ``aiohttp``: the request runs in a task of its own whose
    body is what :meth:`feed` gets, all of it but its last byte until :meth:`release`."""

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

    async def _body(self) -> AsyncIterator[bytes]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk

    def feed(self, chunk: bytes) -> None:
        fed, self._fed = self._fed, self._fed + len(chunk)
        now = self._length - 1 - fed
        if now >= len(chunk):
            self._queue.put_nowait(chunk)
            return
        if now > 0:
            self._queue.put_nowait(chunk[:now])
        if self._fed == self._length:
            self._last = chunk[-1:]

    def release(self) -> bool:
        if self.done or self.released:
            return self.released
        if not self._last or self._task.done():
            return False
        self._queue.put_nowait(self._last)
        self._queue.put_nowait(None)
        self.released = True
        return True

    async def commit(self, content: bytes) -> ProxiedResponse:
        complete = self._fed == self._length == len(content)
        released = self.release() if complete else self.released
        self.done = True
        if not released:
            self._cancel()
            method, target, proxy, headers = self._request
            return await self._client._send_proxied(method, target, proxy, headers, content)
        return await self._task

    def _cancel(self) -> None:
        task = self._task
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:
            task.result().close(False)  # an early answer (an error): its connection goes

    def abort(self) -> None:
        if not self.done:
            self.done = True
            self._cancel()


#: a request sent but for its body's last byte
HeldRequest = Held | ProxiedHeld


class UpstreamClient:
    """A keep-alive connection pool to the upstreams, created in the serving event loop.

    :param direct: the client of direct connections: ``"h1"`` (:mod:`.h1`) or
        ``"aiohttp"`` (what a proxied upstream always goes through).
    """

    def __init__(self, connect_timeout: float, read_timeout: float,
                 max_keepalive: int = 128, *, direct: str = "h1") -> None:
        if direct not in ("h1", "aiohttp"):
            raise ValueError(f"direct client {direct!r}: expected 'h1' or 'aiohttp'")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_keepalive = max_keepalive
        self._session: aiohttp.ClientSession | None = None
        self._direct = H1Client(connect_timeout, read_timeout) if direct == "h1" else None
        self._env_proxies = urllib.request.getproxies()
        self._proxy_for: dict[tuple[str, str], str | None] = {}

    def _route(self, url: str) -> tuple[URL, str | None] | None:
        """``url`` and the proxy from the environment to reach it through (``None``: no
        proxy) when ``aiohttp`` carries it; ``None`` when :mod:`.h1` does."""
        if not self._env_proxies:
            return None if self._direct is not None else self._target(url)
        try:
            target = URL(url, encoded=True)  # the path and query as the client wrote them
        except ValueError:
            return None  # not a URL: the direct send reports it (502), never a 500 here
        key = (target.scheme, target.host or "")
        if key not in self._proxy_for:
            proxy = self._env_proxies.get(target.scheme)
            if proxy and target.host and urllib.request.proxy_bypass(target.host):
                proxy = None
            self._proxy_for[key] = proxy or None
        proxy = self._proxy_for[key]
        if proxy is None and self._direct is not None:
            return None
        return target, proxy

    def _via_proxy(self, url: str) -> tuple[URL, str | None] | None:
        route = self._route(url)
        return None if route is None or route[1] is None else route

    @staticmethod
    def _target(url: str) -> tuple[URL, None] | None:
        try:
            return URL(url, encoded=True), None
        except ValueError:
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

    async def send(self, method: str, url: str, headers: Sequence[tuple[bytes, bytes]],
                   content: bytes) -> UpstreamResponse:
        """Send a request; return once the response headers are in."""
        route = self._route(url)
        if route is not None:
            return await self._send_proxied(method, *route, headers, content)
        if self._direct is None:
            raise UpstreamError(f"not an http(s) URL: {url!r}")
        try:
            return await self._direct.send(method, url, headers, content)
        except ValueError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc

    async def hold(self, method: str, url: str, headers: Sequence[tuple[bytes, bytes]],
                   length: int) -> HeldRequest | None:
        """Start a request whose body of ``length`` bytes is fed as it arrives, sent but
        for its last byte until released (:meth:`.h1.H1Client.hold`); ``None`` when it
        cannot start (a body under two bytes, a bad URL: ``send`` reports it)."""
        if length < 2:
            return None
        route = self._route(url)
        if route is not None:
            if self._session is None:
                self._session = self._open()
            return ProxiedHeld(self, method, *route, headers, length)
        if self._direct is None:
            return None
        try:
            return await self._direct.hold(method, url, headers, length)
        except (ValueError, UpstreamError):
            return None  # ``send`` reports the bad URL or the refused connection

    async def _request(self, method: str, target: URL, proxy: str | None,
                       headers: Sequence[tuple[bytes, bytes]], data: Any) -> ProxiedResponse:
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
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc
        return ProxiedResponse(response)

    async def _send_proxied(self, method: str, target: URL, proxy: str | None,
                            headers: Sequence[tuple[bytes, bytes]], content: bytes
                            ) -> ProxiedResponse:
        with_body = content or method not in ("GET", "HEAD", "OPTIONS", "DELETE")
        return await self._request(method, target, proxy, headers,
                                   content if with_body else None)

    async def aclose(self) -> None:
        if self._direct is not None:
            await self._direct.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None
