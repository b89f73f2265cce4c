"""Wire tests for the proxy's HTTP/1.1 client (:mod:`agentcompact.integrations.proxy._h1`):
real loopback sockets, raw asyncio servers reading and writing exact bytes, every test
run on asyncio's loop and on uvloop (the proxy serves on uvloop)."""

from __future__ import annotations

import asyncio
import gc
import gzip
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from agentcompact.integrations.proxy._h1 import H1Client, Origin, UpstreamDropped, UpstreamError

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
        self._clients: list[H1Client] = []

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

    def client(self, read_timeout: float = 2, **kwargs: Any) -> H1Client:
        self._clients.append(H1Client(2, read_timeout, **kwargs))
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


async def get(client: H1Client, url: str, method: str = "GET", body: bytes = b"") -> bytes:
    return await (await client.send(method, url, [], body)).read()


def test_origin_host_header_and_target() -> None:
    """``host`` has the port only when it is not the scheme's default; the target is the
    path and query as written."""
    origin, target = Origin.split("https://api.example.com/v1/messages?beta=true", None)
    assert (origin.host_header, origin.port, target) == (b"api.example.com", 443,
                                                         b"/v1/messages?beta=true")
    assert Origin.split("http://h:80", None)[0].host_header == b"h"
    origin, target = Origin.split("http://[::1]:8080/a%2Fb?q=%20", None)
    assert (origin.host_header, target) == (b"[::1]:8080", b"/a%2Fb?q=%20")


def test_request_goes_out_byte_for_byte(run: Run) -> None:
    """Request line, host with port, headers in order, content-length, a 230 kB body
    intact; no content-length on a GET without body, ``0`` on an empty POST, and any
    method with a body states its length."""
    body = os.urandom(230_000)
    headers = [(b"x-api-key", b"k"), (b"Content-Type", b"application/json"), (b"x-b", b"2")]

    async def main() -> None:
        async with Upstream(answering()) as up:
            client = up.client()
            resp = await client.send("POST", up.url("/v1/m?beta=true&q=%2F"), headers, body)
            assert (resp.status_code, await resp.read()) == (200, b"ok")
            assert await get(client, up.url("/models")) == b"ok"
            assert await get(client, up.url(), "POST") == b"ok"
            assert await get(client, up.url("/x"), "DELETE", b"{}") == b"ok"
        host = b"host: 127.0.0.1:%d\r\n" % up.port
        assert up.requests == [
            (b"POST /v1/m?beta=true&q=%2F HTTP/1.1\r\n" + host + b"x-api-key: k\r\n"
             b"Content-Type: application/json\r\nx-b: 2\r\ncontent-length: 230000\r\n\r\n", body),
            (b"GET /models HTTP/1.1\r\n" + host + b"\r\n", b""),
            (b"POST / HTTP/1.1\r\n" + host + b"content-length: 0\r\n\r\n", b""),
            (b"DELETE /x HTTP/1.1\r\n" + host + b"content-length: 2\r\n\r\n", b"{}")]

    run(main())


def test_keep_alive_reuses_one_connection(run: Run) -> None:
    """Sequential requests share one TCP connection; after ``connection: close`` the client
    opens a new one (even though this server does not close its end)."""
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"

    async def main() -> None:
        async with Upstream(answering(OK, OK, closing)) as up:
            client = up.client()
            for _ in range(3):
                assert await get(client, up.url()) == b"ok"
            assert up.accepted == 1
            for _ in range(2):
                assert await get(client, up.url()) == b"ok"
            assert (up.accepted, len(up.requests)) == (2, 5)

    run(main())


def test_unfinished_answer_closes_the_connection(run: Run) -> None:
    """An answer closed with ``close(False)`` (read partly, or all of it) is not reused:
    the server sees its connection closed."""

    async def handler(up: Upstream, reader: Reader, writer: Writer) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf."
                     + b"half." * (up.accepted == 3))
        await up.until_eof(reader)

    async def main() -> None:
        async with Upstream(handler) as up:
            client = up.client()
            for expected in (b"half.", b"half.", b"half.half."):
                resp = await client.send("GET", up.url(), [], b"")
                assert await resp.next_chunk() == expected
                resp.close(False)
                await up.eof.wait()
                up.eof.clear()
            assert up.accepted == 3

    run(main())


