"""Keeping the proxy's event loop free of store I/O and long work.

The event loop relays every session's stream; anything that blocks it stalls them all. A
prefix store or archive on a file or a server (``sqlite:///…``, ``redis://…``, the
default store) is read and written by the engines, so with one of them every engine call
runs away from the loop: a sync strategy's in a worker thread, an async strategy's on
:class:`EngineLoop`, an event loop in a thread of its own (its awaits, summarizer calls
included, run there). A locked or slow store then costs the deadline of its calls
(``agentcompact.stores``) to the request whose engine touches it, and nothing to the
others. ``does_io`` tells which stores and archives need it: only the in-memory ones are
called on the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agentcompact import InMemoryPrefixStore, MemoryArchive

__all__ = ["EngineLoop", "does_io"]

_T = TypeVar("_T")
_MEMORY_SPECS = frozenset({"memory", "memory:", ":memory:"})
_STOP_TIMEOUT_S = 5.0


def does_io(store_or_archive: object) -> bool:
    """Whether engines calling ``store_or_archive`` (a prefix store, an archive, or an
    archive setting: a path or URL) may wait for a file or a server: anything but the
    in-memory ones (``None`` and ``False``: none)."""
    if store_or_archive is None or store_or_archive is False:
        return False
    if isinstance(store_or_archive, str):
        return store_or_archive not in _MEMORY_SPECS
    return not isinstance(store_or_archive, (InMemoryPrefixStore, MemoryArchive))


class EngineLoop:
    """An event loop in a daemon thread of its own, started on first use: coroutines
    given to :meth:`run` run there, and the caller's loop awaits their result. A caller
    cancelled (its client left) cancels the coroutine."""

    def __init__(self, name: str = "agentcompact-engines") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name,
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    async def run(self, work: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
        """``await work()`` on this loop, from another loop."""
        future = asyncio.run_coroutine_threadsafe(work(), self._started())
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Stop the loop (work still running on it is abandoned) and join its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_STOP_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()
