"""What the simulated model answers: replies, faults, scripts, and the chars/4 token estimate.

Tokens are *estimated*, never tokenized: one token is four characters of text
(``ceil(len(text) / 4)``). The prompt side counts the compact JSON of the prompt-bearing
fields of a request (``system``, ``messages``, ``tools``, ``instructions``, ``input``; Gemini's
``systemInstruction``, ``contents``), so the same prompt counts the same through
``/v1/messages`` and ``/v1/messages/count_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "TOKEN_CHARS",
    "Fault",
    "Reply",
    "Responder",
    "Script",
    "Step",
    "Thinking",
    "ToolCall",
    "digest_reply",
    "echo_reply",
    "estimate_tokens",
    "filler_text",
    "last_user_text",
    "prompt_text",
    "prompt_tokens",
    "split_tokens",
]

#: Characters per estimated token.
TOKEN_CHARS = 4
PROMPT_FIELDS = ("system", "messages", "tools", "instructions", "input", "systemInstruction",
                 "contents")
_FILLER_WORDS = ("ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "owl", "yak")


def estimate_tokens(text: str) -> int:
    """``ceil(len(text) / 4)``: the simulator's whole notion of a token count."""
    return -(-len(text) // TOKEN_CHARS)


def split_tokens(text: str) -> list[str]:
    """Cut ``text`` into the 4-character pieces the simulator streams and scores as tokens."""
    return [text[i : i + TOKEN_CHARS] for i in range(0, len(text), TOKEN_CHARS)]


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """Estimated input tokens of a request body: chars/4 of its prompt fields' compact JSON."""
    prompt = {key: body[key] for key in PROMPT_FIELDS if key in body}
    return estimate_tokens(json.dumps(prompt, separators=(",", ":"), ensure_ascii=False))


def filler_text(n_tokens: int) -> str:
    """Deterministic text estimated at exactly ``n_tokens`` tokens (3-letter words + spaces)."""
    words = (_FILLER_WORDS[i % len(_FILLER_WORDS)] for i in range(n_tokens))
    return " ".join(words)


def _texts(content: Any) -> list[str]:
    """Every text string inside one message's content, whatever the dialect."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, Mapping):
        found = [content["text"]] if isinstance(content.get("text"), str) else []
        for key in ("content", "output", "parts"):
            if key in content:
                found += _texts(content[key])
        return found
    if isinstance(content, Sequence):
        return [text for part in content for text in _texts(part)]
    return []


def prompt_text(body: Mapping[str, Any]) -> str:
    """All text of a request's prompt (system/instructions first), joined by newlines."""
    fields = (body.get(key) for key in PROMPT_FIELDS if key != "tools")
    return "\n".join(text for value in fields for text in _texts(value))


def last_user_text(body: Mapping[str, Any]) -> str:
    """Text of the last user message of a Messages, Chat Completions, Responses or Gemini
    request."""
    turns = body.get("messages", body.get("input", body.get("contents", [])))
    if isinstance(turns, str):
        return turns
    users = [turn for turn in turns if isinstance(turn, Mapping) and turn.get("role") == "user"]
    return "\n".join(_texts(users[-1].get("content", users[-1].get("parts")))) if users else ""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model makes; ``arguments`` is a JSON object or raw (maybe bad) JSON."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    #: Provider-looking id (``toolu_…`` / ``call_…``) generated from the request number if None.
    id: str | None = None
    #: A freeform tool (Responses ``custom_tool_call`` whose ``input`` is ``arguments`` as
    #: raw text, as Codex's ``exec`` tool takes JavaScript); other wires send a plain call.
    custom: bool = False

    @property
    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Thinking:
    """A reasoning block: Anthropic ``thinking`` + ``signature``; Responses ``reasoning`` item
    with the signature as ``encrypted_content`` and the text as its summary."""

    text: str
    signature: str = "c2ltLXNpZ25hdHVyZQ=="


@dataclass(frozen=True, slots=True)
class Fault:
    """Something going wrong with one answer.

    ``status``/``kind`` answer with an error in the provider's real JSON shape;
    ``delay_s`` holds back the first byte; ``drop_after`` closes a stream's connection after
    that many events; ``hang_s`` answers nothing for that long (bounded: then a 504).
    """

    status: int | None = None
    #: ``"context_length"`` renders each provider's context-window error; None: by status.
    kind: str | None = None
    message: str | None = None
    delay_s: float = 0.0
    drop_after: int | None = None
    hang_s: float | None = None
    #: For ``kind="context_length"``: the window, and the prompt size the error reports
    #: (None: the request's own estimate, at least ``limit + 1``).
    limit: int = 200_000
    tokens: int | None = None

    @classmethod
    def context_length(cls, limit: int = 200_000, tokens: int | None = None) -> Fault:
        """HTTP 400 "prompt is too long" / ``context_length_exceeded``."""
        return cls(status=400, kind="context_length", limit=limit, tokens=tokens)

    @classmethod
    def http(cls, status: int, message: str | None = None) -> Fault:
        """An error status with the provider's error body (429, 500, 503, 529, ...)."""
        return cls(status=status, message=message)

    @classmethod
    def drop(cls, after_events: int) -> Fault:
        """Stream ``after_events`` events, then close the connection mid-body."""
        return cls(drop_after=after_events)

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Answer normally, ``seconds`` late."""
        return cls(delay_s=seconds)

    @classmethod
    def hang(cls, seconds: float = 30.0) -> Fault:
        """Say nothing for up to ``seconds`` (less if the client leaves), then a 504."""
        return cls(hang_s=seconds)

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """Read an ``x-sim-fault`` header: ``"status=503"``, ``"context_length=8000"``,
        ``"delay=0.5"``, ``"drop_after=3"``, ``"hang=2"``, comma-separated."""
        fault = cls()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, _, value = item.partition("=")
            fault = _parsed(fault, key.strip(), value.strip())
        return fault


def _parsed(fault: Fault, key: str, value: str) -> Fault:
    if key == "context_length":
        limit = int(value) if value else fault.limit
        return replace(fault, status=400, kind="context_length", limit=limit)
    setters: dict[str, Callable[[str], Fault]] = {
        "status": lambda v: replace(fault, status=int(v)),
        "message": lambda v: replace(fault, message=v),
        "delay": lambda v: replace(fault, delay_s=float(v)),
        "drop_after": lambda v: replace(fault, drop_after=int(v)),
        "hang": lambda v: replace(fault, hang_s=float(v) if v else 30.0),
    }
    if key not in setters:
        raise ValueError(f"unknown x-sim-fault item {key!r}; known: {sorted(setters)}")
    return setters[key](value)


@dataclass(frozen=True, slots=True)
class Reply:
    """What the model answers to one request: text, tool calls, a thinking block, a fault."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    thinking: Thinking | None = None
    fault: Fault | None = None

    def __post_init__(self) -> None:
        # lists are accepted for convenience; the value must stay hashable and immutable
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))

    @classmethod
    def tool(cls, name: str, arguments: Mapping[str, Any] | str | None = None, *,
             id: str | None = None, text: str = "") -> Reply:  # noqa: A002 - mirrors the wire
        """One tool call (optionally after some text)."""
        return cls(text=text, tool_calls=(ToolCall(name, arguments or {}, id),))

    @classmethod
    def calling(cls, *calls: ToolCall, text: str = "") -> Reply:
        """Several (parallel) tool calls in one turn."""
        return cls(text=text, tool_calls=calls)

    @classmethod
    def filler(cls, n_tokens: int) -> Reply:
        """``n_tokens`` tokens of deterministic text (cut short by the request's max tokens)."""
        return cls(text=filler_text(n_tokens))

    def thinking_first(self, text: str, signature: str | None = None) -> Reply:
        """This reply preceded by a thinking block."""
        thinking = Thinking(text) if signature is None else Thinking(text, signature)
        return replace(self, thinking=thinking)

    def failing(self, fault: Fault) -> Reply:
        """This reply, with ``fault`` applied to its delivery."""
        return replace(self, fault=fault)


