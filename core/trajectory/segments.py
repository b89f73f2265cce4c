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
event logged in between supplies the segment's ``compaction_trigger`` and, when the
summarizer was the policy (``SummaryCall.trained``), the summary request (mask 0) and the
summary tokens (mask 1) appended at the end of the segment's response (SUPO-style). An
external summary is not appended: it shows up in the next segment's prompt, mask 0
(ReSum-style).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..dialects.base import Dialect, digest_of
from ..errors import TrajectoryError
from ..events import CompactionEvent, ModelCall, SummaryCall
from .tokenize import (
    ChatTokenizer,
    PrefixBreak,
    TokenStream,
    extend_chat,
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
    "token_budget": "token_budget",
    "turn_limit": "turn_limit",
    "forced": "model_initiated",
    "model_initiated": "model_initiated",
}

Item = tuple[str, Any]  # ("model_call", ModelCall) | ("compaction", ...) | ("summary_call", ...)


def get_dialect(name: str) -> Dialect:
    """The dialect registered under ``name`` (plugins included)."""
    from ..pluginmanager import get_dialect as lookup  # imported late: no import cycle

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

    @property
    def working_context(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def _recorded(call: ModelCall) -> bool:
    return call.prompt_token_ids is not None and call.response_token_ids is not None


def _shape(call: ModelCall) -> str:
    """Digest of the request fields other than messages that shape the prompt."""
    req = call.request
    return digest_of([call.dialect, req.get("system"), req.get("tools"), req.get("instructions")])


def _sampling(call: ModelCall, logprobs_known: bool) -> dict[str, Any]:
    req = call.request

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


def _request_chat(summary: SummaryCall) -> list[dict[str, Any]]:
    """The summarizer's instructions as user turns (its system prompt belongs to another
    context and is left out)."""
    out = []
    for message in summary.prompt:
        if message.get("role") == "system":
            continue
        content = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        out.append({"role": "user", "content": str(content)})
    return out or [{"role": "user", "content": ""}]


class _Builder:
    """Grows one segment call by call."""

    def __init__(self, call: ModelCall, tok: ChatTokenizer, *, verify: bool) -> None:
        self.tok = tok
        self.dialect = get_dialect(call.dialect)
        self.first = call
        self.shape = _shape(call)
        self.system = call.request.get("system") or call.request.get("instructions")
        self.tools = to_chat_tools(call.request.get("tools"))
        self.recorded = _recorded(call)
        self.logprobs_known = True
        self.num_calls = 0
        self.chat = to_chat_messages(call.messages, self.dialect, self.system)
        if self.recorded:
            self.stream = TokenStream.from_ids(tok, call.prompt_token_ids or [])
        else:
            self.gen = tok.render(self.chat, self.tools, add_generation_prompt=True)
            self.stream = TokenStream(tok, self.gen, verify=verify)
        self._respond(call, self.chat)

    def _digests(self, messages: Sequence[Any]) -> list[str]:
        return [self.dialect.digest(m) for m in messages]

    def _respond(self, call: ModelCall, context: list[dict[str, Any]]) -> None:
        self.num_calls += 1
        chat = extend_chat(context, call.response, self.dialect)
        if self.recorded:
            self.stream.push_ids(call.response_token_ids or [], 1, call.response_logprobs)
            self.logprobs_known &= call.response_logprobs is not None
        else:
            full = self.tok.render(chat, self.tools)
            if not full.startswith(self.gen):
                raise TrajectoryError(
                    f"episode {call.episode_id}, call {call.call_id}: the chat template "
                    "renders the assistant turn without its own generation prompt as prefix"
                )
            sampled, _ = self.tok.split_at_eos(full[len(self.gen):])
            kept = self.stream.sample(sampled, call.response_token_ids, call.response_logprobs)
            self.logprobs_known &= kept
            self.after = self.gen + sampled
        self.chat = chat
        self.ext = [*call.messages, *call.response]

    def _continues(self, call: ModelCall) -> bool:
        """Message level: the context starts with the previous context + response (equal
        natively, or equal digests: volatile fields such as ``cache_control`` ignored)."""
        n = len(self.ext)
        head = call.messages[:n]
        if len(head) < n:
            return False
        return bool(head == self.ext) or self._digests(head) == self._digests(self.ext)

    def extend(self, call: ModelCall) -> str | None:
        """Add ``call`` to the segment; or return why it must start a new one."""
        if call.dialect != self.first.dialect or _shape(call) != self.shape:
            return "context"
        if not self._continues(call):
            return "context"
        if _recorded(call) != self.recorded:
            return "source"
        context = extend_chat(self.chat, call.messages[len(self.ext):], self.dialect)
        try:
            if self.recorded:
                self.stream.extend_ids(call.prompt_token_ids or [])
            else:
                gen = self.tok.render(context, self.tools, add_generation_prompt=True)
                if not gen.startswith(self.after):
                    return "template"
                self.stream.extend(gen[len(self.after):])
                self.gen = gen
        except PrefixBreak as exc:
            return exc.reason
        self._respond(call, context)
        return None

    def append_summary(self, summary: SummaryCall) -> bool:
        """Append the summary request (mask 0) and the policy's summary (mask 1)."""
        request = _request_chat(summary)
        done, _ = self.tok.split_at_eos(self.tok.render(self.chat, self.tools))
        ask = self.tok.render([*self.chat, *request], self.tools, add_generation_prompt=True)
        answer = {"role": "assistant", "content": summary.output}
        full = self.tok.render([*self.chat, *request, answer], self.tools)
        if not ask.startswith(done) or not full.startswith(ask):
            return False
        try:
            self.stream.extend(ask[len(done):])
        except PrefixBreak:
            return False
        start = len(self.stream.response_ids)
        self.stream.sample(self.tok.split_at_eos(full[len(ask):])[0])
        self.span = [start, len(self.stream.response_ids)]
        self.chat = [*self.chat, *request, answer]
        self.logprobs_known = False
        return True

    def close(self, *, keep_messages: bool) -> Segment:
        self.stream.verify()
        known = self.logprobs_known
        s = self.stream
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
            summary_span=list(getattr(self, "span", [])),
            summary_trained=hasattr(self, "span"),
            messages_json=orjson.dumps(self.chat).decode() if keep_messages else None,
        )


