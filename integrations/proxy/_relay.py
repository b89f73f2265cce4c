"""ASGI responses that relay an upstream answer to the client.

``RelayResponse`` forwards an upstream response chunk by chunk as it arrives (undecoded,
unbuffered), so SSE streams reach the client byte-identical and without added delay. It
watches the client while relaying: when the client disconnects the upstream stream is
closed at once (no leaked connection or task), and when the upstream drops mid-stream the
client's connection is aborted too, so it sees a truncated response rather than a clean
end.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from ._upstream import UpstreamDropped, UpstreamResponse
from ._wire import content_length, response_headers

__all__ = ["WATCH_KEY", "BufferedResponse", "ClientWatch", "RelayResponse", "UpstreamDropped",
           "until_disconnect"]

log = logging.getLogger("agentcompact.proxy")

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]
_T = TypeVar("_T")


async def until_disconnect(work: Coroutine[Any, Any, _T], receive: Receive
                           ) -> tuple[bool, _T | None]:
    """Run ``work`` while watching the client: ``(True, result)``, or ``(False, None)``
    when the client disconnected first (``work`` is then cancelled).

    ``work`` runs in the calling task; one watcher task cancels it if the client leaves
    (``Task.uncancel`` then keeps that cancellation from leaking out). Task creation is
    a measurable share of a proxied request's CPU: one task per call instead of two (an
    ``anyio`` task group per request cost ~20% in profiles). Python 3.10 (no
    ``uncancel``) runs ``work`` in a task of its own.
    """
    current = asyncio.current_task()
    if current is None or not _UNCANCEL:
        return await _until_disconnect_tasks(work, receive)
    state = [False, False]  # [work finished, client left]

    def watched(w: asyncio.Task[None]) -> None:
        if not w.cancelled() and not state[0]:
            state[1] = True
            current.cancel()

    watch = asyncio.get_running_loop().create_task(_disconnected(receive))
    watch.add_done_callback(watched)
    try:
        result = await work
    except asyncio.CancelledError:
        if state[1]:
            current.uncancel()
            return False, None  # the client left: its work was cancelled, not ours
        raise
    finally:
        state[0] = True
        watch.cancel()
    if state[1]:  # ``work`` swallowed the cancellation and finished anyway
        current.uncancel()
    return True, result


_UNCANCEL = hasattr(asyncio.Task, "uncancel")


async def _until_disconnect_tasks(work: Coroutine[Any, Any, _T], receive: Receive
                                  ) -> tuple[bool, _T | None]:
    """``until_disconnect`` with ``work`` in a task of its own (Python 3.10)."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(work)
    watch = loop.create_task(_disconnected(receive))
    watch.add_done_callback(lambda w: None if w.cancelled() else task.cancel())
    try:
        return True, await task
    except asyncio.CancelledError:
        if watch.done() and not watch.cancelled():
            return False, None
        raise
    finally:
        watch.cancel()


#: the scope key of a request's ``ClientWatch`` (``None``: one may be started)
WATCH_KEY = "agentcompact.watch"


