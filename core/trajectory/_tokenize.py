"""Token ids for segment rows: the trainer's tokenizer, its chat template, and an incremental
token stream that checks the prefix property at token level.

When the serving engine did not report token ids, a segment is rebuilt from its messages:
``prompt_ids`` = template(first context, ``add_generation_prompt=True``), then for each call
the assistant's sampled text (mask 1) and the observation / template glue up to the next
generation prompt (mask 0). Each piece is tokenized as the suffix of the longer templated
text. Rather than re-tokenizing the whole conversation per call (quadratic), the stream
re-tokenizes only the text since the last *hard* special token (``<|im_start|>``,
``<|im_end|>``...): a Hugging Face tokenizer splits added special tokens out before any
pre-tokenization, so ``encode(a + b) == encode(a[:cut]) + encode(a[cut:] + b)`` at such a
token. ``TokenStream(verify=True)`` re-checks that claim against a full encode.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..dialects._base import Dialect
from ..errors import TokenizerError

__all__ = [
    "ChatTokenizer",
    "TokenStream",
    "extend_chat",
    "tail_text",
    "to_chat_messages",
    "to_chat_tools",
]


class PrefixBreak(Exception):  # internal signal between tokenize and segments, not API
    """The next context is not a token-level prefix-extension: start a new segment."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ----------------------------------------------------------------- dialect → chat template


def _arguments(text: str) -> Any:
    """Tool-call arguments as the dict chat templates expect (``tojson`` on a string would
    double-encode it); text that is not a JSON object stays text."""
    try:
        value = orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, dict):  # a Gemini systemInstruction: a content of parts
        system = system.get("parts")
    if isinstance(system, list):  # Anthropic system blocks, Gemini parts
        return "\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return ""


def _message_to_chat(message: Any, dialect: Dialect) -> list[dict[str, Any]]:
    role = dialect.role(message)
    parts = dialect.parts(message)
    results = [
        {"role": "tool", "tool_call_id": p.ref, "content": p.text}
        for p in parts if p.kind == "tool_result"
    ]
    texts = [p.text for p in parts if p.kind == "text"]
    if role in ("system", "developer"):
        return [{"role": "system", "content": "\n".join(texts)}]
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        thinking = [p.text for p in parts if p.kind == "thinking" and p.text]
        if thinking:
            out["reasoning_content"] = "\n".join(thinking)
        calls = [
            {"type": "function", "id": p.ref,
             "function": {"name": p.name, "arguments": _arguments(p.text)}}
            for p in parts if p.kind == "tool_call"
        ]
        if calls:
            out["tool_calls"] = calls
        return [out]
    user = [{"role": "user", "content": "\n".join(texts)}] if texts or not results else []
    return results + user


def _merge_assistant(into: dict[str, Any], item: dict[str, Any]) -> None:
    """Consecutive model items (Responses API) form one assistant turn."""
    for key in ("content", "reasoning_content"):
        if item.get(key):
            into[key] = "\n".join(x for x in (into.get(key), item[key]) if x)
    if item.get("tool_calls"):
        into["tool_calls"] = [*into.get("tool_calls", []), *item["tool_calls"]]


def to_chat_messages(
    messages: Sequence[Any], dialect: Dialect, system: Any = None
) -> list[dict[str, Any]]:
    """Native messages of ``dialect`` → chat-template messages (role/content/tool_calls,
    ``role: tool`` results). Anthropic: text blocks joined, ``tool_use`` → ``tool_calls``,
    ``tool_result`` → tool messages, ``thinking`` → ``reasoning_content``. ``system`` is
    the request's top-level system prompt (Anthropic), prepended when given."""
    text = _system_text(system)
    head = [{"role": "system", "content": text}] if text else []
    return extend_chat(head, messages, dialect)


def extend_chat(
    chat: Sequence[dict[str, Any]], messages: Sequence[Any], dialect: Dialect
) -> list[dict[str, Any]]:
    """``chat`` (left unchanged) followed by ``messages`` converted: equal to converting
    the whole native list at once, at the cost of the new messages only."""
    out = list(chat)
    copied = False  # the last item of ``chat`` is shared: copy before merging into it
    for message in messages:
        for item in _message_to_chat(message, dialect):
            if item["role"] == "assistant" and out and out[-1]["role"] == "assistant":
                if not copied:
                    out[-1] = dict(out[-1])
                _merge_assistant(out[-1], item)
            else:
                out.append(item)
            copied = True
    return out


