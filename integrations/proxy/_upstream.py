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
from collections.abc import Sequence
from typing import Any

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from ._h1 import H1Client, H1Response, Held, UpstreamDropped, UpstreamError, ssl_context

__all__ = ["UpstreamClient", "UpstreamDropped", "UpstreamError", "UpstreamResponse"]

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


class UpstreamClient:
    """A keep-alive connection pool to the upstreams, created in the serving event loop."""

    def __init__(self, connect_timeout: float, read_timeout: float,
                 max_keepalive: int = 128) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_keepalive = max_keepalive
        self._session: aiohttp.ClientSession | None = None
        self._direct = H1Client(connect_timeout, read_timeout)
        self._env_proxies = urllib.request.getproxies()
        self._proxy_for: dict[tuple[str, str], str | None] = {}

    def _via_proxy(self, url: str) -> tuple[URL, str] | None:
        """``url`` and the proxy from the environment to reach it through, or ``None`` to
        connect directly."""
        if not self._env_proxies:
            return None
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
        return None if proxy is None else (target, proxy)

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
        via = self._via_proxy(url)
        if via is not None:
            return await self._send_proxied(method, *via, headers, content)
        try:
            return await self._direct.send(method, url, headers, content)
        except ValueError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc

    def hold(self, method: str, url: str, headers: Sequence[tuple[bytes, bytes]],
             content: bytes) -> Held | None:
        """:meth:`.h1.H1Client.hold` for a direct upstream (``None`` through a proxy)."""
        if self._via_proxy(url) is not None:
            return None
        try:
            return self._direct.hold(method, url, headers, content)
        except ValueError:
            return None  # ``send`` reports the bad URL

    async def _send_proxied(self, method: str, target: URL, proxy: str,
                            headers: Sequence[tuple[bytes, bytes]], content: bytes
                            ) -> ProxiedResponse:
        if self._session is None:
            self._session = self._open()
        hdrs: CIMultiDict[str] = CIMultiDict(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in headers)
        kwargs: dict[str, Any] = {"headers": hdrs, "allow_redirects": False,
                                  "compress": None, "chunked": None, "proxy": proxy}
        if content or method not in ("GET", "HEAD", "OPTIONS", "DELETE"):
            kwargs["data"] = content
        try:
            response = await self._session.request(method, target, **kwargs)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc
        return ProxiedResponse(response)

    async def aclose(self) -> None:
        await self._direct.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None
