"""The simulator as a Starlette app: routes, request recording, faults, latency."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ._anthropic_wire import AnthropicWire
from ._completion import Completion, SimTokenizer, Wire, complete
from ._gemini_wire import GeminiWire, refusal
from ._latency import DecodePacer, LatencyModel, Slots
from ._openai_wire import ChatWire
from ._responses_wire import ResponsesWire, compacted
from ._script import Fault, Reply, Script, prompt_tokens

__all__ = [
    "FAULT_HEADER",
    "RecordedRequest",
    "StreamDropped",
    "UpstreamSim",
    "quiet_dropped_streams",
]

ANTHROPIC, CHAT, RESPONSES, GEMINI = AnthropicWire(), ChatWire(), ResponsesWire(), GeminiWire()
#: Request header that injects a fault into that one request (see :meth:`Fault.parse`).
FAULT_HEADER = "x-sim-fault"
_HANG_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the simulator received it (headers unredacted, names lower-case)."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    #: The parsed JSON body; None for a GET or a body that is not JSON.
    body: Any
    received_at: float


class StreamDropped(Exception):
    """Raised inside a stream to cut the connection, as a :class:`Fault` ``drop_after`` asks."""


class _DroppedStreamFilter(logging.Filter):
    """Keeps uvicorn from logging a traceback for every intentionally dropped stream."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        while error is not None:
            if isinstance(error, StreamDropped):
                return False
            nested = getattr(error, "exceptions", None)  # ExceptionGroup from the task group
            error = nested[0] if nested and len(nested) == 1 else None
        return True


