"""A local LLM provider speaking the real Anthropic, OpenAI and Gemini wire protocols, for
tests.

Scripted answers (:class:`Script`, :class:`Reply`), injected faults (:class:`Fault`), a
latency model (:class:`LatencyModel`), every request recorded; :func:`serve` runs it on a
loopback port; :func:`tool_loop_script` is the model of ``--script tool-loop``. Tokens are
estimated as characters / 4. See ``docs/upstream-sim.md``.
"""

from __future__ import annotations

from starlette.applications import Starlette

from ._app import FAULT_HEADER, RecordedRequest, UpstreamSim
from ._clis import (
    CLI_BIN_ENV,
    CliCommand,
    ToolLoop,
    claude_command,
    codex_command,
    find_cli,
    gemini_command,
)
from ._completion import SimTokenizer, logprob_of
from ._latency import LatencyModel
from ._runner import RunningServer, serve
from ._script import (
    Fault,
    Reply,
    Responder,
    Script,
    Step,
    Thinking,
    ToolCall,
    digest_reply,
    echo_reply,
    estimate_tokens,
    filler_text,
    last_user_text,
    prompt_text,
    prompt_tokens,
)
from ._toolloop import DEFAULT_LOOP_STEPS, ToolLoopModel, tool_loop_script

__all__ = [
    "CLI_BIN_ENV",
    "CliCommand",
    "DEFAULT_LOOP_STEPS",
    "FAULT_HEADER",
    "Fault",
    "LatencyModel",
    "RecordedRequest",
    "Reply",
    "Responder",
    "RunningServer",
    "Script",
    "SimTokenizer",
    "Step",
    "Thinking",
    "ToolCall",
    "ToolLoop",
    "ToolLoopModel",
    "UpstreamSim",
    "claude_command",
    "codex_command",
    "create_app",
    "digest_reply",
    "echo_reply",
    "estimate_tokens",
    "filler_text",
    "find_cli",
    "gemini_command",
    "last_user_text",
    "logprob_of",
    "prompt_text",
    "prompt_tokens",
    "serve",
    "tool_loop_script",
]


def create_app(script: Script | None = None, *, latency: LatencyModel | None = None,
               context_window: int | None = None) -> Starlette:
    """The Starlette app of a new :class:`UpstreamSim` (its sim is ``app.state.upstream_sim``)."""
    return UpstreamSim(script, latency=latency, context_window=context_window).app
