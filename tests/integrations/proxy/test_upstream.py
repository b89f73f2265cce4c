"""The proxy's upstream client (``integrations/proxy/_upstream.py``, aiohttp) against a raw
HTTP/1.1 server: what goes out, streamed answers, failures, held requests, TLS."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from agentcompact.integrations.proxy._upstream import (
    UpstreamClient,
    UpstreamDropped,
    UpstreamError,
    hold_back,
)

pytestmark = pytest.mark.network

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
Request = tuple[bytes, bytes]  # (head, body)
Run = Callable[[Coroutine[Any, Any, Any]], Any]
Reader, Writer = asyncio.StreamReader, asyncio.StreamWriter
Handler = Callable[["Upstream", Reader, Writer], Awaitable[None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Run a coroutine on a fresh loop, failing (not hanging) after 5 s."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else None

    def run_(coro: Coroutine[Any, Any, Any]) -> Any:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(asyncio.wait_for(coro, 5))

    return run_


class Upstream:
    """A raw HTTP/1.1 server on 127.0.0.1, ``handler(up, reader, writer)`` serving each
    connection. Counts connections; records the complete requests read, the bodies cut off
    by EOF and the bytes of the body being received; closes its clients at exit."""

    def __init__(self, handler: Handler, ssl_ctx: ssl.SSLContext | None = None) -> None:
        self.handler, self.ssl = handler, ssl_ctx
        self.accepted = 0
        self.requests: list[Request] = []
        self.incomplete: list[bytes] = []
        self.receiving = bytearray()
        self.writers: list[Writer] = []
        self.eof, self.go = asyncio.Event(), asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._clients: list[UpstreamClient] = []

    async def __aenter__(self) -> Upstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for client in self._clients:
            await client.aclose()
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()  # the handlers end on their own (3.11 logs cancelled ones)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1)
        await self.server.wait_closed()
        await asyncio.sleep(0.01)  # closed transports finish closing

    def client(self, read_timeout: float = 2) -> UpstreamClient:
        self._clients.append(UpstreamClient(2, read_timeout))
        return self._clients[-1]

    def url(self, path: str = "/", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    async def _serve(self, reader: Reader, writer: Writer) -> None:
        self.accepted += 1
        self.writers.append(writer)
        self._tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: Reader) -> Request | None:
        """The next request (body by content-length); None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = self.receiving = bytearray()
        while len(body) < length:
            if not (chunk := await reader.read(length - len(body))):
                self.incomplete.append(bytes(body))
                return None
            body += chunk
        self.requests.append((head, bytes(body)))
        return head, bytes(body)

    async def until_eof(self, reader: Reader) -> None:
        """Wait for the client to close the connection, then set ``eof``."""
        try:
            await reader.read()
        except ConnectionError:
            pass
        self.eof.set()


def answering(*answers: bytes, close: bool = False) -> Handler:
    """A keep-alive handler giving each request (on any connection) the next of
    ``answers``, then ``OK``; with ``close``, it closes the connection after answering."""
    queue = list(answers)

    async def handler(up: Upstream, reader: Reader, writer: Writer) -> None:
        while await up.read_request(reader) is not None:
            writer.write(queue.pop(0) if queue else OK)
            await writer.drain()
            if close:
                return

    return handler


async def get(client: UpstreamClient, url: str, method: str = "GET", body: bytes = b"") -> bytes:
    return await (await client.send(method, url, [], body)).read()


def _lines(head: bytes) -> list[bytes]:
    return head.split(b"\r\n")


def test_request_goes_out_with_the_client_headers_and_body(run: Run) -> None:
    """The request line as written (path and query untouched), the client's headers in
    its order and case, the length, a 230 kB body intact; none of the headers aiohttp
    would add of its own (user agent, accept, encodings, content type)."""
    body = os.urandom(230_000)
    headers = [(b"x-api-key", b"k"), (b"Content-Type", b"application/json"), (b"x-b", b"2")]

    async def main() -> None:
        async with Upstream(answering()) as up:
            client = up.client()
            resp = await client.send("POST", up.url("/v1/m?beta=true&q=%2F"), headers, body)
            assert (resp.status_code, await resp.read()) == (200, b"ok")
            assert await get(client, up.url("/models")) == b"ok"
        (head, got), (head2, _) = up.requests
        lines = _lines(head)
        assert lines[0] == b"POST /v1/m?beta=true&q=%2F HTTP/1.1" and got == body
        named = [line for line in lines if line.lower().startswith((b"x-", b"content-type"))]
        assert named == [b"x-api-key: k", b"Content-Type: application/json", b"x-b: 2"]
        lower = head.lower()
        assert b"content-length: 230000\r\n" in lower
        for added in (b"user-agent", b"accept", b"accept-encoding"):
            assert b"\r\n" + added + b":" not in lower
        assert _lines(head2)[0] == b"GET /models HTTP/1.1"

    run(main())


def test_streamed_events_arrive_as_sent(run: Run) -> None:
    """Each SSE event is handed on as it comes (the server sends the next one only once
    the client has this one), then ``b""``."""
    events = [b"event: a\ndata: 1\n\n", b"event: b\ndata: 22\n\n", b"event: c\ndata: 333\n\n"]

    async def handler(up: Upstream, reader: Reader, writer: Writer) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await up.go.wait()
            up.go.clear()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        await up.until_eof(reader)

    async def main() -> None:
        async with Upstream(handler) as up:
            resp = await up.client(read_timeout=1).send("POST", up.url(), [], b"{}")
            for event in events:
                assert await resp.next_chunk() == event
                up.go.set()
            assert await resp.next_chunk() == b""
            resp.close(True)

    run(main())


