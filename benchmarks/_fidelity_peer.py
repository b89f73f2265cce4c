"""CliffCompaction 0.1.0 as the fidelity benchmark's peer: the same output, without its
quadratic bookkeeping, and its threshold calibrated to a matched real peak.

``cliffcompaction.engine.Engine.prepare`` digests every message (canonical JSON, SHA-256)
and serialises the whole body (its chars/4 estimate) at every call: over a 1M-token
history that is minutes of work per pass, none of which changes what it sends. Here each
message's digest and serialised size are remembered by identity (the replay never mutates
a message), and a body's size is composed from its messages' sizes: the same numbers,
byte for byte (``check_equivalence`` compares them with the originals).

CliffCompaction counts chars/4 of the JSON body, so at a nominal threshold its real
(o200k) requests differ from it by the content's characters per token. ``calibrate``
finds the largest threshold whose real peak stays under a given number of tokens.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import cliffcompaction.engine as cc_engine
from cliffcompaction import dialects as cc_dialects
from cliffcompaction.config import Config

__all__ = ["FastPeer", "calibrate", "check_equivalence", "forget_sizes"]

_ORIGINAL_BILLABLE = cc_engine.billable_chars
_PEER_DIALECTS = {"anthropic": cc_dialects.anthropic.DIALECT,
                  "openai_chat": cc_dialects.openai_chat.DIALECT}


class _Sizes:
    """``billable_chars`` of messages by identity, and of bodies composed from them."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Any, int]] = {}

    def of(self, obj: Any) -> int:
        if isinstance(obj, dict):
            found = self._memo.get(id(obj))
            if found is not None and found[0] is obj:
                return found[1]
            body = self._body(obj)
            if body is not None:
                return body
            size = _ORIGINAL_BILLABLE(obj)
            self._memo[id(obj)] = (obj, size)
            return size
        return _ORIGINAL_BILLABLE(obj)

    def _body(self, obj: dict[str, Any]) -> int | None:
        """A request body ``{..., key: [messages]}``: the skeleton's size, plus each
        message's, plus the ``", "`` between them (``json.dumps``' default separators)."""
        lists = [k for k, v in obj.items() if isinstance(v, list) and k in ("messages", "input")]
        if len(lists) != 1:
            return None
        key = lists[0]
        messages = obj[key]
        if not all(isinstance(m, dict) for m in messages):
            return None
        skeleton = _ORIGINAL_BILLABLE({**obj, key: []})
        if not messages:
            return skeleton
        return skeleton + sum(self.of(m) for m in messages) + 2 * (len(messages) - 1)


_SIZES = _Sizes()


def _billable_chars(obj: Any) -> int:
    return _SIZES.of(obj)


def forget_sizes() -> None:
    """Drop the remembered sizes (between runs: they hold the messages)."""
    global _SIZES
    _SIZES = _Sizes()


class FastPeer:
    """CliffCompaction's engine for one session, at ``threshold`` (its chars/4 units)."""

    def __init__(self, dialect: str, threshold: int) -> None:
        base = _PEER_DIALECTS[dialect]
        memo: dict[int, tuple[Any, str]] = {}

        def digest(message: dict[str, Any]) -> str:
            found = memo.get(id(message))
            if found is not None and found[0] is message:
                return found[1]
            value: str = base.digest_message(message)
            memo[id(message)] = (message, value)
            return value

        self._dialect = dataclasses.replace(base, digest_message=digest)
        self._engine = cc_engine.Engine(Config(threshold_tokens=threshold))
        cc_engine.billable_chars = _billable_chars  # the same sizes, remembered

    def prepare(self, messages: list[Any]) -> tuple[list[Any], bool]:
        """What it sends for ``messages``, and whether this call compacted."""
        ctx = self._engine.prepare({self._dialect.messages_key: messages}, self._dialect)
        return list(ctx.substituted), ctx.compacted


def check_equivalence(dialect: str, messages: Sequence[Any]) -> None:
    """Raise when the remembered sizes or digests differ from CliffCompaction's own."""
    base = _PEER_DIALECTS[dialect]
    body = {base.messages_key: list(messages)}
    if _SIZES.of(body) != len(json.dumps(body, ensure_ascii=False)):
        raise AssertionError("composed body size differs from CliffCompaction's")
    peer = FastPeer(dialect, 1)
    for m in messages[:50]:
        if peer._dialect.digest_message(m) != base.digest_message(m):
            raise AssertionError("remembered digest differs")


def calibrate(peak_of: Callable[[int], int], limit: int, start: int) -> tuple[int, int]:
    """The largest threshold found whose real peak (``peak_of(threshold)``) is at most
    ``limit``, starting from ``start``; returns (threshold, its peak). A few passes: each
    step scales the threshold by ``limit / peak`` (the peak follows the threshold almost
    linearly), then halves the gap between the best under and the least over."""
    under: tuple[int, int] | None = None
    over: int | None = None
    threshold = start
    seen: dict[int, int] = {}
    for _ in range(6):
        peak = seen[threshold] = seen.get(threshold) or peak_of(threshold)
        if peak <= limit:
            if under is None or threshold > under[0]:
                under = (threshold, peak)
            if peak >= limit * 0.985:
                break
        else:
            over = threshold if over is None else min(over, threshold)
        if under is not None and over is not None:
            nxt = (under[0] + over) // 2
        else:
            nxt = int(threshold * limit / max(peak, 1) * (0.995 if peak > limit else 1.0))
        if over is not None:
            nxt = min(nxt, over - 1)
        if under is not None:
            nxt = max(nxt, under[0] + 1)
        if nxt in seen or nxt <= 0 or (under is not None and over is not None
                                        and over - under[0] <= max(64, limit // 200)):
            break
        threshold = nxt
    if under is None:  # never under: the lowest tried (its peak is the least reachable)
        low = min(seen)
        return low, seen[low]
    return under
