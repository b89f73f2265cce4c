"""Keeping freed memory for the next large body (glibc's allocator).

A Claude Code request at 3M tokens is a 12 MB body, joined from the chunks it arrived in.
glibc serves such a block with a fresh ``mmap`` (or a fresh stretch of heap, trimmed back
to the system when freed), so every request pays the page faults of 12 MB of new memory:
9 ms for the join alone on a 2-core VM, against 1.4 ms once the memory is reused
(``benchmarks/proxy_claude_code.py --trace``, docs/proxy.md "Latency"). ``keep_freed``
raises the size glibc serves from its heap to its maximum (32 MiB) and lets it keep up to
``mib`` MiB of freed memory instead of returning it at once, so the next body reuses pages
that are mapped already. The process's resident size then stays up to that much above
what it uses. ``agentcompact proxy`` and ``agentcompact run`` do it at start-up
(``--keep-memory``); a process embedding ``create_app`` decides for itself.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["keep_freed", "release_freed"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: glibc's largest ``M_MMAP_THRESHOLD`` on 64-bit systems (HEAP_MAX_SIZE / 2)
_HEAP_BLOCK = 32 * 1024 * 1024


def keep_freed(mib: int) -> bool:
    """Let glibc keep up to ``mib`` MiB of freed memory and serve blocks under 32 MiB from
    its heap; ``False`` (nothing changed) for ``mib <= 0`` or without glibc."""
    if mib <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _HEAP_BLOCK)
                and mallopt(_M_TRIM_THRESHOLD, mib * 1024 * 1024))


def release_freed() -> bool:
    """Return the freed memory glibc holds to the system now (``malloc_trim``): after a
    rare large allocation (a recorded answer of tens of MB) that ``keep_freed`` would
    otherwise keep. ``False`` without glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