def test_connection_refused_is_an_upstream_error(run: Run) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there

    async def main() -> None:
        client = UpstreamClient(1, 1)
        try:
            with pytest.raises(UpstreamError, match=f"127.0.0.1:{port}"):
                await client.send("GET", f"http://127.0.0.1:{port}/", [], b"")
            with pytest.raises(UpstreamError, match="not an http"):
                await client.send("GET", "ftp://127.0.0.1/", [], b"")
        finally:
            await client.aclose()

    run(main())


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nten bytes.",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\na\r\nten bytes.\r\n5\r\nab",
], ids=["length", "chunked"])
def test_close_mid_body_is_dropped(run: Run, answer: bytes) -> None:
    """The bytes that came are delivered, then UpstreamDropped (not a clean end)."""

    async def main() -> None:
        async with Upstream(answering(answer, close=True)) as up:
            resp = await up.client().send("GET", up.url(), [], b"")
            assert (await resp.next_chunk()).startswith(b"ten bytes.")
            with pytest.raises(UpstreamDropped):
                while await resp.next_chunk():
                    pass
            resp.close(False)

    run(main())


def test_hold_back_keeps_the_last_byte() -> None:
    assert hold_back(b"abc", 0, 10) == (b"abc", b"")
    assert hold_back(b"abc", 7, 10) == (b"ab", b"c")
    assert hold_back(b"c", 9, 10) == (b"", b"c")
    assert hold_back(b"abc", 0, 5) == (b"abc", b"")  # the body is not all in yet


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_hold_sends_all_but_the_last_byte(run: Run, commit: bool) -> None:
    """Held and fed the body in pieces, the server has all but the body's last byte and
    no request; commit sends that byte and the answer comes; abort closes the connection:
    the server sees an incomplete body, never a request."""
    body = os.urandom(100_000)
    created = b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\nheld"

    async def main() -> None:
        async with Upstream(answering(created)) as up:
            client = up.client()
            held = await client.hold("POST", up.url("/held"), [(b"x-a", b"1")], len(body))
            assert held is not None
            for start in range(0, len(body), 30_000):
                held.feed(body[start:start + 30_000])
            while len(up.receiving) < len(body) - 1:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)
            assert bytes(up.receiving) == body[:-1] and up.requests == []
            if commit:
                resp = await held.commit(body)
                assert (resp.status_code, await resp.read()) == (201, b"held")
                (head, got), = up.requests
                assert _lines(head)[0] == b"POST /held HTTP/1.1" and b"x-a: 1" in _lines(head)
                assert got == body
            else:
                held.abort()
                while not up.incomplete:
                    await asyncio.sleep(0.005)
                assert up.incomplete == [body[:-1]] and up.requests == []

    run(main())


def test_hold_needs_two_bytes_and_an_http_url(run: Run) -> None:
    async def main() -> None:
        async with Upstream(answering()) as up:
            client = up.client()
            assert await client.hold("POST", up.url(), [], 1) is None
            assert await client.hold("POST", "ftp://127.0.0.1/", [], 10) is None
            held = await client.hold("POST", up.url("/held"), [], 2)
            assert held is not None
            held.feed(b"{")
            held.feed(b"}")
            assert await (await held.commit(b"{}")).read() == b"ok"
            assert [b for _, b in up.requests] == [b"{}"]

    run(main())


def test_held_whose_body_is_not_the_one_fed_is_sent_anew(run: Run) -> None:
    """A body shorter than declared (fed in part) never completes the held request: it is
    dropped and the body given to commit is sent as a request of its own."""

    async def main() -> None:
        async with Upstream(answering()) as up:
            client = up.client()
            held = await client.hold("POST", up.url("/held"), [], 10)
            assert held is not None
            held.feed(b"12345")
            while bytes(up.receiving) != b"12345":
                await asyncio.sleep(0.005)
            assert await (await held.commit(b"12345")).read() == b"ok"
            while not up.incomplete:
                await asyncio.sleep(0.005)
            assert up.incomplete == [b"12345"]
            assert [b for _, b in up.requests] == [b"12345"]

    run(main())


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for ``localhost`` (made with the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate")
    where = tmp_path_factory.mktemp("tls")
    crt, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
    return crt, key


def test_tls_verifies_the_upstream(run: Run, cert: tuple[Path, Path],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Over https, with SNI: trusting the certificate (``SSL_CERT_FILE``, as a user's CA
    set-up would), the request gets through; the same trust refuses another host name
    (127.0.0.1), and without it the certificate is refused."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(*cert)
    names: list[str | None] = []
    server_ctx.sni_callback = lambda _sock, name, _ctx: names.append(name)  # type: ignore

    async def main() -> None:
        async with Upstream(answering(), server_ctx) as up:
            url = up.url("/v1", host="localhost", scheme="https")
            monkeypatch.setenv("SSL_CERT_FILE", str(cert[0]))
            trusting = up.client()
            assert [await get(trusting, url), await get(trusting, url)] == [b"ok", b"ok"]
            assert names[:1] == ["localhost"] and len(up.requests) == 2
            with pytest.raises(UpstreamError, match="(?i)mismatch|match"):
                await get(trusting, up.url(host="127.0.0.1", scheme="https"))
            monkeypatch.delenv("SSL_CERT_FILE")
            with pytest.raises(UpstreamError, match="CERTIFICATE_VERIFY_FAILED"):
                await get(up.client(), url)
            assert len(up.requests) == 2

    run(main())