class ClientWatch:
    """One watcher of the client for a whole proxied request, from the body read to the
    end of the relay: ``until_disconnect`` once per request instead of once per step
    (waiting for the upstream's headers, then relaying). :meth:`run` is
    ``until_disconnect`` in the calling task; the owner calls :meth:`close` at the end.
    A client that leaves between two ``run`` calls makes the next one return at once.

    The watcher task starts only once the request has lasted ``after`` seconds: a
    request answered sooner (a probe, a small non-streamed answer) costs a timer instead
    of a task, its start, and its cancellation, which measured ~5% of a proxied
    request's CPU. A model's answer takes longer than that, so a client that leaves
    while one is generated still cancels it at once after.
    """

    #: seconds before the watcher task starts
    after = 0.01

    def __init__(self, receive: Receive) -> None:
        self.task = asyncio.current_task()
        self.left = False
        self._armed = self._fired = False
        self._receive = receive
        self._watch: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            self.after, self._start)

    def _start(self) -> None:
        self._timer = None
        self._watch = asyncio.get_running_loop().create_task(_disconnected(self._receive))
        self._watch.add_done_callback(self._done)

    def _done(self, w: asyncio.Task[None]) -> None:
        if w.cancelled():
            return
        self.left = True
        if self._armed and self.task is not None:
            self._fired = True
            self.task.cancel()

    async def run(self, work: Coroutine[Any, Any, _T]) -> tuple[bool, _T | None]:
        if self.left:
            work.close()
            return False, None
        self._armed, self._fired = True, False
        try:
            result = await work
        except asyncio.CancelledError:
            if self._fired:
                assert self.task is not None
                self.task.uncancel()
                return False, None  # the client left: its work was cancelled, not ours
            raise
        finally:
            self._armed = False
        if self._fired:  # ``work`` swallowed the cancellation and finished anyway
            assert self.task is not None
            self.task.uncancel()
        return True, result

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watch is not None:
            self._watch.cancel()

    @staticmethod
    def usable() -> bool:
        """Whether a ``ClientWatch`` can run here (Python ≥ 3.11, inside a task)."""
        return _UNCANCEL and asyncio.current_task() is not None


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class BufferedResponse:
    """A response whose body is already in memory, with the upstream's raw headers."""

    def __init__(self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes
                 ) -> None:
        self.status_code = status
        self.body = body
        self.raw_headers = [*response_headers(headers),
                            (b"content-length", str(len(body)).encode())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


class RelayResponse:
    """Relay ``upstream`` to the client as it arrives.

    :param tee: called with each chunk (``--record`` keeps a copy); must be cheap.
    :param on_close: called once at the end with ``True`` when the whole body reached the
        client, ``False`` when the client left or the upstream dropped.
    :param after_first: called once, as soon as the first body chunk is relayed (before
        it when it is the last, or at the end, before ``on_close``, if none was): work that
        need not delay the answer's start. It may return an awaitable (work it started
        elsewhere): the answer's last bytes go out once it is done, so a client that has
        the whole answer finds that work done.
    """

    def __init__(self, upstream: UpstreamResponse, *, tee: Callable[[bytes], None] | None = None,
                 on_close: Callable[[bool], None] | None = None,
                 after_first: Callable[[], Any] | None = None) -> None:
        self.upstream = upstream
        self.status_code = upstream.status_code
        self.tee = tee
        self.on_close = on_close
        self.after_first = after_first
        self._started: Any = None  # what ``after_first`` returned

    def _after_first(self) -> None:
        after, self.after_first = self.after_first, None
        if after is not None:
            try:
                self._started = after()
            except Exception:
                log.exception("relay: after_first callback failed")

    async def _settle(self) -> None:
        """Run ``after_first`` if it has not run, and wait for what it started."""
        self._after_first()
        started, self._started = self._started, None
        if started is not None and inspect.isawaitable(started):
            try:
                # shielded: a client that leaves once it has the answer's events (before
                # the last bytes) cancels the relay, never the work, which the exchange's
                # log line and counters (and the session's next request) wait for
                await asyncio.shield(started)
            except Exception:
                log.exception("relay: after_first work failed")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        dropped: Exception | None = None
        try:
            watch = scope.get(WATCH_KEY)
            relayed = (await watch.run(self._relay(send)) if watch
                       else await until_disconnect(self._relay(send), receive))
            completed = relayed[1] is True
        except UpstreamDropped as exc:
            dropped = exc
        except OSError:
            pass  # the client went away while we were writing to it
        finally:
            self.upstream.close(completed)
            self._after_first()
            if self.on_close is not None:
                try:
                    self.on_close(completed)
                except Exception:
                    log.exception("relay: on_close callback failed")
        if dropped is not None:
            log.warning("relay: upstream stream failed mid-body: %r", dropped)
            raise dropped

    async def _relay(self, send: Send) -> bool:
        raw = self.upstream.raw_headers
        left = content_length(raw)
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": response_headers(raw, keep_length=left is not None)})
        tee = self.tee
        ended = False
        next_chunk = self.upstream.next_chunk
        while chunk := await next_chunk():
            if tee is not None:
                tee(chunk)
            if left is not None:
                left -= len(chunk)
                ended = left <= 0  # the last bytes: one write, no empty closing message
                if ended:
                    await self._settle()
            await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
            if self.after_first is not None:
                self._after_first()
        if not ended:
            await self._settle()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True
