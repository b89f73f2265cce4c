"""What the proxy knows about the providers' HTTP surface, independent of any server.

Which path speaks which dialect and goes to which upstream, which headers are hop-by-hop,
what a probe and a context-length error look like, how each provider shapes an error
body, and how a request names its session. Pure functions; no I/O.

The Gemini API names its methods after a colon in the last path segment
(``/v1beta/models/{model}:generateContent``, ``:streamGenerateContent?alt=sse``,
``:countTokens``); its key travels in ``x-goog-api-key`` or the ``key`` query parameter,
both relayed as the client sent them (the proxy's logs and dumps hold the path, never the
query, and redact the header).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from agentcompact.dialects import Dialect, digest_of
from agentcompact.wire import ANTHROPIC, CHAT, GEMINI, RESPONSES

__all__ = [
    "ANTHROPIC",
    "CHAT",
    "GEMINI",
    "RESPONSES",
    "dialect_for",
    "error_body",
    "is_context_error",
    "is_probe",
    "is_anthropic_path",
    "content_length",
    "request_headers",
    "response_headers",
    "session_key",
    "upstream_of",
]

#: RFC 9110 §7.6.1 hop-by-hop headers, plus the ones the proxy recomputes itself.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
    "upgrade", "proxy-authenticate",
})
_DROP_REQUEST = _HOP_BY_HOP | {"host", "content-length", "accept-encoding", "expect"}
_DROP_RESPONSE = _HOP_BY_HOP | {"content-length"}
_PROBE_KEYS = ("max_tokens", "max_output_tokens", "max_completion_tokens")

# Providers word overflow differently; a status of 400/413 plus one of these in the body.
_CONTEXT_ERROR = re.compile(
    r"prompt is too long|context[_ ]length[_ ]exceeded|maximum context length"
    r"|context window|input is too long|too many (?:input )?tokens|request_too_large"
    r"|reduce the length of the (?:messages|input)|exceeds the context"
    r"|exceeds the maximum number of tokens allowed",
    re.IGNORECASE,
)
_SESSION_HEADERS = ("x-session-id", "session_id", "session-id", "x-claude-code-session-id",
                    "conversation_id", "x-conversation-id")
_LEGACY_USER_ID_SESSION = re.compile(r"session_([0-9A-Za-z-]{8,})")
#: the Gemini API's methods whose bodies hold ``contents`` to compact
_GEMINI_METHODS = (":generateContent", ":streamGenerateContent")
#: the Gemini API's path prefixes (its OpenAI-compatible ``/v1beta/openai/...`` included)
_GEMINI_PREFIXES = ("/v1beta/", "/v1alpha/", "/upload/v1beta/")
#: Google's status names for the HTTP statuses the proxy answers itself
_GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                  404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
                  502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def dialect_for(path: str) -> str | None:
    """The dialect whose request bodies the proxy compacts at ``path``, else ``None``.

    Any path ending in ``/responses`` is the Responses API (Codex's ChatGPT backend uses
    ``/backend-api/codex/responses``); ``/responses/compact`` and other sub-paths are not.
    """
    p = path.rstrip("/")
    if p.endswith("/v1/messages") or p == "/messages":
        return ANTHROPIC
    if p.endswith(_GEMINI_METHODS):
        return GEMINI
    if p.endswith("/chat/completions"):
        return CHAT
    if p.endswith("/responses"):
        return RESPONSES
    return None


def is_anthropic_path(path: str) -> bool:
    """True for paths served by the Anthropic upstream (``/v1/messages…``, ``/v1/complete``)."""
    p = path.rstrip("/")
    return "/v1/messages" in p or p.endswith("/v1/complete") or p.startswith("/messages")


def upstream_of(path: str) -> str:
    """Whose upstream serves ``path``: ``ANTHROPIC``, ``GEMINI`` (a Gemini API path: a
    ``/v1beta/…`` path, or a method after a colon, ``…/models/m:countTokens``) or ``CHAT``
    (the OpenAI upstream, for every other path)."""
    if is_anthropic_path(path):
        return ANTHROPIC
    if path.startswith(_GEMINI_PREFIXES) or ":" in path.rsplit("/", 1)[-1]:
        return GEMINI
    return CHAT


def request_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Client headers to forward upstream: hop-by-hop and recomputed ones dropped.

    ``accept-encoding: identity`` asks the upstream for bytes the proxy can both relay
    verbatim and read for ``--record``; credentials pass through untouched.
    """
    out = [(k, v) for k, v in headers if k.lower().decode("latin-1") not in _DROP_REQUEST]
    out.append((b"accept-encoding", b"identity"))
    return out


