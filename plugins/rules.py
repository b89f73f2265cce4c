"""The rules plugin (built in, on by default): pin user text that states a rule.

A user who writes "never push to main", "you must keep the public API", "do not edit
files under vendor/" or "at most 3 retries" expects the agent to keep obeying it after a
compaction. This plugin implements ``agentcompact_pin`` for user messages whose typed text
looks like such a rule, so every compaction reproduces that text verbatim. What it reads
is what the user typed (``agentcompact.typed_pieces``): the tool results beside a rule
typed while tools run, and the text a harness injects (Claude Code's
``<system-reminder>`` blocks, Codex's ``<environment_context>``), are neither judged nor
pinned. Only short text is pinned (``MAX_CHARS``): a long paste that happens to contain
"must" is history, not a rule. The engine bounds what pins carry (``agentcompact.PIN_SHARE``
of the target; past it the oldest rules are rendered like other human text).

It is registered as a default plugin under the name :data:`PLUGIN_NAME`. Turn it off for
one plugin manager with ``pm.unregister(name="agentcompact.plugins.rules")``, or for the
process with the environment variable ``AGENTCOMPACT_PIN_RULES=0`` (read when a plugin
manager is built).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from agentcompact import hookimpl, typed_pieces

if TYPE_CHECKING:
    from agentcompact import Dialect

__all__ = ["MAX_CHARS", "PLUGIN_NAME", "RULE_PATTERN", "agentcompact_pin", "is_rule",
           "typed_text"]

PLUGIN_NAME = "agentcompact.plugins.rules"
#: user messages longer than this (characters of text) are never pinned as rules
MAX_CHARS = 2_000
#: words and shapes of a rule: prohibitions, obligations, limits with numbers
RULE_PATTERN = re.compile(
    r"\b(?:never|must(?:n't| not)?|do not|don't|always|under no circumstances|"
    r"forbidden|not allowed|prohibited|make sure|ensure that|required to|only ever)\b|"
    r"\b(?:at most|at least|no more than|no fewer than|up to|maximum|minimum|max|min|"
    r"limit(?:ed)? to|under|below|within)\s+(?:of\s+)?\$?\d",
    re.IGNORECASE,
)


def is_rule(text: str) -> bool:
    """True when ``text`` is short and reads like a rule (:data:`RULE_PATTERN`)."""
    return 0 < len(text) <= MAX_CHARS and RULE_PATTERN.search(text) is not None


@hookimpl
def agentcompact_pin(message: Any, index: int, dialect: Dialect) -> bool | None:
    if dialect.role(message) != "user":
        return None
    text = typed_text(message, dialect)
    return True if text and is_rule(text) else None


def typed_text(message: Any, dialect: Dialect) -> str:
    """What the user typed in ``message``: its text parts without harness text, joined."""
    return "\n".join(piece for p in dialect.parts(message) if p.kind == "text" and p.text
                     for piece in typed_pieces(p.text))
