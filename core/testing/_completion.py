"""A :class:`Reply` made concrete for one request, and what a wire format must do with it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ._script import Fault, Reply, Thinking, ToolCall, estimate_tokens, prompt_tokens

__all__ = ["Completion", "Frame", "Wire", "complete", "token_logprobs"]


@dataclass(frozen=True, slots=True)
class Completion:
    """One answer as the provider would send it: text cut to the output budget, usage counted."""

    ordinal: int
    model: str
    text: str
    tool_calls: tuple[ToolCall, ...]
    thinking: Thinking | None
    input_tokens: int
    output_tokens: int
    #: The output budget (max tokens) cut the text short; tool calls are then dropped.
    truncated: bool
    created: int

    def call_id(self, prefix: str, index: int) -> str:
        """The call's own id, or a deterministic ``<prefix>sim<request>_<index>``."""
        own = self.tool_calls[index].id
        return own if own is not None else f"{prefix}sim{self.ordinal:04d}_{index}"

    def item_id(self, prefix: str, index: int = 0) -> str:
        return f"{prefix}_sim{self.ordinal:04d}_{index}"


def complete(reply: Reply, body: dict[str, Any], *, ordinal: int, budget: int | None) -> Completion:
    """Apply the request's output budget to ``reply`` and count its tokens."""
    text, calls = reply.text, reply.tool_calls
    truncated = budget is not None and estimate_tokens(text) > budget
    if truncated:
        text, calls = text[: max(budget or 0, 0) * 4], ()
    thought = estimate_tokens(reply.thinking.text) if reply.thinking else 0
    spent = thought + estimate_tokens(text)
    spent += sum(estimate_tokens(call.name + call.arguments_json) for call in calls)
    return Completion(
        ordinal=ordinal,
        model=str(body.get("model") or "sim-model"),
        text=text,
        tool_calls=calls,
        thinking=reply.thinking,
        input_tokens=prompt_tokens(body),
        output_tokens=max(spent, 1),
        truncated=truncated,
        created=int(time.time()),
    )


def token_logprobs(pieces: list[str], start: int, top: int) -> list[dict[str, Any]]:
    """Deterministic per-token logprobs in OpenAI's shape (``top`` alternatives each)."""
    return [_logprob(piece, start + i, top) for i, piece in enumerate(pieces)]


def _logprob(piece: str, position: int, top: int) -> dict[str, Any]:
    chosen = -0.01 * (1 + position % 7)
    alternatives = [
        {"token": piece if rank == 0 else f"<alt{rank}>", "logprob": chosen - 2.0 * rank,
         "bytes": list((piece if rank == 0 else f"<alt{rank}>").encode())}
        for rank in range(top)
    ]
    return {"token": piece, "logprob": chosen, "bytes": list(piece.encode()),
            "top_logprobs": alternatives}


@dataclass(frozen=True, slots=True)
class Frame:
    """One server-sent event; ``tokens`` output tokens it carries pace it at the decode rate."""

    data: dict[str, Any] | str
    event: str | None = None
    tokens: int = 0

    def encode(self) -> bytes:
        data = self.data if isinstance(self.data, str) else json.dumps(self.data)
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {data}\n\n".encode()


class Wire(Protocol):
    """One provider API surface: how it reads budgets and writes answers and errors."""

    name: str

    def output_budget(self, body: dict[str, Any]) -> int | None:
        """The request's max output tokens, if it sets one."""

    def render(self, completion: Completion, body: dict[str, Any]) -> dict[str, Any]:
        """The non-streaming JSON body."""

    def frames(self, completion: Completion, body: dict[str, Any]) -> Iterator[Frame]:
        """The streaming events, in the provider's order."""

    def error(self, fault: Fault, input_tokens: int) -> tuple[int, dict[str, Any]]:
        """HTTP status and the provider's error JSON for ``fault``."""
