"""``--record``: each answer decoded, reassembled and logged away from the event loop.

The relay hands every chunk it sends the client to the answer's :class:`Recording`
(``feed``, on the loop: an append). Every ``_BATCH_BYTES``, and at the end, the chunks
go to the :class:`RecordingThread`, which removes the content coding the upstream applied
(``Content-Encoding``: ``gzip``, ``deflate``, ``br`` with the ``brotli`` module, ``zstd``
with a zstd module; several in turn), splits a stream into its events as they come
(:class:`~agentcompact.wire.SSEReader`) and feeds them to the
reassembler; at the end it logs the model call there (the recorder's write included).
Memory holds a batch and the reassembled answer, never a copy of the whole stream; the
loop never parses. A call that cannot be read (a coding that cannot be decoded here, a
body that is not JSON, a stream without one event) is not recorded: one warning says
which call and why, never an empty assistant turn.
"""

from __future__ import annotations

import logging
import queue
import threading
import zlib
from collections.abc import Callable
from typing import Any

import orjson

from agentcompact.wire import Reassembled, SSEReader, from_body, iter_events, reassembler

from ._memory import release_freed

__all__ = ["Recording", "RecordingThread", "Unreadable", "content_decoder"]

log = logging.getLogger("agentcompact.proxy")

_BATCH_BYTES = 1024 * 1024  # chunks handed to the thread together
_MAX_JSON_BYTES = 256 * 1024 * 1024  # a non-streamed answer is parsed whole: its bound
_RELEASE_AFTER_BYTES = 32 * 1024 * 1024  # a recording this large gives its memory back
_CLOSE_TIMEOUT_S = 30.0


class Unreadable(Exception):
    """An answer the recorder cannot read (the message says why, with no content)."""


# --- content codings -------------------------------------------------------------------
class _Zlib:
    """gzip (any number of members) or deflate (zlib-wrapped, or raw as some servers
    send it)."""

    def __init__(self, coding: str) -> None:
        self._gzip = coding in ("gzip", "x-gzip")
        self._d: Any = zlib.decompressobj(16 + zlib.MAX_WBITS if self._gzip else zlib.MAX_WBITS)
        self._started = False

    def decode(self, data: bytes) -> bytes:
        if not self._gzip and not self._started and data:
            self._started = True
            try:
                return bytes(self._d.decompress(data))
            except zlib.error:  # raw deflate, without the zlib header
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        out = [self._d.decompress(data)]
        while self._gzip and self._d.eof and self._d.unused_data:  # the next member
            rest = self._d.unused_data
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out.append(self._d.decompress(rest))
        return b"".join(out)

    def flush(self) -> bytes:
        return bytes(self._d.flush())


class _Brotli:
    def __init__(self) -> None:
        try:
            import brotli
        except ImportError:
            try:
                import brotlicffi as brotli
            except ImportError:
                raise Unreadable("Content-Encoding br needs the brotli module "
                                 "(pip install brotli)") from None
        self._d = brotli.Decompressor()
        self._decode = getattr(self._d, "process", None) or self._d.decompress

    def decode(self, data: bytes) -> bytes:
        return bytes(self._decode(data))

    def flush(self) -> bytes:
        return b""


class _Zstd:
    def __init__(self) -> None:
        try:
            import zstandard

            self._d: Any = zstandard.ZstdDecompressor().decompressobj()
        except ImportError:
            try:
                from compression.zstd import ZstdDecompressor  # Python 3.14
            except ImportError:
                try:
                    from backports.zstd import ZstdDecompressor
                except ImportError:
                    raise Unreadable("Content-Encoding zstd needs a zstd module "
                                     "(pip install zstandard)") from None
            self._d = ZstdDecompressor()

    def decode(self, data: bytes) -> bytes:
        return bytes(self._d.decompress(data))

    def flush(self) -> bytes:
        return b""


class _Identity:
    def decode(self, data: bytes) -> bytes:
        return data

    def flush(self) -> bytes:
        return b""


class _Chain:
    """Codings applied in turn (``Content-Encoding: gzip, br``): removed last first."""

    def __init__(self, decoders: list[Any]) -> None:
        self._decoders = decoders

    def decode(self, data: bytes) -> bytes:
        for decoder in self._decoders:
            data = decoder.decode(data)
        return data

    def flush(self) -> bytes:
        data = b""
        for decoder in self._decoders:
            data = decoder.decode(data) + decoder.flush() if data else decoder.flush()
        return data


def content_decoder(content_encoding: str | None) -> Any:
    """An incremental decoder (``decode(bytes)``, ``flush()``) removing ``content_encoding``.

    :raises Unreadable: a coding this process cannot decode (its name in the message).
    """
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    decoders: list[Any] = []
    for coding in reversed(codings):
        if coding in ("gzip", "x-gzip", "deflate"):
            decoders.append(_Zlib(coding))
        elif coding == "br":
            decoders.append(_Brotli())
        elif coding == "zstd":
            decoders.append(_Zstd())
        elif coding != "identity":
            raise Unreadable(f"Content-Encoding {coding!r} is not one the recorder decodes")
    if not decoders:
        return _Identity()
    return decoders[0] if len(decoders) == 1 else _Chain(decoders)


