"""The real Claude Code, Codex and Gemini CLIs, driven through the proxy against the
simulator.

Each session reads 42 files (one tool step each) with a trigger low enough for several
compactions. Everything asserted comes from what the simulator received, the proxy's
log lines, status page and debug dumps: the CLI itself is not modelled. Skipped only where
the CLI is not installed (``.ci/run`` installs pinned versions with npm and sets
``AGENTCOMPACT_CLI_BIN``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from agentcompact import validate
from agentcompact._archive import handle_of
from agentcompact.dialects import (
    AnthropicDialect,
    Dialect,
    GeminiDialect,
    OpenAIResponsesDialect,
    digest_of,
)
from agentcompact.integrations.proxy._observe import redact_json
from agentcompact.testing._clis import (
    DUMMY_ANTHROPIC_KEY,
    DUMMY_GEMINI_KEY,
    DUMMY_OPENAI_KEY,
    FINAL_TEXT,
    find_cli,
)

from .harness import CliRun, run_cli

pytestmark = [pytest.mark.network, pytest.mark.clis]

STEPS = 42
TRIGGER = 40_000
#: (cli, model): each CLI with its default model and with one older model
SESSIONS = [("claude", None), ("claude", "claude-sonnet-4-5"),
            ("codex", None), ("codex", "gpt-5.1-codex"),
            ("gemini", None), ("gemini", "gemini-2.5-pro")]


def _executable(cli: str) -> str:
    found = find_cli(cli)
    if found is None:
        pytest.skip(f"{cli} CLI not installed (run .ci/run, or set AGENTCOMPACT_CLI_BIN to the "
                    "folder holding it)")
    return found


@pytest.fixture(scope="module", params=SESSIONS, ids=lambda s: f"{s[0]}-{s[1] or 'default'}")
def session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CliRun:
    cli, model = request.param
    tmp = tmp_path_factory.mktemp(f"{cli}-{model or 'default'}")
    return run_cli(cli, _executable(cli), tmp, steps=STEPS, trigger=TRIGGER, model=model)


def _dialect(run: CliRun) -> Dialect:
    if run.cli == "gemini":
        return GeminiDialect()
    return AnthropicDialect() if run.cli == "claude" else OpenAIResponsesDialect()


def _main(run: CliRun) -> list[int]:
    """Indexes (among the dialect requests) of the agent's own turns (they carry tools)."""
    return [i for i, r in enumerate(run.dialect_requests)
            if r.body.get("tools") or any(isinstance(m, dict) and m.get("type") ==
                                          "additional_tools" for m in r.body.get("input", []))]


def test_every_step_completed(session: CliRun) -> None:
    assert session.returncode == 0, session.stderr[-2000:]
    assert FINAL_TEXT in session.stdout
    assert sorted(session.loop.calls) == list(range(STEPS))
    assert session.loop.finals >= 1


KNOWN_ROUTES = ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
                "/v1/responses/compact", "/v1/models")
#: Gemini's routes name the model: ``/v1beta/models/{model}:{method}``
GEMINI_METHODS = (":generateContent", ":streamGenerateContent", ":countTokens")


def _known(path: str) -> bool:
    return path in KNOWN_ROUTES or (path.startswith("/v1beta/models/")
                                    and path.endswith(GEMINI_METHODS))


def test_every_call_the_cli_made_is_one_the_simulator_serves(session: CliRun) -> None:
    assert session.requests
    assert [r.path for r in session.requests if not _known(r.path)] == []
    # and the simulator, which refuses what the Gemini API refuses, answered every one
    assert all(line["status"] == 200 for line in session.proxy_lines)


def test_every_upstream_request_is_valid(session: CliRun) -> None:
    dialect = _dialect(session)
    assert session.dialect_requests
    for request in session.dialect_requests:
        validate(dialect.messages_of(request.body), dialect)


def test_tools_and_instructions_byte_identical_in_every_request(session: CliRun) -> None:
    dialect = _dialect(session)
    upstream = session.dialect_requests
    assert len(session.dumps) == len(upstream)  # one client body per forwarded request
    for client, sent in zip(session.dumps, upstream, strict=True):
        theirs, ours = client["body"], redact_json(sent.body)  # the dumps are redacted
        for key in ("tools", "system", "instructions", "systemInstruction"):
            assert ours.get(key) == theirs.get(key), key
        kept_client = [m for m in dialect.messages_of(theirs) if dialect.is_kept(m)]
        kept_sent = [m for m in dialect.messages_of(ours) if dialect.is_kept(m)]
        assert kept_sent == kept_client
        if session.cli == "codex":  # its developer messages and additional_tools item
            assert kept_client


def test_compactions_reported_in_log_lines_and_status(session: CliRun) -> None:
    lines = session.proxy_lines
    assert len(lines) == len(session.dialect_requests)
    compacted = sum(1 for line in lines if line["compacted"])
    assert compacted >= 1
    assert session.status["compactions"] == compacted
    assert sum(s["compactions"] for s in session.status["sessions"].values()) == compacted
    assert session.status["fail_open"] == 0
    assert all(line["error"] is None and line["status"] == 200 for line in lines)