def _stale_handler(then: str) -> Handler:
    """First connection: answers a request, then closes (``then`` "close"), or reads the
    next request and closes ("unanswered"), or sends stray bytes ("stray"); later
    connections answer everything."""

    async def handler(up: Upstream, reader: Reader, writer: Writer) -> None:
        if up.accepted > 1:
            return await answering()(up, reader, writer)
        await up.read_request(reader)
        writer.write(OK)
        if then == "unanswered":
            await up.read_request(reader)
        elif then == "stray":
            await asyncio.sleep(0.01)
            writer.write(b"HTTP/1.1 200 OK\r\n")
            await up.until_eof(reader)

    return handler


@pytest.mark.parametrize("then", ["close", "stray"])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_idle_connection_closed_or_spoken_on_is_replaced(run: Run, method: str,
                                                         then: str) -> None:
    """A kept-alive connection the upstream closed, or sent bytes on, while idle is not
    used again (whatever the method)."""

    async def main() -> None:
        async with Upstream(_stale_handler(then)) as up:
            client = up.client()
            assert await get(client, up.url()) == b"ok"
            await asyncio.sleep(0.05)  # the client sees the close
            assert await get(client, up.url(), method, b"{}") == b"ok"
            assert (up.accepted, len(up.requests)) == (2, 2)

    run(main())


def test_stale_connection_retries_idempotent_requests_only(run: Run) -> None:
    """A reused connection closed before any answer byte: a GET is sent again on a new
    connection; a POST is not (it may have been received): UpstreamError."""

    async def main() -> None:
        async with Upstream(_stale_handler("unanswered")) as up:
            client = up.client()
            assert await get(client, up.url()) == b"ok"
            assert await get(client, up.url("/again")) == b"ok"
            assert [h[:h.index(b"\r")] for h, _ in up.requests] == [
                b"GET / HTTP/1.1", b"GET /again HTTP/1.1", b"GET /again HTTP/1.1"]
        async with Upstream(_stale_handler("unanswered")) as up:
            client = up.client()
            assert await get(client, up.url()) == b"ok"
            with pytest.raises(UpstreamError, match="closed"):
                await client.send("POST", up.url("/once"), [], b"{}")
            await asyncio.sleep(0.05)
            assert [h[:h.index(b"\r")] for h, _ in up.requests] == [
                b"GET / HTTP/1.1", b"POST /once HTTP/1.1"]
            assert up.accepted == 1

    run(main())


PACKED = gzip.compress(b'{"type": "message"}' * 50)