def _close(
    builder: _Builder,
    compaction: CompactionEvent | None,
    summaries: list[SummaryCall],
    *,
    reason: str,
    summary_trained: bool | None,
    keep_messages: bool,
) -> Segment:
    if reason:
        for summary in summaries:
            trained = summary.trained if summary_trained is None else summary_trained
            if trained and summary.output and not summary.error:
                if not builder.append_summary(summary):
                    logger.warning("summary %s: template not prefix-stable, not appended",
                                   summary.call_id)
    segment = builder.close(keep_messages=keep_messages)
    segment.break_reason = "compaction" if reason and compaction is not None else reason
    if reason and compaction is not None:
        segment.compaction_trigger = TRIGGERS.get(compaction.reason, "token_budget")
    return segment


def build_segments(
    items: Sequence[Item],
    tok: ChatTokenizer,
    *,
    summary_trained: bool | None = None,
    verify: bool = False,
    keep_messages: bool = False,
) -> list[Segment]:
    """Segments of one episode from its events in log order.

    :param items: ``(kind, value)`` pairs: ``model_call`` → ``ModelCall``, ``compaction`` →
        ``CompactionEvent``, ``summary_call`` → ``SummaryCall`` (other kinds ignored).
    :param tok: the trainer's tokenizer.
    :param summary_trained: override ``SummaryCall.trained`` for every summary.
    :param verify: check each segment's ids against a full encode of its text.
    :param keep_messages: fill ``messages_json`` (chat-template messages, for debugging).
    """
    segments: list[Segment] = []
    builder: _Builder | None = None
    compaction: CompactionEvent | None = None
    summaries: list[SummaryCall] = []
    for kind, value in items:
        if kind == "compaction":
            compaction = value
        elif kind == "summary_call":
            summaries.append(value)
        elif kind == "model_call":
            reason = builder.extend(value) if builder is not None else None
            if builder is not None and reason is not None:
                segments.append(_close(builder, compaction, summaries, reason=reason,
                                       summary_trained=summary_trained,
                                       keep_messages=keep_messages))
                builder = None
            if builder is None:
                builder = _Builder(value, tok, verify=verify)
            compaction, summaries = None, []
    if builder is not None:
        segments.append(_close(builder, None, [], reason="", summary_trained=summary_trained,
                               keep_messages=keep_messages))
    return segments
