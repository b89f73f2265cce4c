"""Provider responses as they travel on the wire, read back into messages and RL figures.

One module shared by everything that sees a provider's answer: the proxy (``--record`` and
the RL gateway), the SDK wrappers (``agentcompact.integrations.sdk``), the framework
integrations and the local summarizer. Pure functions over parsed JSON and SSE bytes; no
HTTP client or server is imported here.

- :func:`reassemble` / :func:`reassembler` / :func:`from_body` turn a response (a JSON
  body, an SSE stream, or the parsed stream events fed one by one) back into the native
  assistant messages a non-streaming call would have returned, for the Anthropic Messages,
  OpenAI Chat Completions, OpenAI Responses and Gemini protocols (:class:`Reassembled`);
- :func:`from_chat_completion` / :func:`from_chat_chunks` / :func:`from_responses` read
  what a server reports about the tokens it sampled (:class:`SampledTokens`: vLLM/SGLang
  token ids, OpenAI logprobs and token bytes), and :func:`token_ids_from_bytes` maps
  OpenAI's token bytes to a tokenizer's ids;
- ``ANTHROPIC``, ``CHAT``, ``RESPONSES``, ``GEMINI`` name the protocols as dialects do.
"""

from __future__ import annotations

from ._names import ANTHROPIC, CHAT, GEMINI, RESPONSES
from ._reassemble import (
    Reassembled,
    Reassembler,
    SSEReader,
    from_body,
    iter_events,
    iter_sse,
    parse_events,
    reassemble,
    reassemble_events,
    reassembler,
)
from ._sampled import (
    SampledTokens,
    from_chat_chunks,
    from_chat_completion,
    from_responses,
    read_chat,
    token_ids_from_bytes,
)

__all__ = [
    "ANTHROPIC",
    "CHAT",
    "GEMINI",
    "RESPONSES",
    "Reassembled",
    "Reassembler",
    "SSEReader",
    "SampledTokens",
    "from_body",
    "from_chat_chunks",
    "from_chat_completion",
    "from_responses",
    "iter_events",
    "iter_sse",
    "parse_events",
    "read_chat",
    "reassemble",
    "reassemble_events",
    "reassembler",
    "token_ids_from_bytes",
]
