"""A :class:`Reply` made concrete for one request, and what a wire format must do with it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._script import Fault, Reply, Thinking, ToolCall, estimate_tokens, prompt_tokens

__all__ = ["Completion", "Frame", "SampledIds", "SimTokenizer", "Wire", "complete",
           "logprob_of", "token_logprobs"]


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
    #: The prompt and sampled token ids when the simulator has a tokenizer, else None.
    ids: SampledIds | None = None

    def call_id(self, prefix: str, index: int) -> str:
        """The call's own id, or a deterministic ``<prefix>sim<request>_<index>``."""
        own = self.tool_calls[index].id
        return own if own is not None else f"{prefix}sim{self.ordinal:04d}_{index}"

    def item_id(self, prefix: str, index: int = 0) -> str:
        return f"{prefix}_sim{self.ordinal:04d}_{index}"


def complete(reply: Reply, body: dict[str, Any], *, ordinal: int, budget: int | None,
             tokenizer: SimTokenizer | None = None) -> Completion:
    """Apply the request's output budget to ``reply`` and count its tokens (estimated, or
    the real counts of ``tokenizer``'s prompt and sampled ids when it is given)."""
    text, calls = reply.text, reply.tool_calls
    truncated = budget is not None and estimate_tokens(text) > budget
    if truncated:
        text, calls = text[: max(budget or 0, 0) * 4], ()
    thought = estimate_tokens(reply.thinking.text) if reply.thinking else 0
    spent = thought + estimate_tokens(text)
    spent += sum(estimate_tokens(call.name + call.arguments_json) for call in calls)
    ids = tokenizer.sample(body, text, calls, stopped=not truncated) if tokenizer else None
    return Completion(
        ordinal=ordinal,
        model=str(body.get("model") or "sim-model"),
        text=text,
        tool_calls=calls,
        thinking=reply.thinking,
        input_tokens=len(ids.prompt) if ids else prompt_tokens(body),
        output_tokens=len(ids.response) if ids else max(spent, 1),
        truncated=truncated,
        created=int(time.time()),
        ids=ids,
    )


@dataclass(frozen=True, slots=True)
class SampledIds:
    """What a serving engine knows of one answer: the prompt's token ids, the sampled ids
    (the message text, the tool-call text the template renders, the stop token), each
    sampled token's bytes and where the message text ends among them."""

    prompt: list[int]
    response: list[int]
    pieces: list[bytes]
    #: how many leading characters of the decoded response are the message text
    text_chars: int


class SimTokenizer:
    """A Hugging Face tokenizer and its chat template, used the way vLLM's
    OpenAI-compatible server uses them: the prompt is the template's render of the request
    (``messages``, ``tools``, the generation prompt); the model "samples" what the template
    renders for the assistant turn (text, then tool calls in the template's own syntax, as
    a tool parser reads them back) up to and including its end-of-turn token.

    :param tokenizer: a path or hub name for ``AutoTokenizer``, or a loaded tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        if isinstance(tokenizer, (str, os.PathLike)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self.hf = tokenizer
        self.eos_text = str(tokenizer.eos_token or "")
        self._special = {int(i): str(t.content)
                         for i, t in tokenizer.added_tokens_decoder.items()}
        table: dict[int, str] = bytes_to_unicode()  # type: ignore[no-untyped-call]
        self._bytes_of = {c: b for b, c in table.items()}

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (byte-level BPE; an added token: its text)."""
        if token_id in self._special:
            return self._special[token_id].encode()
        piece = str(self.hf.convert_ids_to_tokens(token_id))
        return bytes(self._bytes_of[c] for c in piece)

    def sample(self, body: Mapping[str, Any], text: str, calls: tuple[ToolCall, ...], *,
               stopped: bool = True) -> SampledIds:
        """The ids of one answer; ``stopped=False`` (cut by the output budget): no stop
        token was sampled."""
        messages = [_template_message(m) for m in body.get("messages") or []]
        tools = body.get("tools") or None
        ask = self.hf.apply_chat_template(messages, tools=tools, tokenize=False,
                                          add_generation_prompt=True)
        # the content as the wire sends it (None for a turn of tool calls only)
        answer: dict[str, Any] = {"role": "assistant",
                                  "content": text if text or not calls else None}
        if calls:
            answer["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": _loaded(
                    c.arguments_json)}} for c in calls]
        full = self.hf.apply_chat_template([*messages, answer], tools=tools, tokenize=False)
        sampled = full[len(ask):] if full.startswith(ask) else text + self.eos_text
        end = sampled.rfind(self.eos_text) if self.eos_text else -1
        sampled = sampled[: end + len(self.eos_text)] if end >= 0 else sampled
        if not stopped and self.eos_text and sampled.endswith(self.eos_text):
            sampled = sampled[: -len(self.eos_text)]
        response = list(self.hf.encode(sampled, add_special_tokens=False))
        return SampledIds(prompt=list(self.hf.encode(ask, add_special_tokens=False)),
                          response=response, pieces=[self.token_bytes(t) for t in response],
                          text_chars=len(text) if sampled.startswith(text) else 0)


def _loaded(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _template_message(message: Any) -> Any:
    """A Chat Completions message as chat templates take it (vLLM does the same): text
    parts joined, tool-call arguments parsed from their JSON strings."""
    if not isinstance(message, Mapping):
        return message
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = "".join(str(p.get("text", "")) for p in content
                                 if isinstance(p, Mapping))
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [
            {**call, "function": {**call["function"], "arguments": _loaded(
                call["function"].get("arguments") or "{}")}}
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping)
            and isinstance(call["function"].get("arguments"), str) else call
            for call in out["tool_calls"]]
    return out


def token_logprobs(pieces: Sequence[str | bytes], start: int, top: int,
                   ids: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Deterministic per-token logprobs in OpenAI's shape (``top`` alternatives each); a
    piece given as bytes (a real token, maybe part of a UTF-8 character) keeps its exact
    ``bytes`` and shows as text with invalid bytes replaced, as vLLM shows it. With ``ids``
    (vLLM's ``return_tokens_as_token_ids``) each token is named ``token_id:<id>`` and its
    ``bytes`` are that name's, as vLLM's chat server writes them."""
    if ids is not None:
        return [_logprob(f"token_id:{tid}", start + i, top, f"token_id:{tid + 1}")
                for i, tid in enumerate(ids)]
    return [_logprob(piece, start + i, top) for i, piece in enumerate(pieces)]


def logprob_of(position: int) -> float:
    """The simulator's logprob of its sampled token at ``position`` of the answer."""
    return -0.01 * (1 + position % 7)


def _logprob(piece: str | bytes, position: int, top: int,
             other: str | None = None) -> dict[str, Any]:
    raw = piece if isinstance(piece, bytes) else piece.encode()
    text = raw.decode("utf-8", errors="replace")
    chosen = logprob_of(position)
    alternatives = [
        {"token": text if rank == 0 else other or f"<alt{rank}>",
         "logprob": chosen - 2.0 * rank,
         "bytes": list(raw if rank == 0 else (other or f"<alt{rank}>").encode())}
        for rank in range(top)
    ]
    return {"token": text, "logprob": chosen, "bytes": list(raw),
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
