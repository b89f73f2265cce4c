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
  ``response_token_ids`` (the name some patched servers use) is read as ``token_ids``;
* vLLM with ``return_tokens_as_token_ids: true``: each scored token is named
  ``token_id:<id>`` (its ``bytes`` are that name's, not the token's): the ids are read from
  the names when the choice has no ``token_ids``.

Streams are read with :func:`from_chat_chunks` (the parsed ``data:`` objects in order).

OpenAI reports no token ids, only each token's ``token`` and ``bytes``: those bytes are kept
(``response_token_bytes``) so the exporter can map them to its tokenizer's ids
(:func:`token_ids_from_bytes`) and keep the logprobs when every token maps and the ids
decode back to the sampled text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SampledTokens", "from_chat_chunks", "from_chat_completion", "from_responses",
           "read_chat", "token_ids_from_bytes"]


@dataclass(frozen=True, slots=True)
class SampledTokens:
    """Token ids and logprobs of one response, each ``None`` when the server sent none."""

    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    #: the token strings the logprobs belong to (OpenAI ``token``), for alignment checks
    logprob_tokens: list[str] | None = field(default=None)
    #: each scored token's bytes (OpenAI ``bytes``; the UTF-8 of ``token`` when absent)
    token_bytes: list[list[int]] | None = field(default=None)

    def model_call_fields(self) -> dict[str, Any]:
        """The ``ModelCall`` keyword arguments: ``ModelCall(..., **tokens.model_call_fields())``
        (also those of a ``SummaryCall``). Token bytes are kept only without ids."""
        return {"prompt_token_ids": self.prompt_token_ids,
                "response_token_ids": self.response_token_ids,
                "response_logprobs": self.response_logprobs,
                "response_token_bytes": self.token_bytes
                if self.response_token_ids is None else None}


# The readers below run once per streamed token (a 64k-token answer: 64k chunks), so
# their checks are made at C speed: ``set(map(type, ...))`` for "only ints" (a bool is
# not one), ``bytes(...)`` for "byte values".
_INT = {int}


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and (not value or set(map(type, value)) == _INT):
        return list(value)
    return None


def _byte_values(value: Any) -> list[int] | None:
    """``value`` as a list of byte values (ints in 0..255), else ``None``."""
    ints = _ints(value)
    if ints is None:
        return None
    try:
        bytes(ints)
    except ValueError:
        return None
    return ints


_Scored = tuple[list[float], list[str], list[list[int]]]


def _scored(entries: Any) -> _Scored | None:
    if not isinstance(entries, list):
        return None
    logprobs, tokens, raw = [], [], []
    for e in entries:
        if type(e) is not dict and not isinstance(e, Mapping):
            return None
        logprob = e.get("logprob")
        if not isinstance(logprob, (int, float)):
            return None
        logprobs.append(float(logprob))
        token = e.get("token", "")
        tokens.append(token if type(token) is str else str(token))
        given = _byte_values(e.get("bytes"))
        raw.append(given if given is not None else list(tokens[-1].encode()))
    return logprobs, tokens, raw


