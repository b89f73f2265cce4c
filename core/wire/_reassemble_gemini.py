"""The Gemini API's responses rebuilt as one model content, for ``--record``.

A non-streamed ``generateContent`` answer is a ``GenerateContentResponse``; a streamed one
(``:streamGenerateContent?alt=sse``) is a run of them, each carrying the next parts of
candidate 0, the usage so far and, on the last, the ``finishReason``. Text arriving in
pieces is joined into one part, as a non-streamed answer holds it (thoughts apart from
answer text; a ``thoughtSignature`` stays on the part it came with, or, arriving on an
empty part, on the text it ends); function calls arrive whole and are kept as they are.
"""

from __future__ import annotations

from typing import Any

from ._reassemble import Reassembled, Reassembler

__all__ = ["GeminiStream", "gemini_from_body"]

_TEXT_KEYS = frozenset({"text", "thought", "thoughtSignature"})


def _candidate(body: dict[str, Any]) -> dict[str, Any]:
    candidates = body.get("candidates") or [{}]
    first = candidates[0]
    return first if isinstance(first, dict) else {}


def gemini_from_body(body: Any) -> Reassembled:
    """The model content of a non-streamed ``GenerateContentResponse``."""
    if not isinstance(body, dict):
        return Reassembled()
    content = _candidate(body).get("content") or {}
    message = {"role": "model", "parts": list(content.get("parts") or [])}
    return Reassembled([message], dict(body.get("usageMetadata") or {}),
                       body.get("modelVersion"), True)


class GeminiStream(Reassembler):
    """Builds one model content from the chunks of a streamed answer."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[dict[str, Any]] = []

    def _add(self, event: dict[str, Any]) -> None:
        out = self.out
        out.model = event.get("modelVersion") or out.model
        if event.get("usageMetadata"):
            out.usage = dict(event["usageMetadata"])
        candidate = _candidate(event)
        for part in (candidate.get("content") or {}).get("parts") or ():
            if isinstance(part, dict):
                self._part(part)
        if candidate.get("finishReason"):
            out.complete = True

    def _part(self, part: dict[str, Any]) -> None:
        last = self.parts[-1] if self.parts else None
        if (last is not None and _TEXT_KEYS.issuperset(part) and isinstance(part.get("text"), str)
                and _TEXT_KEYS.issuperset(last) and isinstance(last.get("text"), str)
                and "thoughtSignature" not in last
                and bool(last.get("thought")) == bool(part.get("thought"))):
            self.parts[-1] = {**last, **part, "text": last["text"] + part["text"]}
            return
        self.parts.append(dict(part))

    def result(self) -> Reassembled:
        self.out.response = [{"role": "model", "parts": list(self.parts)}]
        return self.out
