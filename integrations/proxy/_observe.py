"""What the proxy reports about itself: counters for the status page, one structured log
line per request, and ``--debug-dir`` dumps with credentials redacted."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from agentcompact import redact
from agentcompact.extending import redact_headers as _redact_headers

__all__ = ["DebugDumper", "ExchangeLog", "ProxyStats", "SessionStats", "redact_headers",
           "redact_json"]

log = logging.getLogger("agentcompact.proxy")



@dataclass
class ExchangeLog:
    """One handled request, as logged (one JSON line) and counted."""

    path: str
    dialect: str | None
    session: str | None = None
    status: int | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    compacted: bool = False
    #: why, one per compaction the call made (``CompactionEvent.reason``: ``trigger``,
    #: ``fold``, ``reactive``…; a retried request's compaction is ``reactive``)
    reasons: list[str] = field(default_factory=list)
    modified: bool = False
    strategy: str | None = None
    added_ms: float = 0.0
    probe: bool = False
    shadow: bool = False
    retried: bool = False
    refused: bool = False
    #: the body went upstream held by its last byte while the engine worked: "sent-early"
    #: (completed before measuring: provably unchanged), "sent" (completed after the
    #: engine) or "dropped" (the engine changed the body; the new one was sent)
    held: str | None = None
    #: what went wrong: a compaction that failed (validation, a strategy error; the
    #: engine's event names it) or a failure that made the proxy forward the original
    error: str | None = None
    #: the rung the engine fell back to when its strategy failed (``cliff``, ``none``…)
    fallback: str | None = None
    #: the original bytes went upstream because the proxy itself failed (fail-open)
    fail_open: bool = False

    def emit(self) -> None:
        log.info("%s", orjson.dumps({"event": "proxy_request", **asdict(self)}).decode())


@dataclass
class SessionStats:
    """Per-session figures on the status page."""

    dialect: str
    requests: int = 0
    compactions: int = 0
    fallbacks: int = 0
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_saved: int = 0
    #: tokens sent over the session, and the part of them that repeated the previous
    #: request's prefix unchanged (what a provider's prompt cache can serve)
    tokens_sent: int = 0
    tokens_reused: int = 0
    last_seen: float = field(default_factory=time.time)

    @property
    def cache_share(self) -> float:
        """Share of the tokens sent that repeated a prefix already sent (an estimate)."""
        return self.tokens_reused / self.tokens_sent if self.tokens_sent else 0.0


class ProxyStats:
    """Counters behind ``GET /agentcompact/status`` (thread-safe, bounded per-session map)."""

    def __init__(self, max_sessions: int = 256) -> None:
        self.started = time.time()
        self.requests = 0
        self.handled = 0
        self.compactions = 0
        self.tokens_saved = 0
        self.shadow_tokens_saved = 0
        self.retries = 0
        self.fail_open = 0
        self.fallbacks = 0
        self.errors = 0
        self.probes = 0
        self.refused = 0
        self.open_streams = 0
        self.held_sent = 0
        self.held_early = 0
        self.held_dropped = 0
        self._sessions: OrderedDict[str, SessionStats] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._failed: OrderedDict[str, None] = OrderedDict()
        self._max = max_sessions
        self._lock = threading.Lock()

    def first_request(self, session: str | None) -> bool:
        """True the first time a session is asked about (its first handled request)."""
        return self._first(self._seen, session)

    def first_failure(self, session: str | None) -> bool:
        """True the first time a session's compaction fails (to warn once per session)."""
        return self._first(self._failed, session)

    def _first(self, seen: OrderedDict[str, None], session: str | None) -> bool:
        key = session or ""
        with self._lock:
            if key in seen:
                return False
            seen[key] = None
            while len(seen) > self._max:
                seen.popitem(last=False)
            return True

    def count_request(self) -> None:
        with self._lock:
            self.requests += 1

    def stream_opened(self, delta: int) -> None:
        with self._lock:
            self.open_streams += delta

    def record(self, ex: ExchangeLog, saved: int) -> None:
        """Fold one handled exchange into the counters."""
        with self._lock:
            self.handled += 1
            self.probes += ex.probe
            self.retries += ex.retried
            self.refused += ex.refused
            self.fail_open += ex.fail_open
            self.errors += ex.error is not None
            self.fallbacks += ex.fallback is not None
            self.compactions += ex.compacted
            if ex.held is not None:
                self.held_sent += ex.held in ("sent", "sent-early")
                self.held_early += ex.held == "sent-early"
                self.held_dropped += ex.held == "dropped"
            if ex.shadow:
                self.shadow_tokens_saved += saved
            else:
                self.tokens_saved += saved
            if ex.session is None or ex.probe:
                return
            s = self._sessions.pop(ex.session, None) or SessionStats(ex.dialect or "?")
            self._sessions[ex.session] = s
            s.requests += 1
            s.compactions += ex.compacted
            s.fallbacks += ex.fallback is not None
            s.errors += ex.error is not None
            sent = ex.tokens_out or 0
            if not ex.compacted and s.requests > 1:  # the previous body is this one's prefix
                s.tokens_reused += min(s.tokens_out, sent)
            s.tokens_sent += sent
            s.tokens_in, s.tokens_out = ex.tokens_in or 0, sent
            s.tokens_saved += saved
            s.last_seen = time.time()
            while len(self._sessions) > self._max:
                self._sessions.popitem(last=False)

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        with self._lock:
            return {
                "uptime_s": round(time.time() - self.started, 3),
                "requests": self.requests,
                "handled": self.handled,
                "compactions": self.compactions,
                "tokens_saved": self.tokens_saved,
                "shadow_tokens_saved": self.shadow_tokens_saved,
                "reactive_retries": self.retries,
                "fail_open": self.fail_open,
                "errors": self.errors,
                "fallbacks": self.fallbacks,
                "probes": self.probes,
                "refused": self.refused,
                "open_streams": self.open_streams,
                "held": {"sent": self.held_sent, "sent_early": self.held_early,
                         "dropped": self.held_dropped},
                **extra,
                "sessions": {k: {**asdict(v), "cache_share": round(v.cache_share, 4)}
                             for k, v in reversed(self._sessions.items())},
            }