#: A reply computed from the request body; may return a plain string for a text reply.
Responder = Callable[[dict[str, Any]], "Reply | str"]
#: One scripted answer.
Step = Reply | Fault | str | Responder


def echo_reply(body: dict[str, Any]) -> Reply:
    """The default answer: ``"echo: <last user text>"``."""
    return Reply(f"echo: {last_user_text(body)}")


def digest_reply(body: dict[str, Any]) -> Reply:
    """A deterministic "summary" of the whole prompt: its sha256 prefix, size and opening.

    Summarizer tests can recompute it from what they meant to send.
    """
    text = prompt_text(body)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return Reply(f"SUMMARY sha256={digest} chars={len(text)}: {text[:160]}")


class Script:
    """The answers to the next requests, in order; then ``then`` for every later request.

    A step is a :class:`Reply`, a string (text reply), a :class:`Fault` (the default answer,
    delivered with that fault) or a responder ``(request_json) -> Reply | str``.
    """

    def __init__(self, *steps: Step, then: Step = echo_reply) -> None:
        self._steps: deque[Step] = deque(steps)
        self.then = then
        self._lock = threading.Lock()

    def push(self, *steps: Step) -> Script:
        """Queue more steps after the pending ones."""
        with self._lock:
            self._steps.extend(steps)
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._steps)

    def reply_to(self, body: dict[str, Any]) -> Reply:
        """Consume the next step and turn it into a :class:`Reply` for ``body``."""
        with self._lock:
            step = self._steps.popleft() if self._steps else self.then
        return _resolve(step, body)


def _resolve(step: Step, body: dict[str, Any]) -> Reply:
    if isinstance(step, Reply):
        return step
    if isinstance(step, str):
        return Reply(step)
    if isinstance(step, Fault):
        return echo_reply(body).failing(step)
    answer = step(body)
    return Reply(answer) if isinstance(answer, str) else answer
