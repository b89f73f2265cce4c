"""The building blocks a plugin or an integration needs beyond the top-level tour.

``import agentcompact`` gives what an application uses (``Engine``, ``Budget``, the event
types, ``hookimpl``, ``redact``…). Code that extends agentcompact — a plugin, an
integration with an agent framework, a server in front of a provider — also needs the
pieces below; they are public and kept stable like the rest of the surface, and the
first-party plugins (``agentcompact.plugins``) and integrations (``agentcompact.integrations``)
import nothing else of the package (``tests/core/test_public_imports.py`` checks it):

- plugin loading and lookup: :func:`load_plugins`, :func:`registry`,
  :func:`get_strategy_factory` (also in ``agentcompact.plugins``);
- ids and counting: :func:`new_id` (episode and call ids), :func:`make_counter` (a token
  counter from a spec such as ``"tiktoken"`` or ``"hf:NAME"``) and :class:`MessageMeter`
  (cached message digests and sizes; pass one to ``Engine(counter=...)``);
  :class:`FixedTokens` (the tokens of a request's system prompt and tool schemas,
  remembered: what an integration passes as ``Engine.compact(fixed_tokens=...)``);
- safe logging: :func:`redact_headers` (HTTP headers with every credential replaced);
- dropped items as tool results: :func:`search_text` and :data:`DEFAULT_PAGE_CHARS` (what
  an ``expand`` tool pages by);
- RL rows: :class:`ChatTokenizer` (a trainer's tokenizer and chat template, with the
  hashes rows record).

Provider responses on the wire (reassembling streams, sampled token ids and logprobs) are
in :mod:`agentcompact.wire`.
"""

from __future__ import annotations

from ._events import new_id
from ._expand import DEFAULT_PAGE_CHARS, search_text
from ._fixed import FixedTokens
from ._pluginmanager import get_strategy_factory, load_plugins, registry
from ._redact import redact_headers
from ._tokens import MessageMeter, make_counter
from .trajectory._tokenize import ChatTokenizer

__all__ = [
    "ChatTokenizer",
    "DEFAULT_PAGE_CHARS",
    "FixedTokens",
    "MessageMeter",
    "get_strategy_factory",
    "load_plugins",
    "make_counter",
    "new_id",
    "redact_headers",
    "registry",
    "search_text",
]
