"""``agentcompact replay`` end to end, Codex rollouts, price files, item extraction, window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentcompact import get_dialect, split_turns
from agentcompact._tokens import MessageMeter
from agentcompact.errors import ConfigError
from agentcompact.replay import SlidingWindow, extract_items
from agentcompact.replay._cli import default_strategies, load_sessions, main
from agentcompact.replay._codex import is_codex_rollout, load_codex_rollout
from agentcompact.replay._pricing import call_cost, load_price_file, resolve_price

from .test_figures import SESSION, WordCounter


def _codex_rollout(path: Path) -> Path:
    lines: list[dict[str, Any]] = [
        {"timestamp": "t", "type": "session_meta",
         "payload": {"id": "s1", "cwd": "/w", "instructions": "Be brief."}},
        {"timestamp": "t", "type": "response_item", "payload": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "fix src/app/db.py"}]}},
        {"timestamp": "t", "type": "turn_context", "payload": {"model": "gpt-5-codex"}},
        {"timestamp": "t", "type": "event_msg", "payload": {"type": "agent_reasoning"}},
    ]
    for k in range(6):
        lines += [
            {"timestamp": "t", "type": "response_item", "payload": {
                "type": "function_call", "name": "shell", "call_id": f"c{k}",
                "arguments": json.dumps({"command": ["cat", f"src/app/db_{k}.py"]})}},
            {"timestamp": "t", "type": "response_item", "payload": {
                "type": "function_call_output", "call_id": f"c{k}",
                "output": f"def connect_{k}(): return {4000 + k}\n" + "x = 1\n" * 40}},
        ]
    lines.append({"timestamp": "t", "type": "response_item", "payload": {
        "type": "message", "role": "assistant",
        "content": [{"type": "output_text", "text": "connect_5 returns 4005"}]}})
    lines.append({"timestamp": "t", "type": "response_item", "payload": {"type": "ghost_snapshot"}})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_codex_rollout(tmp_path: Path) -> None:
    path = _codex_rollout(tmp_path / "rollout-2025-01-01T00-00-00-abc.jsonl")
    assert is_codex_rollout(path)
    traj = load_codex_rollout(path)
    assert traj.dialect == "openai_responses" and traj.system == "Be brief."
    assert len(traj.messages) == 14 and traj.metadata["models"] == ["gpt-5-codex"]
    (found,) = load_sessions([str(tmp_path)])  # the generic loaders skip it; we read it
    assert found.format == "codex"


def test_cli_writes_json_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollout = _codex_rollout(tmp_path / "rollout-a.jsonl")
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"messages": SESSION}))
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    code = main([str(rollout), str(plain), "--strategy", "none,window,cliff,summary",
                 "--trigger", "300", "--counter", "chars", "--price", "openai",
                 "--model", "gpt-4.1", "--json", str(out_json), "--report", str(out_html),
                 "--quiet"])
    assert code == 0
    figures = json.loads(out_json.read_text())
    assert figures["settings"]["price"]["model"] == "gpt-4.1"
    assert set(figures["totals"]) == {"none", "window", "cliff"}
    assert "summarizer" in figures["skipped"]["summary"]
    assert len(figures["trajectories"]) == 2
    series = figures["trajectories"][0]["strategies"]["cliff"]["series"]
    assert set(series) >= {"tokens", "cached", "cost_usd", "time_s", "needed", "present"}
    assert out_html.read_text().count("<svg") == 6
    assert "cliff" in capsys.readouterr().out


def test_cli_rejects_unknown_strategy(tmp_path: Path) -> None:
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(SESSION))
    assert main([str(plain), "--strategy", "nope", "--quiet"]) == 2


def test_default_strategies() -> None:
    names = default_strategies()
    assert names[:3] == ["none", "window", "cliff"]
    assert {"cliffcompaction", "summary", "parallel"} <= set(names)


def test_price_files(tmp_path: Path) -> None:
    toml = tmp_path / "p.toml"
    toml.write_text('default = "mine"\n[models.mine]\nprovider = "anthropic"\ninput = 2.0\n')
    models, default = load_price_file(toml)
    assert default == "mine" and models["mine"].cache_write == pytest.approx(2.5)
    price = resolve_price(str(toml), None, "openai_chat")
    assert (price.model, price.cache_read) == ("mine", pytest.approx(0.2))
    js = tmp_path / "p.json"
    js.write_text(json.dumps({"models": {"m": {"input": 1.0, "cache_read": 0.5}}}))
    assert resolve_price(str(js), "m", "anthropic").cache_write == 1.0  # not anthropic: 1x
    assert call_cost(resolve_price("openai", "gpt-4.1", "x"), 1_000_000, 400_000) == (
        pytest.approx(0.4 * 0.5 + 0.6 * 2.0))
    with pytest.raises(ConfigError, match="no price"):
        resolve_price("anthropic", "claude-9", "anthropic")


def test_extract_items_kinds() -> None:
    items = extract_items(
        "Read src/app/db.py and setup.cfg; call os.path.join, my_func, CamelCase.\n"
        '{"command":"pytest -x tests/ -k \\"slow\\""}\n'
        "$ ls -la\n"
        "E   ValueError: invalid literal for int() with base 10\n"
        "port 8080 ratio 0.25 year 12 v1.2.3 and/or ~/.claude/x.jsonl")
    assert items["src/app/db.py"] == "path" and items["setup.cfg"] == "path"
    assert items["~/.claude/x.jsonl"] == "path"
    assert items["os.path.join"] == items["my_func"] == items["CamelCase"] == "identifier"
    assert items['pytest -x tests/ -k "slow"'] == "command" and items["ls -la"] == "command"
    assert items["E ValueError: invalid literal for int() with base 10"] == "error"
    assert items["8080"] == items["0.25"] == "number"
    assert "12" not in items and "1.2.3" not in items


def test_window_matches_a_from_scratch_recompute() -> None:
    dialect = get_dialect("anthropic")
    meter = MessageMeter(WordCounter(), dialect)
    long = [SESSION[0]] + [m for k in range(8) for m in (
        {**SESSION[1], "content": [SESSION[1]["content"][0],
                                   {**SESSION[1]["content"][1], "id": f"t{k}"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{k}",
                                      "content": "w " * (3 + 5 * k)}]})]
    window = SlidingWindow(dialect, meter, trigger=60)
    for end in range(1, len(long) + 1):
        sent = list(window.prepare(long[:end]).messages)
        assert sent == _window_by_hand(long[:end], meter, 60)


def _window_by_hand(messages: list[Any], meter: MessageMeter, trigger: int) -> list[Any]:
    turns = split_turns(messages, meter.dialect)
    if not turns.starts:
        return messages
    tokens = meter.measure(messages).tokens
    keep = len(turns) - 1
    while keep > 0 and sum(tokens[: turns.head_len]) + sum(
            tokens[turns.starts[keep - 1]:]) <= trigger:
        keep -= 1
    return messages[: turns.head_len] + messages[turns.starts[keep]:]


@pytest.mark.network
def test_llm_strategy_fallbacks_are_shown_and_summarizer_options_reach_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentcompact.testing import Fault, Reply, Script, UpstreamSim, serve

    session = _codex_rollout(tmp_path / "rollout-b.jsonl")
    failing = Script(then=lambda body: Reply("unused").failing(Fault.http(400, "bad model")))
    runs: dict[str, Any] = {}
    for name, script, extra in (("small-window", None, ["--summarizer-window", "250"]),
                                ("default-window", None, []),
                                ("failing", failing, ["--summarizer-timeout", "20"])):
        sim = UpstreamSim(script) if script is not None else UpstreamSim()
        with serve(sim) as server:
            out_json = tmp_path / f"{name}.json"
            code = main([str(session), "--strategy", "cliff,summary", "--trigger", "400",
                         "--target", "300", "--counter", "chars",
                         "--summarizer-url", f"{server.base_url}/v1", "--summarizer-model",
                         "sim", *extra, "--json", str(out_json), "--quiet"])
            assert code == 0
            runs[name] = (json.loads(out_json.read_text()), capsys.readouterr(), sim.requests)
    prompt_chars = {}
    for name in ("small-window", "default-window"):
        figures, printed, requests = runs[name]
        assert figures["totals"]["summary"]["compactions"] >= 1 and requests
        assert figures["totals"]["summary"]["errors"] == 0 and "fell back" not in printed.err
        prompt_chars[name] = max(len(json.dumps(r.body["messages"])) for r in requests)
    # --summarizer-window reached the summarizer: its prompt was fitted to a smaller window
    assert prompt_chars["small-window"] < prompt_chars["default-window"]
    figures, printed, requests = runs["failing"]
    assert requests and figures["totals"]["summary"]["errors"] >= 1
    assert "summary: " in printed.err and "fell back" in printed.err
    # the errors column ends the second table ("what the model still sees")
    rows = [line for line in printed.out.splitlines() if line.split()[:1] == ["summary"]]
    assert len(rows) == 2
    assert rows[-1].split()[-1] == str(figures["totals"]["summary"]["errors"])


def test_the_tables_fit_80_columns_and_hints_keep_their_brackets(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cliffcompaction.engine", None)  # not installed
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"messages": SESSION}))
    assert main([str(plain), "--strategy", "none,window,cliff,cliffcompaction", "--trigger",
                 "300", "--counter", "chars", "--quiet"]) == 0
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in printed.out  # nothing cut to fit
    for name in ("none", "window", "cliff"):
        assert sum(line.split()[:1] == [name] for line in lines) == 2
    assert "pip install 'agentcompact[bench]'" in printed.err