# --- the thread ----------------------------------------------------------------------------
class RecordingThread:
    """One daemon thread running recording work in order (started on first use)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="agentcompact-recording")
                self._thread.start()
        self._queue.put(work)

    def _run(self) -> None:
        while (work := self._queue.get()) is not None:
            try:
                work()
            except Exception as exc:  # a plugin's hook, a full disk: this call is lost
                log.warning("--record: recording a model call failed (%s)",
                            type(exc).__name__)

    def close(self, timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Finish the work submitted (waiting at most ``timeout``) and stop."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)


class Recording:
    """One answer being recorded (see the module docstring).

    :param describe: which call this is, for the warning when it cannot be read
        (``a openai_chat answer, session …``: no content).
    """

    def __init__(self, thread: RecordingThread, dialect: str, *, streamed: bool,
                 content_encoding: str | None, describe: str) -> None:
        self._thread, self._dialect, self._streamed = thread, dialect, streamed
        self._coding, self._describe = content_encoding, describe
        self._batch: list[bytes] = []
        self._batched = 0
        self._total = 0
        # the thread's state
        self._decoder: Any = None
        self._sse: SSEReader | None = None
        self._events = reassembler(dialect)
        self._seen = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._problem: str | None = None

    def feed(self, chunk: bytes) -> None:
        """A chunk relayed to the client (on the loop: kept, handed on per batch)."""
        self._batch.append(chunk)
        self._batched += len(chunk)
        if self._batched >= _BATCH_BYTES:
            self._hand_on()

    def finish(self, log_call: Callable[[Reassembled], None],
               unread: Callable[[], None] | None = None) -> None:
        """The answer is complete: reassemble the rest and ``log_call`` the result, in the
        thread (or warn that it cannot be read, and call ``unread``)."""
        self._hand_on()
        self._thread.submit(lambda: self._finish(log_call, unread))

    def discard(self) -> None:
        """The answer did not complete: nothing is recorded."""
        self._batch, self._batched = [], 0

    def _hand_on(self) -> None:
        batch, self._batch, self._batched = self._batch, [], 0
        if batch:
            self._thread.submit(lambda: self._take(batch))

    # --- in the thread -------------------------------------------------------------
    def _take(self, batch: list[bytes]) -> None:
        if self._problem is not None:
            return
        try:
            if self._decoder is None:
                self._decoder = content_decoder(self._coding)
            data = b"".join(batch)
            self._total += len(data)
            if data:  # a zstd decoder refuses more input, even none, after its frame
                self._read(self._decoder.decode(data))
        except Unreadable as exc:
            self._problem = str(exc)
        except (zlib.error, OSError, ValueError) as exc:  # brotli/zstd raise their own
            self._problem = f"its {self._coding} content does not decode ({type(exc).__name__})"
        except Exception as exc:
            if type(exc).__module__.split(".")[0] not in ("brotli", "zstandard", "_brotli"):
                raise
            self._problem = f"its {self._coding} content does not decode ({type(exc).__name__})"

    def _read(self, data: bytes) -> None:
        if not data:
            return
        if self._streamed:
            self._sse = self._sse or SSEReader()
            self._feed_events(self._sse.feed(data))
            return
        self._body_bytes += len(data)
        if self._body_bytes > _MAX_JSON_BYTES:
            raise Unreadable(f"a JSON answer over {_MAX_JSON_BYTES >> 20} MiB is not recorded")
        self._body.append(data)

    def _feed_events(self, payloads: list[bytes]) -> None:
        add = self._events.add
        for event in iter_events(payloads):
            add(event)
            self._seen += 1

    def _finish(self, log_call: Callable[[Reassembled], None],
                unread: Callable[[], None] | None = None) -> None:
        got: Reassembled | None = None
        try:
            got = self._result()
        finally:
            self._body, self._sse = [], None
            if got is None:
                log.warning("--record: %s is not recorded: %s", self._describe,
                            self._problem or "it could not be read")
                if unread is not None:
                    unread()
        if got is not None:
            log_call(got)
        if self._total >= _RELEASE_AFTER_BYTES:
            release_freed()

    def _result(self) -> Reassembled | None:
        if self._problem is None:
            self._take([])  # the decoder made first, for an empty answer
        if self._problem is None and self._decoder is not None:
            try:
                self._read(self._decoder.flush())
            except Unreadable as exc:
                self._problem = str(exc)
            except Exception as exc:
                self._problem = f"its {self._coding} content ends short ({type(exc).__name__})"
        if self._problem is not None:
            return None
        if self._streamed:
            if self._sse is not None:
                self._feed_events(self._sse.close())
            if not self._seen:
                self._problem = "the stream holds no event the recorder can read"
                return None
            return self._events.result()
        try:
            body = orjson.loads(b"".join(self._body))
        except orjson.JSONDecodeError:
            self._problem = "the answer is not JSON"
            return None
        if not isinstance(body, dict):
            self._problem = f"the answer is a JSON {type(body).__name__}, not an object"
            return None
        return from_body(self._dialect, body)
