"""Token accounting: counters and a per-message cache.

Three counters ship: ``TiktokenCounter`` (default, ``o200k_base``), ``HFTokenizerCounter``
(a Hugging Face tokenizer, extra ``hf``) and ``CharEstimateCounter`` (chars/4, what many
peers use; it under-counts JSON-heavy contexts).

A message's size is the tokens of its verbatim text parts (text, thinking, tool-call
arguments, tool results) plus ``MESSAGE_OVERHEAD`` tokens for the role and framing, plus
``IMAGE_TOKENS`` per image. ``MessageMeter`` caches sizes twice: by object identity (a
history that grew by one message costs one message) and by content digest (a request
parsed afresh from JSON costs a digest per message, not a tokenization).

Offline use: tiktoken downloads its BPE files on first use. On a machine without
internet, point ``TIKTOKEN_CACHE_DIR`` at a folder holding them (file names are tiktoken's
cache keys; ``llama-index-core`` ships both files in ``llama_index/core/_static/tiktoken_cache``).
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .errors import ConfigError, TokenizerError

if TYPE_CHECKING:
    from .dialects._base import Dialect

__all__ = [
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD",
    "CharEstimateCounter",
    "HFTokenizerCounter",
    "MessageMeter",
    "Measured",
    "TiktokenCounter",
    "TokenCounter",
    "make_counter",
]

MESSAGE_OVERHEAD = 4
IMAGE_TOKENS = 1600
_NONE: frozenset[str] = frozenset()
_TAKEN_MAX = 8_192  # counted texts kept for deferred counts (a bound: more are taken again)


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of text. ``name`` identifies it in caches and reports.

    Optional: ``at_most_utf8_bytes = True`` declares that a text never counts more tokens
    than its UTF-8 bytes (true of byte-level BPE: every token covers at least one byte).
    It lets callers bound a count without tokenizing (:meth:`MessageMeter.bound`).
    """

    name: str

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        """Token counts of each text, in order."""
        ...


def _tiktoken_offline(encoding: str, exc: Exception) -> str:
    """One line for a BPE file tiktoken could neither find in its cache nor download."""
    cache = (os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
             or os.path.join(tempfile.gettempdir(), "data-gym-cache"))
    return (f"tiktoken's {encoding} BPE file is not in its cache ({cache}) and could not be "
            f"downloaded ({type(exc).__name__}); on a machine online run "
            f"TIKTOKEN_CACHE_DIR=DIR python -c \"import tiktoken; "
            f"tiktoken.get_encoding('{encoding}')\", then copy DIR here and set "
            "TIKTOKEN_CACHE_DIR to it")