def response_headers(headers: Sequence[tuple[bytes, bytes]], *, keep_length: bool = False
                     ) -> list[tuple[bytes, bytes]]:
    """Upstream headers to relay: hop-by-hop dropped; ``content-encoding`` kept since the
    bytes are relayed undecoded. ``content-length`` is dropped (the server recomputes or
    chunks) unless ``keep_length``: a body relayed byte for byte keeps the upstream's
    length, so the client is not sent a chunked answer the upstream did not send."""
    drop = _HOP_BY_HOP if keep_length else _DROP_RESPONSE
    return [(k, v) for k, v in headers if k.lower().decode("latin-1") not in drop]


def content_length(headers: Sequence[tuple[bytes, bytes]]) -> int | None:
    """The body length an upstream announced, or ``None`` (chunked, or no valid length)."""
    length = None
    for k, v in headers:
        name = k.lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            if length is not None or not v.strip().isdigit():
                return None  # repeated or malformed: let the server frame the body
            length = int(v)
    return length


def is_probe(body: Mapping[str, Any]) -> bool:
    """A request asking for at most one output token: a liveness or quota probe, not a turn
    (Gemini: ``generationConfig.maxOutputTokens``)."""
    config = body.get("generationConfig", body.get("generation_config"))
    caps = [body.get(key) for key in _PROBE_KEYS]
    if isinstance(config, dict):
        caps += [config.get("maxOutputTokens"), config.get("max_output_tokens")]
    return any(isinstance(cap, int) and not isinstance(cap, bool) and cap <= 1 for cap in caps)


def is_context_error(status: int, body: bytes) -> bool:
    """True for a provider's "context too long" answer (status 400/413 and a known phrase)."""
    if status not in (400, 413):
        return False
    return bool(_CONTEXT_ERROR.search(body[:65536].decode("utf-8", errors="replace")))


def error_body(dialect: str | None, status: int, message: str, *, code: str | None = None
               ) -> dict[str, Any]:
    """An error in the provider's own shape, so SDKs raise their usual exception types."""
    kind = "invalid_request_error" if status < 500 else "api_error"
    if dialect == GEMINI:
        google = _GOOGLE_STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        return {"error": {"code": status, "message": message, "status": google}}
    if dialect == ANTHROPIC:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def session_key(dialect: Dialect, body: Mapping[str, Any], headers: Mapping[str, str],
                messages: Sequence[Any], tenant: str = "") -> str:
    """A short stable id for the conversation a request belongs to.

    The client's own session id wins (a session header; Claude Code's ``metadata.user_id``,
    a JSON string holding ``session_id`` or the older ``…_session_<uuid>`` form; Codex's
    ``prompt_cache_key``); otherwise the digest of the history's root: the system prompt
    (the dialect's ``fixed_keys`` but the tools: Gemini's ``systemInstruction``) and the
    messages up to the first user message (Gemini CLI sends no session id). Hashed, so
    account and device ids the client puts beside its session id never appear in logs or
    the status page. A ``tenant`` id scopes it: two tenants sending the same session id (or
    the same root) are two sessions, with engines and prefix-store keys of their own.
    """
    source = _client_session(body, headers)
    if source is None:
        source = "root:" + _root_digest(dialect, body, messages)
    if tenant:
        source = f"tenant:{tenant}\x00{source}"
    return hashlib.blake2b(source.encode(), digest_size=8).hexdigest()


def _client_session(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    for name in _SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return f"header:{value}"
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(user_id, str) and user_id:
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("session_id"):
            return f"claude:{parsed['session_id']}"
        legacy = _LEGACY_USER_ID_SESSION.search(user_id)
        if legacy:
            return f"claude:{legacy.group(1)}"
    cache_key = body.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:
        return f"cache-key:{cache_key}"
    return None


def _root_digest(dialect: Dialect, body: Mapping[str, Any], messages: Sequence[Any]) -> str:
    keys = getattr(dialect, "fixed_keys", ("system", "instructions"))
    parts = [digest_of(body.get(key)) for key in keys if key != "tools"]
    for message in messages:
        parts.append(dialect.digest(message))
        if dialect.role(message) == "user":
            break
    return "/".join(parts)