def _choice(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """Choice 0 (by its ``index``: a stream of ``n > 1`` interleaves the choices)."""
    choices = body.get("choices")
    if type(choices) is list and choices:
        first = choices[0]  # the usual case: one choice
        if type(first) is dict and first.get("index", 0) == 0:
            return first
    for choice in choices if isinstance(choices, list) else ():
        if (type(choice) is dict or isinstance(choice, Mapping)) and choice.get("index", 0) == 0:
            return choice
    return {}


def _prompt_ids(body: Mapping[str, Any], choice: Mapping[str, Any]) -> list[int] | None:
    """vLLM sends ``prompt_token_ids`` at the top of a chat body (the first chunk of a
    stream); its completions API puts them on the choice."""
    return _ints(body.get("prompt_token_ids", choice.get("prompt_token_ids")))


def _response_ids(choice: Mapping[str, Any]) -> list[int] | None:
    return _ints(choice.get("token_ids", choice.get("response_token_ids")))


def _named(tokens: list[str]) -> list[int] | None:
    """The ids of tokens vLLM named ``token_id:<id>`` (``return_tokens_as_token_ids``)."""
    ids = []
    for token in tokens:
        match = _TOKEN_ID.match(token)
        if match is None:
            return None
        ids.append(int(match.group(1)))
    return ids


_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def from_chat_completion(body: Mapping[str, Any]) -> SampledTokens:
    """From a non-streamed ``chat.completion`` body (OpenAI or vLLM), or what one
    ``chat.completion.chunk`` of a stream adds."""
    prompt, ids, scored = read_chat(body)
    return SampledTokens(
        prompt_token_ids=prompt,
        response_token_ids=ids,
        response_logprobs=scored[0] if scored else None,
        logprob_tokens=scored[1] if scored else None,
        token_bytes=scored[2] if scored else None,
    )


def read_chat(body: Mapping[str, Any]
              ) -> tuple[list[int] | None, list[int] | None, _Scored | None]:
    """``from_chat_completion``'s figures as a tuple (prompt ids, response ids, and the
    logprobs, their tokens and token bytes): what a stream's reassembler reads of each
    chunk, without building a ``SampledTokens`` per token."""
    choice = _choice(body)
    logprobs = choice.get("logprobs")
    scored = _scored(logprobs.get("content")) if isinstance(logprobs, Mapping) else None
    ids = _response_ids(choice)
    if ids is None and scored and scored[1]:
        ids = _named(scored[1])
    return _prompt_ids(body, choice), ids, scored


def from_chat_chunks(chunks: Iterable[Mapping[str, Any]]) -> SampledTokens:
    """From the ``chat.completion.chunk`` objects of a stream, in order."""
    prompt: list[int] | None = None
    ids: list[int] = []
    logprobs: list[float] = []
    tokens: list[str] = []
    raw: list[list[int]] = []
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
            raw += part.token_bytes or []
            saw_logprobs = True
    return SampledTokens(prompt, ids if saw_ids else None,
                         logprobs if saw_logprobs else None, tokens if saw_logprobs else None,
                         raw if saw_logprobs else None)


def from_responses(body: Mapping[str, Any]) -> SampledTokens:
    """From a Responses API ``response`` object (``output_text`` parts' ``logprobs``)."""
    logprobs: list[float] = []
    tokens: list[str] = []
    raw: list[list[int]] = []
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
                    raw += scored[2]
                    seen = True
    return SampledTokens(response_logprobs=logprobs if seen else None,
                         logprob_tokens=tokens if seen else None,
                         token_bytes=raw if seen else None)


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte in a
    byte-level BPE vocabulary (Qwen, Llama 3, GPT-2, ...)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in kept:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


_BYTE_CHARS = _byte_chars()


def token_ids_from_bytes(pieces: Sequence[Sequence[int]], tokenizer: Any) -> list[int] | None:
    """The id of each token given by its bytes, or ``None`` unless every one maps to exactly
    one id of ``tokenizer``: a ``tiktoken.Encoding`` (``encode_single_token``), or a
    Hugging Face tokenizer with a byte-level vocabulary (its added tokens by their text).
    The caller checks that the ids decode to the sampled text."""
    try:
        raw = [bytes(piece) for piece in pieces]
    except (TypeError, ValueError):  # not lists of byte values (a malformed record)
        return None
    return _ids_of(raw, tokenizer)


def _ids_of(pieces: list[bytes], tokenizer: Any) -> list[int] | None:
    encode_single = getattr(tokenizer, "encode_single_token", None)
    out: list[int] = []
    if encode_single is not None:  # tiktoken
        for piece in pieces:
            try:
                out.append(int(encode_single(piece)))
            except KeyError:
                return None
        return out
    vocab = _vocab(tokenizer)
    added = {str(t.content): int(i)
             for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()}
    for piece in pieces:
        try:
            text: str | None = piece.decode()
        except UnicodeDecodeError:
            text = None
        found = added.get(text) if text is not None else None
        if found is None:
            found = vocab.get("".join(_BYTE_CHARS[b] for b in piece))
        if found is None:
            return None
        out.append(found)
    return out


_VOCABS: dict[int, tuple[Any, dict[str, int]]] = {}


def _vocab(tokenizer: Any) -> dict[str, int]:
    """``tokenizer.get_vocab()`` (cached per tokenizer object: it is built anew per call)."""
    held = _VOCABS.get(id(tokenizer))
    if held is None or held[0] is not tokenizer:
        if len(_VOCABS) >= 4:
            _VOCABS.clear()
        held = (tokenizer, dict(tokenizer.get_vocab()))
        _VOCABS[id(tokenizer)] = held
    return held[1]