def redact_headers(headers: Any) -> dict[str, str]:
    """Headers with every credential value replaced (the project's one policy,
    :mod:`agentcompact._redact`: gateway credentials such as ``cf-aig-authorization`` and
    ``helicone-auth`` included)."""
    out: dict[str, str] = _redact_headers(headers)
    return out


def redact_json(value: Any) -> Any:
    """A copy of a JSON value with credential fields replaced, recursively
    (:func:`agentcompact._redact.redact`: the policy the recorder and logs use too)."""
    return redact(value)


class DebugDumper:
    """Writes ``NNNNNN-<session>-in.json`` / ``-out.json`` per request into a private dir.

    The directory is created mode 0700 and each file 0600: dumps hold whole prompts.
    Header values and body fields that look like credentials are redacted. Failures are
    logged and never affect the request.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)
        self._seq = itertools.count(1)

    def dump(self, session: str | None, path: str, headers: Any, incoming: Any,
             outgoing: Any, summary: dict[str, Any]) -> None:
        try:
            n = next(self._seq)
            stem = f"{n:06d}-{session or 'nosession'}"
            meta = {"path": path, "headers": redact_headers(headers), **summary}
            self._write(f"{stem}-in.json", {**meta, "body": redact_json(incoming)})
            if outgoing is not None:
                self._write(f"{stem}-out.json", {**meta, "body": redact_json(outgoing)})
        except Exception:
            log.exception("debug dump failed (request unaffected)")

    def _write(self, name: str, record: dict[str, Any]) -> None:
        data = orjson.dumps(record, option=orjson.OPT_INDENT_2)
        fd = os.open(self.dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, data)
        finally:
            os.close(fd)