class TiktokenCounter:
    """tiktoken BPE counting (``o200k_base`` by default: GPT-4o/4.1/5, a fair proxy for
    Claude and most open models)."""

    #: byte-level BPE: every token covers at least one byte of the text
    at_most_utf8_bytes = True

    def __init__(self, encoding: str = "o200k_base") -> None:
        import tiktoken

        if encoding not in tiktoken.list_encoding_names():
            raise TokenizerError(f"unknown tiktoken encoding {encoding!r}; known: "
                                 f"{', '.join(tiktoken.list_encoding_names())}")
        try:
            self._enc = tiktoken.get_encoding(encoding)
        except Exception as exc:  # tiktoken raises bare errors when it cannot download
            raise TokenizerError(_tiktoken_offline(encoding, exc)) from exc
        self.name = f"tiktoken:{encoding}"
        # The token ids as one native buffer instead of a list of Python ints (what
        # ``encode_to_numpy`` uses): the same encoding, no int objects to build and free.
        self._buffer = getattr(getattr(self._enc, "_core_bpe", None),
                               "encode_to_tiktoken_buffer", None)

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        if len(texts) > 16 and sum(map(len, texts)) > 1_000_000 and (workers := _workers()) > 1:
            # tiktoken encodes without the GIL: a few threads, each counting a run of
            # texts (``encode_ordinary_batch`` makes one task and one list of ids per
            # text: on a 16,000-message history its tasks' handoffs cost more than the
            # encoding, and more the more texts there are)
            size = -(-len(texts) // (4 * workers))
            runs = [texts[i:i + size] for i in range(0, len(texts), size)]
            out: list[int] = []
            with ThreadPoolExecutor(workers, thread_name_prefix="agentcompact-count") as pool:
                for counts in pool.map(self._count_run, runs):
                    out += counts
            return out
        return self._count_run(texts)

    def _count_run(self, texts: Sequence[str]) -> list[int]:
        return [self._count(t) if t else 0 for t in texts]

    def _count(self, text: str) -> int:
        if self._buffer is not None:
            try:  # no special tokens allowed: every text is ordinary text (encode_ordinary)
                return memoryview(self._buffer(text, _NONE)).nbytes >> 2  # u32 ids
            except UnicodeEncodeError:
                pass  # lone surrogates: encode_ordinary repairs the text first
        return len(self._enc.encode_ordinary(text))


def _workers() -> int:
    """Threads that count a large batch: the CPUs this process may run on, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return min(cpus, 8)


class HFTokenizerCounter:
    """Counts with a Hugging Face tokenizer (``tokenizers`` fast tokenizer; extra ``hf``).

    ``name_or_path`` is a local folder holding ``tokenizer.json`` or a hub name.
    """

    def __init__(self, name_or_path: str) -> None:
        try:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(name_or_path)
        except ImportError as exc:
            raise TokenizerError(
                "HFTokenizerCounter needs the 'hf' extra: pip install 'agentcompact[hf]'"
            ) from exc
        except Exception as exc:
            raise TokenizerError(f"cannot load tokenizer {name_or_path!r}: {exc}") from exc
        self.name = f"hf:{name_or_path}"

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        enc = self._tok(list(texts), add_special_tokens=False)["input_ids"]
        return [len(ids) for ids in enc]


class CharEstimateCounter:
    """chars/4, rounded up: no tokenizer, no accuracy (JSON and code run ~20% over)."""

    name = "chars/4"
    at_most_utf8_bytes = True

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        return [(len(t) + 3) // 4 for t in texts]


def make_counter(spec: str | TokenCounter | None) -> TokenCounter:
    """A counter from a spec: ``None``/``"tiktoken"`` (o200k_base),
    ``"tiktoken:cl100k_base"``, ``"hf:PATH_OR_NAME"``, ``"chars"``, or a counter object."""
    if spec is None or spec == "tiktoken":
        return TiktokenCounter()
    if not isinstance(spec, str):
        if not isinstance(spec, TokenCounter):
            raise ConfigError(f"counter {spec!r} has no count_texts(texts) method")
        return spec
    if spec.startswith("tiktoken:"):
        return TiktokenCounter(spec.split(":", 1)[1])
    if spec.startswith("hf:"):
        return HFTokenizerCounter(spec.split(":", 1)[1])
    if spec in ("chars", "chars/4"):
        return CharEstimateCounter()
    raise ConfigError(
        f"unknown counter {spec!r}: use 'tiktoken', 'tiktoken:ENCODING', 'hf:PATH', 'chars'"
    )


@dataclass(frozen=True, slots=True)
class Measured:
    """Digests and token counts of a message list, index-aligned."""

    digests: list[str]
    tokens: list[int]


class MessageMeter:
    """Digests and sizes of messages, cached by identity and by digest.

    ``max_entries`` bounds each cache, and grows to twice the longest list measured (a
    history is never evicted by its own length). The identity cache holds a reference to
    each message it saw, so an ``id`` is never reused while cached. Messages are treated
    as immutable values once measured: a message mutated in place after a call is seen
    as unchanged until evicted (``clear()`` forgets).
    """

    def __init__(self, counter: TokenCounter, dialect: Dialect, max_entries: int = 200_000):
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries <= 0:
            raise ConfigError(f"MessageMeter.max_entries must be a positive int, got "
                              f"{max_entries!r}")
        self.counter = counter
        self.dialect = dialect
        self._max = max_entries
        self._by_id: OrderedDict[int, tuple[Any, str, int]] = OrderedDict()
        self._by_digest: OrderedDict[str, int] = OrderedDict()
        self._count_of_made: tuple[Dialect, Any] | None = None  # (dialect, _count_of())
        #: the counted text of each message :meth:`measure_deferred` left uncounted, by
        #: identity (with the message: its id stays its), for :meth:`count_deferred`
        self._taken: dict[int, tuple[Any, tuple[str, int]]] = {}

    def clear(self) -> None:
        self._by_id.clear()
        self._by_digest.clear()
        self._taken.clear()

    def measure(self, messages: Sequence[Any],
                counted: Sequence[tuple[str, int]] | None = None) -> Measured:
        """Digests and token counts of ``messages``. ``counted``, when given, holds each
        message's ``dialect.counted_text`` (already computed by the caller)."""
        digests, tokens, missing = self._cached(messages)
        if missing:
            self._count_missing(messages, missing, digests, tokens, counted)
        return Measured(digests, tokens)

    def measure_deferred(self, messages: Sequence[Any]) -> tuple[Measured, dict[int, int]]:
        """Digests and the cached counts of ``messages``, tokenizing nothing: a message
        never counted has ``0`` and, in the dict returned beside, its index and an upper
        bound of its count (what :meth:`bound` takes for it). :meth:`count_deferred`
        counts those later, exactly (from the counted text taken for the bound, kept
        until then). Only for a counter that declares ``at_most_utf8_bytes`` (else:
        :meth:`measure`, nothing deferred)."""
        if not getattr(self.counter, "at_most_utf8_bytes", False):
            return self.measure(messages), {}
        digests, tokens, missing = self._cached(messages)
        pending: dict[int, int] = {}
        if missing:
            count_of = self._count_of()
            taken = self._taken
            if len(taken) + len(missing) > _TAKEN_MAX:
                taken.clear()
            for i in missing:
                message = messages[i]
                counted = count_of(message)
                taken[id(message)] = (message, counted)
                pending[i] = _byte_bound(*counted)
                tokens[i] = 0
        return Measured(digests, tokens), pending

    def _cached(self, messages: Sequence[Any], digests: Sequence[str] | None = None
                ) -> tuple[list[str], list[int], list[int]]:
        """Digests of ``messages`` (``digests``, when the caller has them), their cached
        counts (``-1`` where none is) and the indices of those without one."""
        if 2 * len(messages) > self._max:
            # a history longer than the bound (thousands of turns replayed at once) would
            # evict its own first messages and count them again at every compaction of
            # the replay: the bound follows the longest history measured, never shrinks
            self._max = 2 * len(messages)
        out: list[str] = []
        tokens: list[int] = []
        missing: list[int] = []
        by_id, by_digest = self._by_id, self._by_digest
        for i, message in enumerate(messages):
            hit = by_id.get(id(message))
            if hit is not None and hit[0] is message:
                out.append(hit[1])
                tokens.append(hit[2])
                continue
            if digests is not None:
                digest = digests[i]
            else:
                try:
                    digest = self.dialect.digest(message)
                except Exception:  # one message a dialect cannot digest never stops a session
                    digest = _fallback_digest(message)
            out.append(digest)
            count = by_digest.get(digest)
            if count is None:
                missing.append(i)
                count = -1
            else:
                self._remember(message, digest, count)
            tokens.append(count)
        return out, tokens, missing

    def count_deferred(self, messages: Sequence[Any], digests: Sequence[str]) -> list[int]:
        """The exact counts of ``messages`` whose digests are ``digests`` (from
        :meth:`measure_deferred`), the ones not cached yet tokenized in one batch: the
        same numbers :meth:`measure` gives."""
        out, tokens, missing = self._cached(messages, digests)
        if missing:
            taken = self._taken
            counted = []
            for i in missing:
                message = messages[i]
                found = taken.pop(id(message), None)
                counted.append(found[1] if found is not None and found[0] is message
                               else self._count_of()(message))
            self._count_missing(messages, missing, out, tokens,
                                dict(zip(missing, counted)))
        return tokens

    def bound(self, messages: Sequence[Any]) -> int | None:
        """An upper bound on the tokens ``measure`` would give ``messages``, found without
        tokenizing: cached counts as they are, other messages as the UTF-8 bytes of their
        counted text plus what ``measure`` adds (message overhead, images). ``None`` when
        the counter does not declare ``at_most_utf8_bytes``."""
        if not getattr(self.counter, "at_most_utf8_bytes", False):
            return None
        count_of = self._count_of()
        by_id = self._by_id
        total = 0
        for message in messages:
            hit = by_id.get(id(message))
            if hit is not None and hit[0] is message:
                total += hit[2]
                continue
            total += _byte_bound(*count_of(message))
        return total

    def count(self, message: Any) -> int:
        """Tokens of one message (cached)."""
        return self.measure([message]).tokens[0]

    def _count_missing(
        self, messages: Sequence[Any], missing: list[int], digests: list[str], tokens: list[int],
        counted: Sequence[tuple[str, int]] | Mapping[int, tuple[str, int]] | None = None,
    ) -> None:
        count_of = self._count_of()
        texts: list[str] = []
        images: list[int] = []
        for i in missing:
            text, n_images = counted[i] if counted is not None else count_of(messages[i])
            texts.append(text)
            images.append(n_images)
        counts = self.counter.count_texts(texts)
        for i, count, n_images in zip(missing, counts, images):
            total = count + MESSAGE_OVERHEAD + n_images * IMAGE_TOKENS
            tokens[i] = total
            self._by_digest[digests[i]] = total
            self._remember(messages[i], digests[i], total)
        while len(self._by_digest) > self._max:
            self._by_digest.popitem(last=False)

    def _count_of(self) -> Any:
        """What a message is counted from: the dialect's ``counted_text``, except for a
        message the dialect does not model (``is_opaque``: counted from its JSON, its real
        size, not a placeholder) or cannot read (a lone surrogate, JSON nested deeper
        than orjson takes: counted from its JSON as :func:`safe_json` writes it)."""
        made = self._count_of_made
        if made is not None and made[0] is self.dialect:
            return made[1]
        from .dialects._base import json_text

        counted = getattr(self.dialect, "counted_text", None) or self._counted_text
        opaque = getattr(self.dialect, "is_opaque", None)

        def count_of(message: Any) -> tuple[str, int]:
            try:
                if opaque is not None and opaque(message):
                    return json_text(message), 0
                result: tuple[str, int] = counted(message)
                return result
            except Exception:
                try:
                    return json_text(message), 0
                except TypeError:
                    return repr(type(message)), 0
        self._count_of_made = (self.dialect, count_of)
        return count_of

    def _counted_text(self, message: Any) -> tuple[str, int]:
        """``Dialect.counted_text`` for a dialect object that does not derive from it."""
        parts = self.dialect.parts(message)
        return ("\n".join(p.text for p in parts if p.text),
                sum(1 for p in parts if p.kind == "image"))

    def _remember(self, message: Any, digest: str, count: int) -> None:
        self._by_id[id(message)] = (message, digest, count)
        if len(self._by_id) > self._max:
            self._by_id.popitem(last=False)

    def count_text_message(self, text: str) -> int:
        """Tokens of a text message (no caching: used for compaction messages)."""
        return self.counter.count_texts([text])[0] + MESSAGE_OVERHEAD


def _byte_bound(text: str, n_images: int) -> int:
    """An upper bound of a message's count from its counted text's UTF-8 bytes (a counter
    declaring ``at_most_utf8_bytes``), its overhead and its images."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return size + MESSAGE_OVERHEAD + n_images * IMAGE_TOKENS


def _fallback_digest(message: Any) -> str:
    """A digest of a message its dialect cannot digest (a lone surrogate or deep nesting
    its serializer refuses): from its JSON (:func:`safe_json`) or, for an object, its repr."""
    import xxhash

    from .dialects._base import safe_json

    try:
        text = "json:" + safe_json(message, sort_keys=True, volatile=False)
    except TypeError:
        text = "repr:" + repr(message)
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))