@pytest.mark.parametrize("method, answer, body", [
    pytest.param("GET", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
                 b"6;ext=1\r\n world\r\n0\r\nx-trailer: t\r\n\r\n", b"hello world", id="chunked"),
    pytest.param("GET", b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n"
                 b"\r\n%s" % (len(PACKED), PACKED), PACKED, id="gzip-kept"),
    pytest.param("GET", b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end",
                 b"until the end", id="until-close"),
    pytest.param("GET", b"HTTP/1.1 204 No Content\r\n\r\n", b"", id="204"),
    pytest.param("GET", b"HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n", b"", id="304"),
    pytest.param("HEAD", b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n", b"", id="head"),
    pytest.param("GET", b"HTTP/1.1 100 Continue\r\nx-interim: 1\r\n\r\n" + OK, b"ok",
                 id="100-continue"),
    pytest.param("GET", b"HTTP/1.1 103 Early Hints\r\nlink: </s.css>\r\n\r\n" + OK, b"ok",
                 id="103-early-hints"),
])
def test_body_framing(run: Run, method: str, answer: bytes, body: bytes) -> None:
    """Chunking removed (trailers not taken for headers), content coding kept, a body
    ending at close, no body for 204/304/HEAD, interim 1xx answers skipped; the next request
    works, on the same connection after a GET answer of known length."""
    until_close = b"connection: close" in answer
    final = answer.split(b"\r\n\r\n", 1)[1] if answer[9:10] == b"1" else answer
    lines = final.split(b"\r\n\r\n")[0].split(b"\r\n")

    async def main() -> None:
        async with Upstream(answering(answer, close=until_close)) as up:
            client = up.client()
            resp = await client.send(method, up.url(), [], b"")
            assert await resp.read() == body
            assert resp.status_code == int(lines[0][9:12])
            assert resp.raw_headers == [tuple(line.split(b": ")) for line in lines[1:]]
            assert await get(client, up.url()) == b"ok"
            if method == "GET":
                assert up.accepted == 1 + until_close

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


def test_connection_refused_names_the_origin(run: Run) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(UpstreamError, match=f"cannot connect to 127.0.0.1:{port}"):
        run(H1Client(1, 1).send("GET", f"http://127.0.0.1:{port}/", [], b""))


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
            with pytest.raises(UpstreamDropped, match="closed"):
                while await resp.next_chunk():
                    pass
            resp.close(False)

    run(main())


@pytest.mark.parametrize("answer", [b"garbage\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n"])
def test_malformed_answer_is_an_upstream_error(run: Run, answer: bytes) -> None:
    async def main() -> None:
        async with Upstream(answering(answer)) as up:
            with pytest.raises(UpstreamError, match="malformed"):
                await up.client().send("GET", up.url(), [], b"")

    run(main())


def test_read_timeouts(run: Run) -> None:
    """No answer head within read_timeout: UpstreamError; a body stalling that long:
    UpstreamDropped; both after about the timeout."""

    async def handler(up: Upstream, reader: Reader, writer: Writer) -> None:
        if await up.read_request(reader) and up.accepted > 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab")
        await up.until_eof(reader)

    async def main() -> None:
        async with Upstream(handler) as up:
            client = up.client(read_timeout=0.2)
            start = time.monotonic()
            with pytest.raises(UpstreamError, match="read timeout"):
                await client.send("GET", up.url(), [], b"")
            assert 0.15 < time.monotonic() - start < 1
            resp = await client.send("GET", up.url(), [], b"")
            assert await resp.next_chunk() == b"ab"
            start = time.monotonic()
            with pytest.raises(UpstreamDropped, match="read timeout"):
                await resp.next_chunk()
            assert 0.15 < time.monotonic() - start < 1
            resp.close(False)

    run(main())


def test_cancelled_wait_drops_the_request(run: Run) -> None:
    """Cancelling ``send`` while it waits for the answer closes the connection."""

    async def handler(up: Upstream, reader: Reader, writer: Writer) -> None:
        await up.read_request(reader)
        await up.until_eof(reader)

    async def main() -> None:
        async with Upstream(handler) as up:
            task = asyncio.create_task(up.client().send("POST", up.url(), [], b"{}"))
            while not up.requests:
                await asyncio.sleep(0.005)
            task.cancel()
            await up.eof.wait()
            assert task.cancelled()

    run(main())


def test_backpressure_bounds_what_is_buffered(run: Run) -> None:
    """8 MB written at once, read slowly: reading pauses, at most a couple of MB wait in
    the client, and every byte arrives in order."""
    payload = os.urandom(8 << 20)

    async def handler(up: Upstream, reader: Reader, writer: Writer) -> None:
        await up.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload))
        await writer.drain()
        await up.until_eof(reader)

    async def main() -> None:
        async with Upstream(handler) as up:
            resp = await up.client().send("GET", up.url(), [], b"")
            got, peak, paused = bytearray(), 0, False
            while chunk := await resp.next_chunk():
                got += chunk
                await asyncio.sleep(0.02)
                peak, paused = max(peak, resp._conn.buffered), paused or resp._conn.paused
            resp.close(True)
            assert paused and peak <= 2 << 20
            assert got == payload

    run(main())


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_hold_sends_all_but_the_last_byte(run: Run, commit: bool) -> None:
    """Held on the idle connection and fed the body in pieces, the server has all but the
    body's last byte and no request; commit sends that byte and the answer comes; abort
    closes the connection: the server sees an incomplete body, never a request."""
    body = os.urandom(100_000)
    created = b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\nheld"

    async def main() -> None:
        async with Upstream(answering(OK, created)) as up:
            client = up.client()
            assert await get(client, up.url()) == b"ok"
            held = await client.hold("POST", up.url("/held"), [(b"x-a", b"1")], len(body))
            assert held is not None
            for start in range(0, len(body), 30_000):
                held.feed(body[start:start + 30_000])
            while len(up.receiving) < len(body) - 1:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)
            assert bytes(up.receiving) == body[:-1] and len(up.requests) == 1
            if commit:
                resp = await held.commit(body)
                assert (resp.status_code, await resp.read()) == (201, b"held")
                assert up.requests[1] == (b"POST /held HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
                                          b"x-a: 1\r\ncontent-length: 100000\r\n\r\n" % up.port,
                                          body)
            else:
                held.abort()
                while not up.incomplete:
                    await asyncio.sleep(0.005)
                assert up.incomplete == [body[:-1]] and len(up.requests) == 1
            assert up.accepted == 1

    run(main())