def test_the_newest_message_goes_upstream_whole(session: CliRun) -> None:
    """The tool result the model has not seen yet is never cut (issue 13: Claude Code's
    19,795-byte result went out as 2,042 bytes)."""
    dialect = _dialect(session)
    for client, sent in zip(session.dumps, session.dialect_requests, strict=True):
        ours = dialect.messages_of(redact_json(sent.body))
        theirs = dialect.messages_of(client["body"])
        assert ours[-1] == theirs[-1]


def _results(dialect: Dialect, messages: list[Any]) -> list[tuple[int, str]]:
    """(message index, text) of every tool result of ``messages``."""
    return [(i, p.text) for i, m in enumerate(messages) for p in dialect.parts(m)
            if p.kind == "tool_result" and p.text]


def test_a_read_tool_output_is_folded_at_the_next_call(session: CliRun) -> None:
    """The fold (issue 15), in the real CLIs' sessions: at a call after a compaction whose
    newest turn held a large tool output (a 6,000-byte step file), the output the model
    has read by then goes upstream cut to its head and tail, its marker naming the handle
    of the original; the call is logged with the reason ``fold``; the client's own
    message is whole, and every call's newest message too (the test above)."""
    dialect = _dialect(session)
    lines = session.proxy_lines
    folds = [k for k, line in enumerate(lines) if "fold" in line["reasons"]]
    assert folds, [line["reasons"] for line in lines if line["reasons"]]
    assert {r for line in lines for r in line["reasons"]} <= {"trigger", "fold"}
    assert all(line["compacted"] for k, line in enumerate(lines) if k in folds)
    for k in folds:
        theirs = dialect.messages_of(session.dumps[k]["body"])
        ours = dialect.messages_of(redact_json(session.dialect_requests[k].body))
        sent = [(i, text) for i, text in _results(dialect, ours)
                if not dialect.is_synthetic(ours[i])]
        cut = [(j, mine) for j, text in _results(dialect, theirs) if len(text) > 4_000
               for i, mine in sent if i < len(ours) - 1
               and len(mine) < len(text) // 2 and mine[:200] == text[:200]]
        assert cut, f"request {k}: no tool output of the client's sent folded"
        for j, mine in cut:  # the marker names the original text it cut (Codex: an item)
            originals = [t for t in dialect.truncation_texts(theirs[j]) if len(t) > 1_000]
            assert originals and all(handle_of(t) in mine and t not in mine
                                     for t in originals)


def test_watch_shows_the_session_and_its_compactions(session: CliRun) -> None:
    (key, figures), *_ = session.status["sessions"].items()
    assert key in session.watch
    assert f"{session.status['compactions']} compactions" in session.watch
    assert f"{figures['tokens_in']:,}" in session.watch


def _digests(dialect: Dialect, body: dict[str, Any]) -> list[str]:
    return [digest_of(m) for m in dialect.messages_of(body)]


def _extends(old: list[str], new: list[str]) -> bool:
    return new[:len(old)] == old


def test_prefix_changes_only_at_compactions(session: CliRun) -> None:
    """Where the client only appended to its history, what went upstream only appended
    too, unless the proxy compacted at that request. (Claude Code rewrites its own
    history now and then: its system message goes from blocks to a string once the cache
    marker moves on; those changes are the client's, not the proxy's.)"""
    dialect = _dialect(session)
    upstream, lines, dumps = session.dialect_requests, session.proxy_lines, session.dumps
    main = _main(session)
    assert len(main) > STEPS
    outside = at_compaction = 0
    for before, after in zip(main, main[1:]):
        sent_old = _digests(dialect, redact_json(upstream[before].body))
        sent_new = _digests(dialect, redact_json(upstream[after].body))
        client_appended = _extends(_digests(dialect, dumps[before]["body"]),
                                   _digests(dialect, dumps[after]["body"]))
        if _extends(sent_old, sent_new):
            continue
        if lines[after]["compacted"]:
            at_compaction += 1
        elif client_appended:
            outside += 1
    assert outside == 0
    assert at_compaction >= 1


def test_no_credential_in_any_log(session: CliRun) -> None:
    assert session.debug_dir is not None
    files = b"".join(p.read_bytes() for p in Path(session.debug_dir).iterdir())
    status = orjson.dumps(session.status)
    for key in (DUMMY_ANTHROPIC_KEY, DUMMY_OPENAI_KEY, DUMMY_GEMINI_KEY):
        assert key not in session.log_text
        assert key.encode() not in files
        assert key.encode() not in status
    sent_keys = {r.headers.get("x-api-key") or r.headers.get("x-goog-api-key")
                 or r.headers.get("authorization", "") for r in session.dialect_requests}
    assert any(DUMMY_ANTHROPIC_KEY in k or DUMMY_OPENAI_KEY in k or DUMMY_GEMINI_KEY in k
               for k in sent_keys)