def quiet_dropped_streams() -> None:
    """Install (once) the filter that hides intentional stream drops from uvicorn's log."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DroppedStreamFilter) for f in logger.filters):
        logger.addFilter(_DroppedStreamFilter())


class UpstreamSim:
    """A scripted, recording LLM provider speaking the Anthropic, OpenAI and Gemini wire
    protocols.

    :param script: what the model answers; by default it echoes the last user message.
    :param latency: provider timings; by default instant.
    :param context_window: if set, prompts estimated above it get the provider's
        context-length error, as a real model with that window would answer.
    :param max_recorded: keep only this many of the latest requests (``None``: all; a
        benchmark sending megabyte bodies for minutes keeps few).
    :param tokenizer: a Hugging Face tokenizer (a path, a hub name, a loaded tokenizer or a
        :class:`SimTokenizer`): Chat Completions then tokenizes with its chat template as
        vLLM does, counts usage in its tokens, scores ``logprobs`` per real token and
        answers ``return_token_ids`` with ``prompt_token_ids`` / ``token_ids``.
    """

    def __init__(self, script: Script | None = None, *, latency: LatencyModel | None = None,
                 context_window: int | None = None, max_recorded: int | None = None,
                 tokenizer: Any = None) -> None:
        self.script = script if script is not None else Script()
        self.tokenizer = (tokenizer if tokenizer is None or isinstance(tokenizer, SimTokenizer)
                          else SimTokenizer(tokenizer))
        self.max_recorded = max_recorded
        self.latency = latency if latency is not None else LatencyModel()
        self.context_window = context_window
        #: Set by the runner on shutdown so hanging requests give up at once.
        self.closing = threading.Event()
        self._slots = Slots()
        self._requests: list[RecordedRequest] = []
        self._seen = 0  # requests received (the ordinal of ids), recorded or not
        self._lock = threading.Lock()
        self.app = Starlette(routes=self._routes(),
                             exception_handlers={ClientDisconnect: _client_left})
        self.app.state.upstream_sim = self

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def clear(self) -> None:
        """Forget the recorded requests."""
        with self._lock:
            self._requests.clear()
            self._seen = 0

    def _routes(self) -> list[Route]:
        return [
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/v1/responses/compact", self._compact, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            # Gemini: ``{model}:generateContent``, ``:streamGenerateContent``, ``:countTokens``
            Route("/v1beta/models/{target}", self._gemini, methods=["POST"]),
            Route("/v1/models/{target}", self._gemini, methods=["POST"]),
            # anything else is recorded (a client's unexpected call shows in ``requests``)
            # and answered 404 in the Anthropic/OpenAI error shape
            Route("/{path:path}", self._unknown,
                  methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]),
        ]

    async def _messages(self, request: Request) -> Response:
        return await self._answer(request, ANTHROPIC)

    async def _chat(self, request: Request) -> Response:
        return await self._answer(request, CHAT)

    async def _responses(self, request: Request) -> Response:
        return await self._answer(request, RESPONSES)

    async def _gemini(self, request: Request) -> Response:
        model, _, method = request.path_params["target"].partition(":")
        if method == "countTokens":
            ordinal, body = await self._record(request)
            inner = (body or {}).get("generateContentRequest") or body or {}
            return JSONResponse({"totalTokens": prompt_tokens(inner)}, headers=_ids(ordinal))
        if method not in ("generateContent", "streamGenerateContent"):
            return await self._unknown(request)
        return await self._answer(request, GEMINI, model=model,
                                  stream=method == "streamGenerateContent")

    async def _count_tokens(self, request: Request) -> Response:
        ordinal, body = await self._record(request)
        return JSONResponse({"input_tokens": prompt_tokens(body or {})}, headers=_ids(ordinal))

    async def _compact(self, request: Request) -> Response:
        ordinal, body = await self._record(request)
        return JSONResponse(compacted(body or {}, ordinal), headers=_ids(ordinal))

    async def _models(self, request: Request) -> Response:
        ordinal, _ = await self._record(request)
        model = {"id": "sim-model", "object": "model", "created": 0, "owned_by": "upstream-sim",
                 "type": "model", "display_name": "Upstream Sim",
                 "created_at": "2025-01-01T00:00:00Z"}
        page = {"object": "list", "data": [model], "has_more": False,
                "first_id": "sim-model", "last_id": "sim-model"}
        return JSONResponse(page, headers=_ids(ordinal))

    async def _unknown(self, request: Request) -> Response:
        ordinal, _ = await self._record(request)
        error = {"type": "error", "error": {"type": "not_found_error",
                                            "message": f"no route {request.url.path}"}}
        return JSONResponse(error, 404, headers=_ids(ordinal))

    async def _record(self, request: Request) -> tuple[int, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        seen = RecordedRequest(request.method, request.url.path, request.url.query,
                               dict(request.headers), body, time.time())
        with self._lock:
            self._requests.append(seen)
            self._seen += 1
            if self.max_recorded is not None and len(self._requests) > self.max_recorded:
                del self._requests[:len(self._requests) - self.max_recorded]
            return self._seen, body

    async def _answer(self, request: Request, wire: Wire, *, model: str | None = None,
                      stream: bool | None = None) -> Response:
        """Answer a model call; ``model`` and ``stream`` where the path names them
        (Gemini), else the body does."""
        ordinal, body = await self._record(request)
        if not isinstance(body, dict):
            status, error = wire.error(Fault(400, message="request body is not a JSON object"), 0)
            return JSONResponse(error, status, headers=_ids(ordinal))
        problem = refusal(body, model) if model is not None else None
        if problem is not None:  # what the API itself refuses (Gemini's turn rules)
            status, error = wire.error(Fault(400, message=problem), 0)
            return JSONResponse(error, status, headers=_ids(ordinal))
        reply = self.script.reply_to(body)
        fault = _fault_of(request, reply)
        refused = await self._refusal(request, wire, fault, prompt_tokens(body), ordinal)
        if refused is not None:
            return refused
        named = body if model is None else {**body, "model": model}
        completion = complete(reply, named, ordinal=ordinal, budget=wire.output_budget(body),
                              tokenizer=self.tokenizer if wire is CHAT else None)
        if body.get("stream") if stream is None else stream:
            frames = self._stream(wire, completion, body, fault)
            return StreamingResponse(frames, media_type="text/event-stream",
                                     headers={**_ids(ordinal), "cache-control": "no-cache"})
        async with self._slots.hold(self.latency.max_concurrency):
            await asyncio.sleep(self.latency.prefill_s(completion.input_tokens)
                                + self.latency.decode_s(completion.output_tokens))
        return JSONResponse(wire.render(completion, body), headers=_ids(ordinal))

    async def _refusal(self, request: Request, wire: Wire, fault: Fault | None,
                       input_tokens: int, ordinal: int) -> Response | None:
        """Apply the delaying faults; return the error response a fault or the window calls for."""
        if fault is not None and fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault is not None and fault.hang_s is not None:
            await self._hang(request, fault.hang_s)
            fault = Fault(504, message="simulated hang: no answer")
        window = self.context_window
        if (fault is None or fault.status is None) and window and input_tokens > window:
            fault = Fault.context_length(window, input_tokens)
        if fault is None or fault.status is None:
            return None
        status, error = wire.error(fault, input_tokens)
        return JSONResponse(error, status, headers=_ids(ordinal))

    async def _hang(self, request: Request, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.closing.is_set():
            if await request.is_disconnected():
                return
            await asyncio.sleep(_HANG_POLL_S)

    async def _stream(self, wire: Wire, completion: Completion, body: dict[str, Any],
                      fault: Fault | None) -> AsyncIterator[bytes]:
        drop_after = fault.drop_after if fault is not None else None
        async with self._slots.hold(self.latency.max_concurrency):
            await asyncio.sleep(self.latency.prefill_s(completion.input_tokens))
            pacer = DecodePacer(self.latency.decode_tokens_per_s)
            for sent, frame in enumerate(wire.frames(completion, body)):
                if drop_after is not None and sent >= drop_after:
                    raise StreamDropped(f"fault: connection dropped after {sent} events")
                await pacer.advance(frame.tokens)
                yield frame.encode()


def _fault_of(request: Request, reply: Reply) -> Fault | None:
    """A fault in the request's ``x-sim-fault`` header wins over the scripted one."""
    spec = request.headers.get(FAULT_HEADER)
    if not spec:
        return reply.fault
    try:
        return Fault.parse(spec)
    except ValueError as exc:  # a typo in a test's header is a 400, not a server crash
        return Fault(400, message=f"bad {FAULT_HEADER} header: {exc}")


def _ids(ordinal: int) -> dict[str, str]:
    request_id = f"req_sim{ordinal:06d}"
    return {"request-id": request_id, "x-request-id": request_id}


async def _client_left(request: Request, exc: Exception) -> Response:
    """A client that left before its request's body was complete (a proxy dropping a
    request it held back): nothing was recorded, nobody reads the answer."""
    return Response(status_code=499)
