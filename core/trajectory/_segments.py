"""Cutting one episode's model calls into segments, and building each segment's tokens.

A segment is one working-context window: consecutive model calls where each context sent
is a prefix-extension of the previous call's context + response. Three levels decide it:

1. messages — the dialect digests of the context must start with the digests of the previous
   context + response, with the same dialect, system prompt and tools;
2. text — the next templated prompt must start with the previous templated prompt + the
   sampled assistant text (a template that rewrites history, e.g. Qwen3 dropping earlier
   reasoning, fails here);
3. tokens — the ids of the longer text must extend the ids so far (``TokenStream``).

Any failure closes the segment and starts a new one with the current call. A compaction
event logged in between supplies the segment's ``compaction_trigger``. When the summarizer
was the policy (``SummaryCall.trained``), each summary becomes a segment of its own right
after it, trained in the context it was written in: its prompt is the summarizer's exact
chat (system prompt included), its response the summary (mask 1). An external summary is
not trained: it shows up in the next segment's prompt, mask 0 (ReSum-style).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .._events import CompactionEvent, ModelCall, SummaryCall
from ..dialects._base import Dialect, digest_of
from ..errors import TokenizerError, TrajectoryError
from ..wire import token_ids_from_bytes
from ._tokenize import (
    ChatTokenizer,
    PrefixBreak,
    TokenStream,
    extend_chat,
    tail_text,
    to_chat_messages,
    to_chat_tools,
)

__all__ = ["TRIGGERS", "Segment", "build_segments", "get_dialect"]

logger = logging.getLogger(__name__)

#: CompactionEvent.reason → the row's compaction_trigger
TRIGGERS = {
    "trigger": "token_budget",
    "reactive": "token_budget",
    "replay": "token_budget",
    "fold": "token_budget",  # the newest kept turn's large outputs cut once read
    "background": "token_budget",
    "token_budget": "token_budget",
    "turn_limit": "turn_limit",
    "forced": "model_initiated",
    "model_initiated": "model_initiated",
}

Item = tuple[str, Any]  # ("model_call", ModelCall) | ("compaction", ...) | ("summary_call", ...)


def get_dialect(name: str) -> Dialect:
    """The dialect registered under ``name`` (plugins included)."""
    from .._pluginmanager import get_dialect as lookup  # imported late: no import cycle

    return lookup(name)


@dataclass
class Segment:
    """The tokens of one segment and what ended it."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    rollout_logprobs: list[float]
    logprobs_known: bool
    sampling: dict[str, Any]
    policy_version: int
    model: str | None
    num_calls: int
    summary_span: list[int] = field(default_factory=list)
    summary_trained: bool = False
    compaction_trigger: str = "none"
    break_reason: str = ""  # why the next segment started: compaction/context/template/tokens
    messages_json: str | None = None
    prompt_json: str | None = None  # the prompt's chat-template messages (JSON list)
    tools_json: str | None = None  # the tool schemas of the prompt (chat-template form)

    @property
    def working_context(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def _recorded(call: ModelCall) -> bool:
    return call.prompt_token_ids is not None and call.response_token_ids is not None


#: Gemini request fields (camelCase on the wire, snake_case in Google's SDKs) → the names
#: the other dialects use: the system prompt, and the sampling settings that
#: ``generationConfig`` holds
_GEMINI_SYSTEM = ("systemInstruction", "system_instruction")
_GEMINI_SAMPLING = (("temperature", "temperature"), ("topP", "top_p"), ("top_p", "top_p"),
                    ("topK", "top_k"), ("top_k", "top_k"))


def _request(call: ModelCall) -> dict[str, Any]:
    """The request fields that shape the prompt and its sampling, under one set of names
    (``system``, ``instructions``, ``tools``, ``temperature``, ``top_p``, ``top_k``)."""
    req = call.request
    if call.dialect != "gemini":
        return req
    out = dict(req)
    system = next((req[k] for k in _GEMINI_SYSTEM if req.get(k) is not None), None)
    if system is not None:
        out["system"] = system
    config = req.get("generationConfig", req.get("generation_config"))
    if isinstance(config, dict):
        for wire, name in _GEMINI_SAMPLING:
            if config.get(wire) is not None:
                out[name] = config[wire]
    return out


def _shape(call: ModelCall) -> str:
    """Digest of the request fields other than messages that shape the prompt."""
    req = _request(call)
    return digest_of([call.dialect, req.get("system"), req.get("tools"), req.get("instructions")])


def _sampling(call: ModelCall, logprobs_known: bool) -> dict[str, Any]:
    return _sampling_of(_request(call), logprobs_known)


def _sampling_of(req: dict[str, Any], logprobs_known: bool) -> dict[str, Any]:
    """A row's ``sampling`` from the request fields a call was sent with."""

    def num(key: str) -> float | None:
        value = req.get(key)
        return float(value) if isinstance(value, (int, float)) else None

    top_k = req.get("top_k")
    return {
        "temperature": num("temperature"),
        "top_p": num("top_p"),
        "top_k": int(top_k) if isinstance(top_k, int) else None,
        "logprobs_mode": str(req.get("logprobs_mode", "raw")) if logprobs_known else "none",
    }


class _Window:
    """Chat-template renders of a growing conversation, each computed from a short window.

    Rendering the whole conversation on every call is quadratic in the number of calls. For
    a template that renders each message from its neighbours only (ChatML, Llama 3, ...),
    ``render(conv + new)`` = the text before the window, unchanged, + the window's part of
    ``render([conv[0], *conv[a:], *new])`` (``conv[0]`` is pinned: templates special-case the
    first message). ``head`` is that text before the window: the last trusted render minus
    the window's part, checked to be its suffix whenever the window is re-anchored.

    Nothing here is trusted blindly: ``render`` returns ``None`` when the window cannot be
    used (the caller renders in full), and the builder compares the last text against one
    full render when the segment closes, rebuilding the segment with full renders on any
    difference.
    """

    #: messages after ``conv[0]`` in the window before it is moved up to the last few
    LIMIT = 6
    KEEP = 2

    def __init__(self, tok: ChatTokenizer, tools: list[dict[str, Any]] | None) -> None:
        self.tok, self.tools = tok, tools
        self.conv: list[dict[str, Any]] = []
        self.head = ""
        self.start = 0  # the window: conv[0] + conv[start:]
        self.pin = ""  # render([conv[0]]): the prefix every window render starts with
        self.failures = 0  # anchorings that did not match: after two, full renders only

    def reset(self, conv: list[dict[str, Any]], text: str, gen: bool) -> None:
        """Trust ``text`` = render(``conv``, ``gen``) and anchor the window on it."""
        self.conv = []
        if len(conv) <= self.LIMIT or self.failures > 1 or not self._pin(conv[0]):
            return
        self._anchor(conv, text, gen)

    def _pin(self, first: dict[str, Any]) -> bool:
        try:
            self.pin = self.tok.render([first], self.tools)
        except TokenizerError:
            return False
        return True

    def _anchor(self, conv: list[dict[str, Any]], text: str, gen: bool) -> None:
        last = max(1, len(conv) - self.KEEP)
        # not inside a run of tool results (templates grouping them look one message back),
        # on the same parity if near (templates checking that roles alternate)
        starts = [i for i in range(last, max(0, last - 4), -1)
                  if conv[i].get("role") != "tool"]
        start = next((i for i in starts if i % 2 == 1), starts[0] if starts else last)
        part = self._part([conv[0], *conv[start:]], gen)
        if part is None or not text.endswith(part):
            self.conv = []
            self.failures += 1
            return
        self.conv, self.start = list(conv), start
        self.head = text[: len(text) - len(part)]

    def _part(self, window: list[dict[str, Any]], gen: bool) -> str | None:
        try:
            text = self.tok.render(window, self.tools, add_generation_prompt=gen)
        except TokenizerError:
            return None
        return text[len(self.pin):] if text.startswith(self.pin) else None

    def render(self, conv: list[dict[str, Any]], gen: bool) -> str | None:
        """render(``conv``, ``gen``) from the window, or ``None`` (render in full)."""
        old = self.conv
        if not old or len(conv) < len(old) - 1:
            return None
        same = next((i for i, (a, b) in enumerate(zip(old, conv)) if a is not b),
                    min(len(old), len(conv)))
        if same < self.start:  # a message before the window changed
            self.conv = []
            return None
        part = self._part([conv[0], *conv[self.start:]], gen)
        if part is None:
            self.conv = []
            return None
        text = self.head + part
        self.conv = list(conv)
        if len(conv) - self.start > self.LIMIT:
            self._anchor(conv, text, gen)
        return text


def _valued(messages: Sequence[Any]) -> list[Any]:
    """Messages without their keys whose value is ``None`` or empty (``[]``, ``{}``)."""
    return [{k: v for k, v in m.items() if v is not None and v != [] and v != {}}
            if isinstance(m, dict) else m for m in messages]


class _Redo(Exception):
    """A windowed render disagreed with a full one: rebuild the segment with full renders."""


@dataclass
class _Pending:
    """One call's token work, queued until ``_Builder.flush``, and the builder's text state
    before the call (restored if the call turns out not to extend the segment's tokens)."""

    index: int  # the call's position in the segment
    glue: str | None  # observation / template glue before the call's prompt (None: first)
    sampled: str
    engine_ids: list[int] | None
    logprobs: list[float] | None
    before: tuple[Any, ...]
    context: list[dict[str, Any]] | None = None
    gen: str = ""


#: queued text (characters) after which ``build_segments`` runs the token work
_PREFETCH_CHARS = 1 << 22


class _Builder:
    """Grows one segment call by call.

    Renders go through ``_Window`` (each call's prompt as an extension of the previous
    render) unless ``exact``; any break that depends on the text, and the segment's last
    text when it closes, are then checked against a full render, raising ``_Redo`` on a
    difference (``build_segments`` rebuilds the segment with ``exact=True``).

    Token work is queued: ``extend`` decides at message and text level, and ``flush`` then
    encodes every queued text in one batch (the tokenizer's threads) before running the
    ``TokenStream`` over it, which may find a token-level break at a queued call.
    """

    def __init__(self, call: ModelCall, tok: ChatTokenizer, *, verify: bool,
                 exact: bool = False, memo: dict[str, list[int]] | None = None) -> None:
        self.tok = tok
        self.dialect = get_dialect(call.dialect)
        self.first = call
        self.shape = _shape(call)
        request = _request(call)
        self.system = request.get("system") or request.get("instructions")
        self.tools = to_chat_tools(request.get("tools"))
        self.recorded = _recorded(call)
        self.logprobs_known = True
        self.unmapped: list[str] = []  # why a call's logprobs could not be given ids
        self.num_calls = 0
        self.window = None if exact or self.recorded else _Window(tok, self.tools)
        self.unverified = False  # some text came from the window
        self.verify = verify
        self.memo: dict[str, list[int]] = {} if memo is None else memo
        self.queue: list[_Pending] = []
        self.queued = 0  # characters of queued text
        self.stream: TokenStream | None = None
        self.chat = to_chat_messages(call.messages, self.dialect, self.system)
        self.prompt_chat = self.chat
        if self.recorded:
            self.stream = TokenStream.from_ids(tok, call.prompt_token_ids or [])
        else:
            self.gen = self._render(self.chat, True, full=True)
            self.prompt = self.gen
            self.queued = len(self.gen)
        self._respond(call, self.chat, None)

    def _render(self, chat: list[dict[str, Any]], gen: bool, *, full: bool = False) -> str:
        window = self.window
        text = None if window is None or full else window.render(chat, gen)
        if text is None:
            text = self.tok.render(chat, self.tools, add_generation_prompt=gen)
            if window is not None:
                window.reset(chat, text, gen)
        else:
            self.unverified = True
        return text

    def _confirm(self, chat: list[dict[str, Any]], gen: bool, text: str) -> None:
        """Raise ``_Redo`` unless ``text`` (maybe windowed) equals the full render."""
        if self.unverified and text != self.tok.render(chat, self.tools,
                                                       add_generation_prompt=gen):
            raise _Redo

    def _digests(self, messages: Sequence[Any]) -> list[str]:
        return [self.dialect.digest(m) for m in messages]

    def _state(self) -> tuple[Any, ...]:
        return (self.chat, self.ext, self.gen, self.after, self.full, self.num_calls)

    def _respond(self, call: ModelCall, context: list[dict[str, Any]],
                 pending: _Pending | None) -> None:
        self.num_calls += 1
        chat = extend_chat(context, call.response, self.dialect)
        if self.recorded:
            assert self.stream is not None
            self.stream.push_ids(call.response_token_ids or [], 1, call.response_logprobs)
            self.logprobs_known &= call.response_logprobs is not None
        else:
            full = self._render(chat, False)
            if not full.startswith(self.gen):
                self._confirm(chat, False, full)
                raise TrajectoryError(
                    f"episode {call.episode_id}, call {call.call_id}: the chat template "
                    "renders the assistant turn without its own generation prompt as prefix"
                )
            sampled, _ = self.tok.split_at_eos(full[len(self.gen):])
            if pending is None:
                pending = _Pending(0, None, "", None, None, ())
            pending.sampled = sampled
            pending.engine_ids, pending.logprobs = call.response_token_ids, call.response_logprobs
            if pending.engine_ids is None and pending.logprobs is not None:
                pending.engine_ids = self._mapped(call)
            self.queue.append(pending)
            self.queued += len(sampled) + len(pending.glue or "")
            self.after = self.gen + sampled
            self.full = full
        self.chat = chat
        self.ext = [*call.messages, *call.response]

    def _mapped(self, call: ModelCall) -> list[int] | None:
        """Ids for logprobs a server sent without them (OpenAI): each scored token's bytes
        mapped to exactly one id of the export's tokenizer (``TokenStream.sample`` keeps the
        logprobs only when these ids are the sampled turn's ids), else ``None``."""
        pieces = call.response_token_bytes
        ids = token_ids_from_bytes(pieces, self.tok.hf) if pieces else None
        if ids is None or len(ids) != len(call.response_logprobs or ()):
            self.unmapped.append(f"call {call.call_id}: " + (
                "the server sent logprobs without token ids or bytes" if not pieces else
                f"not every scored token's bytes is one token of {self.tok.name}"))
            return None
        return ids

    def _continues(self, call: ModelCall) -> bool:
        """Message level: the context starts with the previous context + response (equal
        natively, or equal digests: volatile fields such as ``cache_control`` ignored, and
        fields without a value: a server's answer carries ``refusal: null`` or
        ``annotations: []`` that a client does not send back)."""
        n = len(self.ext)
        head = call.messages[:n]
        if len(head) < n:
            return False
        return (bool(head == self.ext) or self._digests(head) == self._digests(self.ext)
                or self._digests(_valued(head)) == self._digests(_valued(self.ext)))

    def extend(self, call: ModelCall) -> str | None:
        """Add ``call`` to the segment, its token work queued; or return why it must start
        a new one (message or text level; a token-level break is found by ``flush``)."""
        if call.dialect != self.first.dialect or _shape(call) != self.shape:
            return "context"
        if not self._continues(call):
            return "context"
        if _recorded(call) != self.recorded:
            return "source"
        context = extend_chat(self.chat, call.messages[len(self.ext):], self.dialect)
        if self.recorded:
            assert self.stream is not None
            try:
                self.stream.extend_ids(call.prompt_token_ids or [])
            except PrefixBreak as exc:
                return exc.reason
            self._respond(call, context, None)
            return None
        gen = self._render(context, True)
        if not gen.startswith(self.after):
            self._confirm(context, True, gen)
            return "template"
        pending = _Pending(self.num_calls, gen[len(self.after):], "", None, None,
                           self._state(), context, gen)
        self.gen = gen
        self._respond(call, context, pending)
        return None

    def due(self) -> bool:
        """Enough token work is queued to run it now (bounds the memory it holds)."""
        return self.queued >= _PREFETCH_CHARS

    def flush(self) -> tuple[int, str] | None:
        """Run the queued token work: every text it needs encoded in one batch, then the
        stream. On a token-level break at a queued call, the builder goes back to its
        state before that call, and ``(its position in the segment, reason)`` is returned
        (the caller closes the segment and starts the next one with that call)."""
        queue, self.queue, self.queued = self.queue, [], 0
        if not queue:
            return None
        ops = [op for p in queue for op in ((("extend", p.glue),) if p.glue is not None else ())
               + (("sample", p.sampled),)]
        if self.stream is None:
            texts = [self.prompt, *TokenStream.inputs(self.tok, tail_text(self.tok, self.prompt),
                                                      ops)]
        else:
            texts = TokenStream.inputs(self.tok, self.stream.tail, ops)
        TokenStream.prefetch(self.tok, texts, self.memo)
        if self.stream is None:
            self.stream = TokenStream(self.tok, self.prompt, verify=self.verify, memo=self.memo)
        for p in queue:
            if p.glue is not None:
                try:
                    self.stream.extend(p.glue)
                except PrefixBreak as exc:
                    self.chat, self.ext, self.gen, self.after, self.full, self.num_calls = (
                        p.before)
                    assert p.context is not None
                    self._confirm(p.context, True, p.gen)
                    return p.index, exc.reason
            kept = self.stream.sample(p.sampled, p.engine_ids, p.logprobs)
            if not kept and p.logprobs is not None and p.engine_ids is not None:
                self.unmapped.append(
                    f"call {p.index} of the segment: {len(p.engine_ids)} scored tokens are "
                    f"not the sampled turn's tokens under {self.tok.name} (OpenAI scores "
                    "neither the stop token nor tool-call arguments)")
            self.logprobs_known &= kept
        return None

    def check(self) -> None:
        """Before the segment closes: its text so far equals a full render (else ``_Redo``)."""
        if self.queue:
            raise AssertionError("flush() the builder before closing it")
        if not self.recorded:
            self._confirm(self.chat, False, self.full)

    def close(self, *, keep_messages: bool, keep_prompts: bool = True) -> Segment:
        s = self.stream
        assert s is not None, "flush() the builder before closing it"
        s.verify()
        known = self.logprobs_known
        if self.unmapped and not known:
            logger.warning("episode %s: the server's logprobs are not kept (%d calls; first: "
                           "%s); the rows get logprobs_mode none: export with "
                           "--recompute-logprobs MODEL", self.first.episode_id,
                           len(self.unmapped), self.unmapped[0])
        return Segment(
            prompt_ids=s.prompt_ids,
            response_ids=s.response_ids,
            response_mask=s.mask,
            rollout_logprobs=s.logprobs if known else [0.0] * len(s.logprobs),
            logprobs_known=known,
            sampling=_sampling(self.first, known),
            policy_version=int(self.first.policy_version),
            model=self.first.model,
            num_calls=self.num_calls,
            summary_span=[],
            summary_trained=False,
            messages_json=orjson.dumps(self.chat).decode() if keep_messages else None,
            prompt_json=orjson.dumps(self.prompt_chat).decode() if keep_prompts else None,
            tools_json=orjson.dumps(self.tools).decode()
            if keep_prompts and self.tools is not None else None,
        )


def _summary_segment(summary: SummaryCall, tok: ChatTokenizer, first: ModelCall,
                     trigger: str, *, keep_messages: bool, keep_prompts: bool
                     ) -> Segment | None:
    """A policy-written summary as a segment of its own, in the context it was written in:
    the prompt is the summarizer's exact chat (its system prompt and instructions, rendered
    with the chat template and a generation prompt), the response the summary and its stop
    token (mask 1). ``None`` when the template does not render it prefix-stably."""
    chat = [dict(m) for m in summary.prompt]
    answer = {"role": "assistant", "content": summary.output}
    try:
        ask = tok.render(chat, None, add_generation_prompt=True)
        full = tok.render([*chat, answer], None)
    except TokenizerError:
        return None
    if not full.startswith(ask):
        return None
    logprobs = summary.response_logprobs
    if summary.prompt_token_ids is not None and summary.response_token_ids is not None:
        # the summarizer's server reported its ids: train on them as they are
        stream = TokenStream.from_ids(tok, summary.prompt_token_ids)
        known = logprobs is not None and len(logprobs) == len(summary.response_token_ids)
        stream.push_ids(summary.response_token_ids, 1, logprobs if known else None)
    else:
        stream = TokenStream(tok, ask)
        mapped = (token_ids_from_bytes(summary.response_token_bytes, tok.hf)
                  if summary.response_token_bytes and logprobs is not None else None)
        known = stream.sample(tok.split_at_eos(full[len(ask):])[0], mapped, logprobs)
    if logprobs is not None and not known:
        logger.warning("summary %s: the summarizer's logprobs are not its sampled tokens "
                       "under %s; the row gets logprobs_mode none (--recompute-logprobs)",
                       summary.call_id, tok.name)
    n = len(stream.response_ids)
    return Segment(
        prompt_ids=stream.prompt_ids, response_ids=stream.response_ids,
        response_mask=stream.mask, rollout_logprobs=stream.logprobs if known else [0.0] * n,
        logprobs_known=known,
        # the settings the summary was sampled at, never the agent's (an older log without
        # them: unknown, None); the weights that wrote it
        sampling=_sampling_of(summary.request, known),
        policy_version=int(summary.policy_version),
        model=summary.model or first.model, num_calls=0, summary_span=[0, n],
        summary_trained=True, compaction_trigger=trigger, break_reason="summary",
        messages_json=orjson.dumps([*chat, answer]).decode() if keep_messages else None,
        prompt_json=orjson.dumps(chat).decode() if keep_prompts else None,
    )


def _close(
    builder: _Builder,
    compaction: CompactionEvent | None,
    summaries: list[SummaryCall],
    *,
    reason: str,
    summary_trained: bool | None,
    keep_messages: bool,
    keep_prompts: bool = True,
) -> list[Segment]:
    """The builder's segment, then one segment per policy-written summary of the
    compaction that ended it (each in its own context: ``_summary_segment``)."""
    builder.check()
    segment = builder.close(keep_messages=keep_messages, keep_prompts=keep_prompts)
    segment.break_reason = "compaction" if reason and compaction is not None else reason
    if reason and compaction is not None:
        segment.compaction_trigger = TRIGGERS.get(compaction.reason, "token_budget")
    out = [segment]
    if reason:
        for summary in summaries:
            trained = summary.trained if summary_trained is None else summary_trained
            if trained and summary.output and not summary.error:
                own = _summary_segment(summary, builder.tok, builder.first,
                                       segment.compaction_trigger,
                                       keep_messages=keep_messages, keep_prompts=keep_prompts)
                if own is None:
                    logger.warning("summary %s: template not prefix-stable, not trained",
                                   summary.call_id)
                else:
                    out.append(own)
    return out


def build_segments(
    items: Sequence[Item],
    tok: ChatTokenizer,
    *,
    summary_trained: bool | None = None,
    verify: bool = False,
    keep_messages: bool = False,
    window: bool = True,
    keep_prompts: bool = True,
) -> list[Segment]:
    """Segments of one episode from its events in log order.

    :param items: ``(kind, value)`` pairs: ``model_call`` → ``ModelCall``, ``compaction`` →
        ``CompactionEvent``, ``summary_call`` → ``SummaryCall`` (other kinds ignored).
    :param tok: the trainer's tokenizer.
    :param summary_trained: override ``SummaryCall.trained`` for every summary.
    :param verify: check each segment's ids against a full encode of its text.
    :param keep_messages: fill ``messages_json`` (chat-template messages, for debugging).
    :param keep_prompts: fill ``prompt_json`` / ``tools_json`` (the segment's prompt
        messages and tool schemas: verl's dataset ``prompt`` column).
    :param window: render each call's prompt from a short window of the conversation
        (checked against one full render per segment, see ``_Window``); ``False`` renders
        the whole conversation on every call. The segments are the same either way.
    """
    segments: list[Segment] = []
    builder: _Builder | None = None
    begin = exact_at = -1  # item index of the builder's first call; of a rebuild
    compaction: CompactionEvent | None = None
    summaries: list[SummaryCall] = []
    # per call of the builder: its item index, and the compaction / summaries logged before it
    calls: list[tuple[int, CompactionEvent | None, list[SummaryCall]]] = []
    memo: dict[str, list[int]] = {}  # token ids of texts encoded ahead (this episode)

    def close(reason: str, before: CompactionEvent | None, done: list[SummaryCall]) -> None:
        assert builder is not None
        segments.extend(_close(builder, before, done, reason=reason,
                               summary_trained=summary_trained, keep_messages=keep_messages,
                               keep_prompts=keep_prompts))

    i = 0
    while i < len(items):
        kind, value = items[i]
        if kind == "compaction":
            compaction = value
        elif kind == "summary_call":
            summaries.append(value)
        elif kind == "model_call":
            try:
                if builder is None:
                    begin = i
                    builder = _Builder(value, tok, verify=verify, memo=memo,
                                       exact=not window or i == exact_at)
                    calls = [(i, None, [])]
                    reason = None
                else:
                    reason = builder.extend(value)
                    if reason is None:
                        calls.append((i, compaction, summaries))
                if reason is not None or builder.due():
                    broken = builder.flush()
                    if broken is not None:  # a queued call does not extend the tokens
                        at, reason = broken
                        i, before, done = calls[at]
                        close(reason, before, done)
                        builder, compaction, summaries = None, None, []
                        continue  # the next segment starts with that call
                if reason is not None:
                    close(reason, compaction, summaries)
                    builder = None
                    continue  # the next segment starts with this call
            except _Redo:  # a windowed render was wrong: this segment again, fully rendered
                builder, i, exact_at = None, begin, begin
                compaction, summaries = None, []
                continue
            compaction, summaries = None, []
        i += 1
        if i == len(items) and builder is not None:  # the episode's last segment
            try:
                broken = builder.flush()
                if broken is None:
                    close("", None, [])
                else:
                    at, reason = broken
                    i, before, done = calls[at]
                    close(reason, before, done)
            except _Redo:
                i, exact_at = begin, begin
            builder, compaction, summaries = None, None, []
    return segments