#: where a tool's JSON schema is: Anthropic, OpenAI, Gemini (wire and SDK spellings)
_SCHEMA_KEYS = ("input_schema", "parameters", "parametersJsonSchema",
                "parameters_json_schema")


def _gemini_declarations(tools: list[Any]) -> list[Any]:
    """Gemini's ``[{"functionDeclarations": [...]}, {"googleSearch": {}}]`` flattened to its
    function declarations; other shapes as they are (a built-in tool such as search is no
    function a template can show: the caller leaves it out)."""
    out: list[Any] = []
    for tool in tools:
        declared = None
        if isinstance(tool, dict):
            declared = tool.get("functionDeclarations", tool.get("function_declarations"))
        out.extend(declared if isinstance(declared, list) else [tool])
    return out


def to_chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Request tool definitions (OpenAI chat, Responses, Anthropic or Gemini shape) → the
    OpenAI function shape chat templates render; ``None`` when there are none."""
    if not tools:
        return None
    out = []
    for tool in _gemini_declarations(tools):
        if not isinstance(tool, dict):
            continue
        if "function" in tool:
            out.append(tool)
        elif "input_schema" in tool or tool.get("type") == "function" or "name" in tool:
            params: Any = next((tool[k] for k in _SCHEMA_KEYS if tool.get(k) is not None), {})
            fn = {"name": tool.get("name", ""), "description": tool.get("description", ""),
                  "parameters": params}
            out.append({"type": "function", "function": fn})
    return out or None


# ----------------------------------------------------------------- the tokenizer


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_DICT_NAMES = frozenset(dir(dict))
#: ``loop.*`` values (no methods, no underscore): the sandbox allows them all
_LOOP_VALUES = frozenset({"index", "index0", "revindex", "revindex0", "first", "last",
                          "length", "depth", "depth0", "previtem", "nextitem"})


def _compile(template: str) -> Any:
    """The template compiled the way transformers compiles it (sandboxed jinja), or
    ``None`` to render through ``apply_chat_template``.

    Compiled in an overlay of transformers' environment (same sandbox, filters and
    globals) whose attribute lookup takes a shortcut for ``message.role`` on a plain dict:
    the sandbox first tries a Python attribute of that name, failing with an exception,
    before the key; half of a render's time. The result is the same: names that are
    attributes of ``dict`` (``items``, ``__class__``...) still go through the sandbox, and
    of ``loop`` only its plain values (``loop.index0``...) skip the sandbox's checks.
    The template's globals are flattened into one dict (the same names and values).
    """
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # transformers moved its private helper: use the public API
        return None
    from jinja2.runtime import LoopContext

    env = _compile_jinja_template(template).environment.overlay()
    sandboxed = env.getattr
    undefined = env.undefined

    def getattr_(obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_NAMES:
            try:
                return obj[attribute]
            except KeyError:
                return undefined(obj=obj, name=attribute)
        if kind is LoopContext and attribute in _LOOP_VALUES:
            return getattr(obj, attribute)  # what the sandbox returns for these
        return sandboxed(obj, attribute)

    env.getattr = getattr_
    compiled = env.from_string(template)
    # its globals as one dict rather than jinja's ChainMap over the environment's: every
    # render copies them into a fresh context, key by key in Python for a ChainMap (the
    # environment is this overlay, its globals not changed after this)
    compiled.globals = dict(compiled.globals)
    return compiled


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """Reasoning under the names templates read (as transformers aliases it)."""
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


#: split patterns (Qwen2 / GPT-4o style; Llama 3's, digits in threes) for which ``joins``
#: is shown to hold; compared as the exact strings of the tokenizer's configuration
_NEWLINE_SPLIT_PATTERNS = frozenset({
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
})

#: text between hard tokens this long is encoded once and reused (``encode_batch``)
_CHUNK_CHARS = 1024
_CHUNKS = 256  # at most this many chunks, holding at most _CHUNK_IDS ids in all
_CHUNK_IDS = 1 << 20


@dataclass(frozen=True, slots=True)
class _Hard:
    """Special tokens that always split the text (no lstrip/rstrip, not normalized)."""

    ids: frozenset[int]
    pattern: re.Pattern[str] | None


def _check_tokenizer_path(name: str) -> None:
    """A file, or a path that is not there, named where a tokenizer folder belongs."""
    path = Path(name).expanduser()
    if path.is_file():
        raise TokenizerError(f"tokenizer {name!r} is a file; give the folder holding it "
                             f"({path.parent}), or a Hugging Face model name")
    looks_local = path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if looks_local and not path.exists():
        raise TokenizerError(f"tokenizer folder {name!r} does not exist; give a folder holding "
                             "tokenizer.json, or a Hugging Face model name")


class ChatTokenizer:
    """The trainer's tokenizer and chat template, with the hashes rows record.

    :param tokenizer: a Hugging Face *fast* tokenizer with a chat template.
    :param name: the name or path it was loaded from (``tokenizer_name`` of the rows).
    """

    def __init__(self, tokenizer: Any, name: str) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise TokenizerError(f"{name}: need a fast (tokenizers-backed) tokenizer")
        if not getattr(tokenizer, "chat_template", None):
            raise TokenizerError(f"{name}: the tokenizer has no chat template")
        self.hf = tokenizer
        self.name = name
        self._backend = tokenizer.backend_tokenizer
        self._encode_batch = getattr(self._backend, "encode_batch_fast",
                                     self._backend.encode_batch)  # tokenizers < 0.20: no _fast
        self.chat_template_sha256 = _sha256(str(tokenizer.chat_template).encode())
        self.tokenizer_sha256 = self._tokenizer_sha256(name)
        self.eos_text = str(tokenizer.eos_token or "")
        self.hard = self._hard_tokens()
        self._template_kwargs = dict(tokenizer.special_tokens_map)
        self._compiled = _compile(str(tokenizer.chat_template))
        self._chunks: OrderedDict[str, list[int]] = OrderedDict()  # see encode_batch
        self._chunk_ids = 0
        self._reuse = self._splits_at_hard_tokens()
        self._added = [str(t.content) for t in tokenizer.added_tokens_decoder.values()]
        self._glue = self._splits_after_newline()
        self._glue_tails: dict[str, bool] = {}  # see joins

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the Hugging Face tokenizer, its name, hash and reuse setting (export
        worker processes): the template is compiled again, the reuse cache starts empty.
        Cheaper than loading by name (no ``AutoTokenizer``: its import pulls in torch), and
        exact for a tokenizer changed after loading (another chat template, say)."""
        return _restore, (self.hf, self.name, self.tokenizer_sha256, self._reuse)

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike[str]) -> ChatTokenizer:
        """Load with ``transformers.AutoTokenizer`` (local path or cached hub name)."""
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise TokenizerError("export needs transformers: pip install agentcompact[export]"
                                 ) from exc
        name = str(name_or_path)
        _check_tokenizer_path(name)
        try:
            tok = AutoTokenizer.from_pretrained(name)
        except (OSError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise TokenizerError(f"cannot load tokenizer {name!r}: {first} (give the trainer's "
                                 "Hugging Face model name, or a local folder holding its "
                                 "tokenizer.json and tokenizer_config.json)") from exc
        return cls(tok, name)

    def _tokenizer_sha256(self, name: str) -> str:
        """sha256 of ``tokenizer.json`` when loaded from a folder holding one, else of the
        backend tokenizer's serialized JSON (the same bytes ``save_pretrained`` writes)."""
        file = Path(name) / "tokenizer.json"
        if file.is_file():
            return _sha256(file.read_bytes())
        return _sha256(self._backend.to_str().encode())

    def _hard_tokens(self) -> _Hard:
        hard = {
            tid: tok.content for tid, tok in self.hf.added_tokens_decoder.items()
            if tok.special and not (tok.lstrip or tok.rstrip or tok.normalized)
        }
        if not hard:
            return _Hard(frozenset(), None)
        alternation = "|".join(re.escape(t) for t in sorted(hard.values(), key=len, reverse=True))
        return _Hard(frozenset(hard), re.compile(alternation))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special tokens in it recognized, none added."""
        return self.encode_batch([text])[0]

    def encode_pair(self, a: str, b: str) -> tuple[list[int], list[int]]:
        """``(encode(a), encode(b))`` in one call (the Rust side runs them in parallel)."""
        if a == b:
            ids = self.encode(a)
            return ids, ids
        first, second = self.encode_batch([a, b])
        return first, second

    def _splits_at_hard_tokens(self) -> bool:
        """Whether ``encode(a + H + b) == encode(a) + [H] + encode(b)`` for every hard token
        ``H`` on probe strings (the property ``TokenStream`` relies on; a tokenizer that
        prepends a space to the first word only fails it)."""
        if self.hard.pattern is None:
            return False
        probes = [("a\n", "\nb"), (" x ", " y\n\n"), ("word", "word"), ("\n", " ")]
        for tid in self.hard.ids:
            h = self.hf.convert_ids_to_tokens(tid)
            for a, b in probes:
                got = self._plain([a + h + b, a, b])
                if got[0] != got[1] + [tid] + got[2]:
                    return False
        return True

    def _splits_after_newline(self) -> bool:
        """Whether the pipeline is one where ``joins`` holds (read from its configuration,
        not inferred from probes): no normalizer or NFC; pre-tokenized by exactly one of
        ``_NEWLINE_SPLIT_PATTERNS`` (isolated) then byte-level without a regex; a BPE model
        without dropout; added tokens without strip / single-word rules and none holding
        a newline. Probes are checked too, as a guard against a misread configuration."""
        backend = self._backend
        try:
            norm = backend.normalizer
            norm_type = None if norm is None else orjson.loads(norm.__getstate__())["type"]
            pre = orjson.loads(backend.pre_tokenizer.__getstate__())
            model = backend.model
        except Exception:  # another tokenizers API: no shortcut
            return False
        if norm_type not in (None, "NFC") or type(model).__name__ != "BPE" or model.dropout:
            return False
        if pre.get("type") != "Sequence" or len(pre.get("pretokenizers", ())) != 2:
            return False
        split, byte_level = pre["pretokenizers"]
        if (split.get("type") != "Split" or split.get("behavior") != "Isolated"
                or split.get("invert") or split.get("pattern", {}).get("Regex")
                not in _NEWLINE_SPLIT_PATTERNS):
            return False
        if (byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex")
                or byte_level.get("add_prefix_space")):
            return False
        for token in self.hf.added_tokens_decoder.values():
            if token.lstrip or token.rstrip or token.single_word or "\n" in token.content:
                return False
        probes = [("assistant\n", "Hello"), ("x\n\n", "<tool_call>\n{}"), (" \n", "'s")]
        return all(self._plain([a + b]) == [sum(self._plain([a, b]), [])] for a, b in probes)

    def joins(self, tail: str, piece: str) -> bool:
        """Whether ``encode(tail + piece) == encode(tail) + encode(piece)`` follows from the
        tokenizer's pipeline (``_splits_after_newline``), so the joint text need not be
        encoded: ``tail`` ends with a newline and holds no added token, ``piece`` starts
        with a printable ASCII character other than space. Then no added token spans the
        cut (none holds a newline); NFC changes nothing across it (a newline neither
        composes nor reorders with what follows) and leaves the piece starting with a
        non-space character (an ASCII one, or its composition with marks); and every
        alternative of the split pattern that can match a newline ends at a newline or
        whitespace (``\\s*[\\r\\n]+``, `` ?[^\\s...]+[\\r\\n]*``, ``\\s+``), none at a
        non-space character after one, so a match ends at the cut, the matches before it
        see the same text up to it (``\\s+(?!\\S)`` is tried only where ``\\s*[\\r\\n]+``
        failed: a run of spaces not reaching the newline), the pattern has no look-behind,
        and BPE encodes each pre-token on its own."""
        if not self._glue or not piece or not "!" <= piece[0] <= "~":
            return False
        ok = self._glue_tails.get(tail)
        if ok is None:
            ok = tail.endswith("\n") and not any(t in tail for t in self._added)
            if len(self._glue_tails) < 256:
                self._glue_tails[tail] = ok
        return ok

    def _plain(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._encode_batch(texts, add_special_tokens=False)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]`` in one call: the Rust side runs them on its
        threads, and skips the character offsets when it can (``encode_batch_fast``).

        Text between two hard special tokens of at least ``_CHUNK_CHARS`` characters (a
        system prompt, tool definitions, a long tool output) is encoded once and its ids
        kept (the last ``_CHUNKS`` such chunks, ``_CHUNK_IDS`` ids at most): every episode
        of a run repeats its system prompt in its first prompt, and a segment starting
        after a break repeats the conversation so far. Exact, since hard tokens split the
        text before anything else (checked on probes when the tokenizer is loaded;
        otherwise nothing is reused).
        """
        texts = list(texts)
        if not self._reuse or not any(len(t) >= 2 * _CHUNK_CHARS for t in texts):
            return self._plain(texts)
        batch: list[str] = []
        plans: list[list[list[int] | int]] = []  # per text: ids, or a position in batch
        fresh: dict[str, int] = {}  # long chunks to encode -> position in batch
        for text in texts:
            plan: list[list[int] | int] = []
            for part, long in self._parts(text):
                known = self._chunks.get(part) if long else None
                if known is not None:
                    self._chunks.move_to_end(part)
                    plan.append(known)
                elif long and part in fresh:
                    plan.append(fresh[part])
                else:
                    if long:
                        fresh[part] = len(batch)
                    plan.append(len(batch))
                    batch.append(part)
            plans.append(plan)
        encoded = self._plain(batch)
        for part, at in fresh.items():
            self._chunks[part] = encoded[at]
            self._chunk_ids += len(encoded[at])
            while len(self._chunks) > _CHUNKS or self._chunk_ids > _CHUNK_IDS:
                self._chunk_ids -= len(self._chunks.popitem(last=False)[1])
        out = []
        for plan in plans:
            ids: list[int] = []
            for item in plan:
                ids.extend(encoded[item] if isinstance(item, int) else item)
            out.append(ids)
        return out

    def clear_reuse(self) -> None:
        """Forget the ids of long chunks kept by ``encode_batch`` (benchmarks: a cold start)."""
        self._chunks.clear()
        self._chunk_ids = 0

    def _parts(self, text: str) -> list[tuple[str, bool]]:
        """``text`` cut at hard tokens into (part, long) in order: each chunk between two
        hard tokens of ``_CHUNK_CHARS`` or more on its own (long), the rest in runs."""
        assert self.hard.pattern is not None
        parts: list[tuple[str, bool]] = []
        run = start = 0  # the current run starts at ``run``; the current chunk at ``start``
        for match in self.hard.pattern.finditer(text):
            if match.start() - start >= _CHUNK_CHARS:
                if start > run:
                    parts.append((text[run:start], False))
                parts.append((text[start:match.start()], True))
                run = match.start()
            start = match.end()
        if len(text) - start >= _CHUNK_CHARS:
            if start > run:
                parts.append((text[run:start], False))
            parts.append((text[start:], True))
        elif len(text) > run:
            parts.append((text[run:], False))
        return parts

    def render(
        self,
        chat: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The chat template applied to ``chat`` as text (what ``apply_chat_template(...,
        tokenize=False)`` returns, without its per-call deep copy of the conversation)."""
        if self._compiled is None:
            return self._render_slow(chat, tools, add_generation_prompt)
        messages = [_alias_reasoning(m) for m in chat]
        try:
            return str(self._compiled.render(
                messages=messages, tools=tools, documents=None,
                add_generation_prompt=add_generation_prompt, **self._template_kwargs,
            ))
        except Exception as exc:  # jinja raises its own exception types
            raise TokenizerError(f"{self.name}: chat template failed: {exc}") from exc

    def _render_slow(
        self, chat: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        try:
            text = self.hf.apply_chat_template(
                list(chat), tools=tools, tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except Exception as exc:  # jinja raises its own exception types
            raise TokenizerError(f"{self.name}: chat template failed: {exc}") from exc
        return str(text)

    def split_at_eos(self, text: str) -> tuple[str, str]:
        """``(sampled, glue)``: ``text`` cut just after its last end-of-turn token; what
        follows it is template glue the policy did not sample."""
        if self.eos_text:
            end = text.rfind(self.eos_text)
            if end >= 0:
                cut = end + len(self.eos_text)
                return text[:cut], text[cut:]
        return text, ""

    def info(self) -> dict[str, str]:
        return {"tokenizer_name": self.name, "tokenizer_sha256": self.tokenizer_sha256,
                "chat_template_sha256": self.chat_template_sha256}


def _restore(tokenizer: Any, name: str, tokenizer_sha256: str, reuse: bool) -> ChatTokenizer:
    """Unpickle a ``ChatTokenizer`` (see ``ChatTokenizer.__reduce__``)."""
    tok = ChatTokenizer(tokenizer, name)
    tok.tokenizer_sha256 = tokenizer_sha256  # as hashed when first loaded
    tok._reuse = reuse
    return tok


# ----------------------------------------------------------------- incremental stream


def tail_text(tok: ChatTokenizer, text: str) -> str:
    """``text`` after its last hard special token (all of it when it holds none)."""
    pattern = tok.hard.pattern
    end = None
    if pattern is not None:
        for match in pattern.finditer(text):
            end = match.end()
    return text if end is None else text[end:]


class TokenStream:
    """The token ids of one segment, grown piece by piece with the prefix property checked.

    Invariant: ``prompt_ids + response_ids == encode(all text appended)`` (checked against a
    full encode by ``verify()``). ``extend`` (observation and glue) raises ``PrefixBreak``
    when the longer text does not tokenize as a prefix-extension; ``sample`` (policy output)
    always appends ``encode(piece)`` on its own, as an engine would have produced it, and
    notes a break that the next ``extend`` reports.
    """

    def __init__(self, tok: ChatTokenizer, prompt_text: str, *, verify: bool = False,
                 memo: dict[str, list[int]] | None = None) -> None:
        self.tok = tok
        self.memo = {} if memo is None else memo
        self.prompt_ids = self._encode(prompt_text)
        self.response_ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self._text: list[str] | None = [prompt_text] if verify else None
        self._tail = ""
        self._tail_n = 0
        self._broken: str | None = None
        self._intact: tuple[int, int] | None = None  # (pieces, ids) before a broken sample
        #: sampled pieces kept as their own ids where the text would merge across the join
        self.tito_joins = 0
        self._retail(prompt_text, self.prompt_ids)

    @classmethod
    def from_ids(cls, tok: ChatTokenizer, prompt_ids: Sequence[int]) -> TokenStream:
        """A stream starting from engine-reported prompt ids."""
        stream = cls(tok, "")
        stream.prompt_ids = list(prompt_ids)
        stream._text = None
        return stream

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def extend_ids(self, next_prompt_ids: Sequence[int]) -> None:
        """Engine-reported ids of the next prompt: must extend every id so far (mask 0 for
        the new ones), else ``PrefixBreak``."""
        n = len(self)
        if list(next_prompt_ids[:n]) != self.ids:
            raise PrefixBreak("tokens")
        self.push_ids(next_prompt_ids[n:], 0)

    def _encode(self, text: str) -> list[int]:
        """``tok.encode(text)``, from ``memo`` when ``prefetch`` put it there."""
        ids = self.memo.get(text)
        return self.tok.encode(text) if ids is None else ids

    def _encode_pair(self, a: str, b: str) -> tuple[list[int], list[int]]:
        x, y = self.memo.get(a), self.memo.get(b)
        return self.tok.encode_pair(a, b) if x is None or y is None else (x, y)

    @staticmethod
    def inputs(tok: ChatTokenizer, tail: str, ops: Sequence[tuple[str, str]]) -> list[str]:
        """The texts ``extend`` / ``sample`` will encode for ``ops`` (``("extend" |
        "sample", piece)`` in order) from a stream whose window text is ``tail``: known
        from the text alone, so they can be encoded together beforehand (``prefetch``)."""
        out = []
        for kind, piece in ops:
            joint = tail + piece
            if kind == "sample":
                out.append(piece)
            out.append(tail if kind == "sample" and tok.joins(tail, piece) else joint)
            tail = tail_text(tok, joint)
        return out

    @staticmethod
    def prefetch(tok: ChatTokenizer, texts: Sequence[str],
                 memo: dict[str, list[int]]) -> None:
        """Encode ``texts`` missing from ``memo`` in one batch call into ``memo``."""
        todo = list(dict.fromkeys(t for t in texts if t not in memo))
        memo.update(zip(todo, tok.encode_batch(todo), strict=True))

    @property
    def tail(self) -> str:
        """The text since the last hard special token (what the next piece is joined to)."""
        return self._tail

    def _ids_tail(self) -> list[int]:
        """The last ``_tail_n`` ids: the tokens of the text since the last hard token."""
        n, r = self._tail_n, len(self.response_ids)
        if n <= r:
            return self.response_ids[r - n:]
        return self.prompt_ids[len(self.prompt_ids) - (n - r):] + self.response_ids

    def _retail(self, joint: str, joint_ids: list[int]) -> None:
        """Move the re-tokenization window to just after the last hard special token."""
        tail = tail_text(self.tok, joint)
        if len(tail) == len(joint):
            self._tail, self._tail_n = joint, len(joint_ids)
            return
        n_after = 0
        for tid in reversed(joint_ids):
            if tid in self.tok.hard.ids:
                break
            n_after += 1
        self._tail, self._tail_n = tail, n_after

    def _push(self, ids: list[int], mask: int, logprobs: Sequence[float] | None) -> None:
        self.response_ids.extend(ids)
        self.mask.extend([mask] * len(ids))
        if logprobs is None or mask == 0:
            self.logprobs.extend([0.0] * len(ids))
        else:
            self.logprobs.extend(float(x) for x in logprobs)

    def extend(self, piece: str) -> None:
        """Append observation / template glue (mask 0), or raise ``PrefixBreak``."""
        if self._broken:
            raise PrefixBreak(self._broken)
        if not piece:
            return
        joint = self._tail + piece
        joint_ids = self._encode(joint)
        old = self._ids_tail()
        if joint_ids[: len(old)] != old:
            raise PrefixBreak("tokens")
        self._push(joint_ids[len(old):], 0, None)
        self._note(piece)
        self._retail(joint, joint_ids)

    def sample(self, piece: str, engine_ids: Sequence[int] | None = None,
               logprobs: Sequence[float] | None = None) -> bool:
        """Append policy output (mask 1), tokenized on its own as an engine emits it (or,
        without ``engine_ids``, in context when that extends the ids so far).

        ``logprobs`` are kept only when ``engine_ids`` (the ids the engine reported) equal
        the ids produced here; returns whether they were kept (else the tokens get 0.0 and
        the caller records ``logprobs_mode: none``). A piece whose standalone ids differ from
        the joint tokenization makes the next ``extend`` raise ``PrefixBreak``.
        """
        joint = self._tail + piece
        if self.tok.joins(self._tail, piece):  # encode(joint) without encoding it again
            ids, tail_ids = self._encode_pair(piece, self._tail)
            joint_ids = tail_ids + ids
        else:
            ids, joint_ids = self._encode_pair(piece, joint)
        old = self._ids_tail()
        if engine_ids is None and joint_ids != old + ids:
            # No engine ids to be faithful to, and the text does not tokenize as a join of
            # the two: a tokenizing artefact, not a compaction, so the segment goes on.
            if joint_ids[:len(old)] == old:  # the piece's ids in context extend the ids
                ids = joint_ids[len(old):]
            else:  # the join merges into earlier ids: keep them, as token-in-token-out
                self._text = None  # agent loops do; the ids no longer equal encode(text)
                self.tito_joins += 1
                joint_ids = old + ids
        if joint_ids != old + ids:
            self._broken = "tokens"
            if self._text is not None:
                self._intact = (len(self._text), len(self))
        keep = logprobs is not None and engine_ids is not None and list(engine_ids) == ids
        self._push(ids, 1, logprobs if keep else None)
        self._note(piece)
        self._retail(joint, old + ids)
        return keep

    def push_ids(self, ids: Sequence[int], mask: int,
                 logprobs: Sequence[float] | None = None) -> None:
        """Append engine-reported ids as they are (no text; the window restarts empty)."""
        self._push(list(ids), mask, logprobs)
        self._tail, self._tail_n = "", 0
        self._text = None  # text no longer describes the ids

    def _note(self, piece: str) -> None:
        if self._text is not None:
            self._text.append(piece)

    def verify(self) -> None:
        """With ``verify=True``: assert the ids equal a full encode of the text. A piece
        sampled that does not tokenize as part of the text (its ids are its own encoding,
        as an engine emits them, and the segment ends after it) is left out of the check."""
        if self._text is None:
            return
        pieces, n = self._intact if self._intact is not None else (len(self._text), len(self))
        full = self.tok.encode("".join(self._text[:pieces]))
        if full != self.ids[:n]:
            raise AssertionError("incremental token stream differs from a full encode")
