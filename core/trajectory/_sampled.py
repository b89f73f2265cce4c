"""What a server reports about the tokens it sampled, read from its response bodies.

An integration fills :class:`agentcompact._events.ModelCall`'s ``prompt_token_ids``,
``response_token_ids`` and ``response_logprobs`` from :class:`SampledTokens` before it
reports the call (the recorder writes them as they are; the exporter trains on engine ids
as they are, never re-tokenized, and keeps logprobs only next to ids it can check).

Read here, for choice 0:

* OpenAI Chat Completions ``logprobs`` (request ``logprobs: true``):
  ``choices[0].logprobs.content[]`` → ``{token, logprob, bytes}`` per sampled token of the
  message text (OpenAI reports none for tool-call arguments);
* OpenAI Responses ``include: ["message.output_text.logprobs"]``:
  ``output[].content[].logprobs[]`` of each ``output_text`` part;
* vLLM's OpenAI-compatible server with ``return_token_ids: true`` (vLLM >= 0.10.2):
  top-level ``prompt_token_ids`` and ``choices[0].token_ids``; in a stream, the first
  chunk's ``prompt_token_ids`` and each chunk's ``choices[0].token_ids``.
  ``response_token_ids`` (the name some patched servers use) is read as ``token_ids``.

Streams are read with :func:`from_chat_chunks` (the parsed ``data:`` objects in order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SampledTokens", "from_chat_chunks", "from_chat_completion", "from_responses"]


@dataclass(frozen=True, slots=True)
class SampledTokens:
    """Token ids and logprobs of one response, each ``None`` when the server sent none."""

    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    #: the token strings the logprobs belong to (OpenAI ``token``), for alignment checks
    logprob_tokens: list[str] | None = field(default=None)

    def model_call_fields(self) -> dict[str, Any]:
        """The ``ModelCall`` keyword arguments: ``ModelCall(..., **tokens.model_call_fields())``."""
        return {"prompt_token_ids": self.prompt_token_ids,
                "response_token_ids": self.response_token_ids,
                "response_logprobs": self.response_logprobs}


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                       for x in value):
        return list(value)
    return None


def _scored(entries: Any) -> tuple[list[float], list[str]] | None:
    if not isinstance(entries, list):
        return None
    logprobs, tokens = [], []
    for e in entries:
        if not isinstance(e, Mapping) or not isinstance(e.get("logprob"), (int, float)):
            return None
        logprobs.append(float(e["logprob"]))
        tokens.append(str(e.get("token", "")))
    return logprobs, tokens


def _choice(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """Choice 0 (by its ``index``: a stream of ``n > 1`` interleaves the choices)."""
    choices = body.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
            return choice
    return {}


def _prompt_ids(body: Mapping[str, Any], choice: Mapping[str, Any]) -> list[int] | None:
    """vLLM sends ``prompt_token_ids`` at the top of a chat body (the first chunk of a
    stream); its completions API puts them on the choice."""
    return _ints(body.get("prompt_token_ids", choice.get("prompt_token_ids")))


def _response_ids(choice: Mapping[str, Any]) -> list[int] | None:
    return _ints(choice.get("token_ids", choice.get("response_token_ids")))


def from_chat_completion(body: Mapping[str, Any]) -> SampledTokens:
    """From a non-streamed ``chat.completion`` body (OpenAI or vLLM), or what one
    ``chat.completion.chunk`` of a stream adds."""
    choice = _choice(body)
    logprobs = choice.get("logprobs")
    scored = _scored(logprobs.get("content")) if isinstance(logprobs, Mapping) else None
    return SampledTokens(
        prompt_token_ids=_prompt_ids(body, choice),
        response_token_ids=_response_ids(choice),
        response_logprobs=scored[0] if scored else None,
        logprob_tokens=scored[1] if scored else None,
    )


def from_chat_chunks(chunks: Iterable[Mapping[str, Any]]) -> SampledTokens:
    """From the ``chat.completion.chunk`` objects of a stream, in order."""
    prompt: list[int] | None = None
    ids: list[int] = []
    logprobs: list[float] = []
    tokens: list[str] = []
    saw_ids = saw_logprobs = False
    for chunk in chunks:
        part = from_chat_completion(chunk)
        prompt = prompt or part.prompt_token_ids
        if part.response_token_ids is not None:
            ids += part.response_token_ids
            saw_ids = True
        if part.response_logprobs is not None:
            logprobs += part.response_logprobs
            tokens += part.logprob_tokens or []
            saw_logprobs = True
    return SampledTokens(prompt, ids if saw_ids else None,
                         logprobs if saw_logprobs else None, tokens if saw_logprobs else None)


def from_responses(body: Mapping[str, Any]) -> SampledTokens:
    """From a Responses API ``response`` object (``output_text`` parts' ``logprobs``)."""
    logprobs: list[float] = []
    tokens: list[str] = []
    seen = False
    for item in body.get("output") or []:
        if not isinstance(item, Mapping) or item.get("type") != "message":
            continue
        for part in item.get("content") or []:
            if isinstance(part, Mapping) and part.get("type") == "output_text":
                scored = _scored(part.get("logprobs"))
                if scored and scored[0]:
                    logprobs += scored[0]
                    tokens += scored[1]
                    seen = True
    return SampledTokens(response_logprobs=logprobs if seen else None,
                         logprob_tokens=tokens if seen else None)