def test_hold_needs_an_idle_connection_and_two_bytes(run: Run) -> None:
    async def main() -> None:
        async with Upstream(answering()) as up:
            client = up.client()
            assert await client.hold("POST", up.url(), [], 2) is None  # nothing idle
            assert up.accepted == 0  # and no connection was opened for it
            assert await get(client, up.url()) == b"ok"
            assert await client.hold("POST", up.url(), [], 1) is None
            held = await client.hold("POST", up.url("/held"), [], 2)  # the idle one
            assert held is not None
            held.feed(b"{")
            held.feed(b"}")
            assert await (await held.commit(b"{}")).read() == b"ok"
            assert up.accepted == 1 and up.requests[1][1] == b"{}"

    run(main())


def test_held_whose_body_is_not_the_one_fed_is_sent_anew(run: Run) -> None:
    """A body shorter than declared (fed in part) never completes the held request: it is
    dropped and the body given to commit is sent as a request of its own."""

    async def main() -> None:
        async with Upstream(answering()) as up:
            client = up.client()
            assert await get(client, up.url()) == b"ok"
            held = await client.hold("POST", up.url("/held"), [], 10)
            assert held is not None
            held.feed(b"12345")
            assert await (await held.commit(b"12345")).read() == b"ok"
            while not up.incomplete:
                await asyncio.sleep(0.005)
            assert up.incomplete == [b"12345"]
            assert [b for _, b in up.requests] == [b"", b"12345"]

    run(main())


def test_held_on_a_connection_closed_meanwhile_is_sent_anew(run: Run) -> None:
    """The upstream closed the idle connection as the request was held: commit sends the
    whole request on a new connection (one complete request), and nothing is logged."""
    body = b'{"model": "m", "messages": []}'

    async def main() -> None:
        logged: list[str] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, c: logged.append(c["message"]))
        async with Upstream(answering()) as up:
            client = up.client()
            assert await get(client, up.url()) == b"ok"
            up.writers[0].transport.abort()  # the upstream drops the idle connection
            held = await client.hold("POST", up.url("/held"), [], len(body))
            assert held is not None
            held.feed(body)
            await asyncio.sleep(0.05)  # the client sees it closed
            assert await (await held.commit(body)).read() == b"ok"
            assert up.accepted == 2 and [b for _, b in up.requests] == [b"", body]
            del held
            gc.collect()
        assert logged == []

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


def test_tls_verifies_the_upstream(run: Run, cert: tuple[Path, Path]) -> None:
    """Over https, with SNI: a context trusting the certificate gets through (and reuses
    the connection); the same context refuses another host name (127.0.0.1), and the
    default trust store refuses the certificate."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(*cert)
    names: list[str | None] = []
    server_ctx.sni_callback = lambda _sock, name, _ctx: names.append(name)  # type: ignore
    trusting = ssl.create_default_context(cafile=str(cert[0]))

    async def main() -> None:
        async with Upstream(answering(), server_ctx) as up:
            url = up.url("/v1", host="localhost", scheme="https")
            client = up.client(ssl_context=trusting)
            assert [await get(client, url), await get(client, url)] == [b"ok", b"ok"]
            assert up.accepted == 1 and names == ["localhost"]
            assert up.requests[0][0] == b"GET /v1 HTTP/1.1\r\nhost: localhost:%d\r\n\r\n" % (
                up.port)
            by_ip = up.url(host="127.0.0.1", scheme="https")
            for refusing, where, error in [(up.client(ssl_context=trusting), by_ip, "mismatch"),
                                           (up.client(), url, "CERTIFICATE_VERIFY_FAILED")]:
                with pytest.raises(UpstreamError, match=f"cannot connect.*{error}"):
                    await refusing.send("GET", where, [], b"")
            assert len(up.requests) == 2

    run(main())
