"""Every ``agentcompact`` error is one line on stderr naming the problem and the fix, with
no traceback unless ``--debug`` is given."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcompact._cli import main
from tests.conftest import QWEN_TOKENIZER as TOKENIZER


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    return subprocess.run([sys.executable, "-m", "agentcompact", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("argv", [["export", "--help"],
                                  ["export", "RUN", "--out", "D", "--tokenizer", "T"],
                                  ["export"]])
def test_a_subcommand_without_its_extra_names_it(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "agentcompact.trajectory._export_cli", None)
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert "needs the 'export' extra" in line and "pip install 'agentcompact[export]'" in line


def test_missing_tiktoken_files_are_one_line_a_pip_user_can_follow(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    import tiktoken

    def offline(name: str) -> None:
        raise ConnectionError("Max retries exceeded with url: /encodings/o200k_base.tiktoken")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert main(["demo", "--turns", "20", "--trigger", "5000"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("agentcompact demo: tiktoken's o200k_base BPE file")
    assert str(tmp_path) in line and "TIKTOKEN_CACHE_DIR=DIR python -c" in line
    assert "docs/" not in line and "Max retries" not in line  # no repo path, no raw error


def test_an_unknown_tiktoken_encoding_names_the_known_ones() -> None:
    from agentcompact import TiktokenCounter, TokenizerError

    with pytest.raises(TokenizerError, match="unknown tiktoken encoding 'nope'; known: .*o200k"):
        TiktokenCounter("nope")


def test_replay_of_a_missing_file_or_a_broken_link(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such file or folder; give a session file" in _one_line(
        capsys.readouterr().err)
    link = tmp_path / "session.jsonl"
    link.symlink_to(tmp_path / "gone.jsonl")
    assert main(["replay", str(link)]) == 2
    assert "is a broken symbolic link (to " in _one_line(capsys.readouterr().err)


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import agentcompact._cli as cli

    def broken(args: object) -> int:
        raise RuntimeError("secret text from a history")

    monkeypatch.setattr(cli, "_plugins", broken)
    assert main(["plugins"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == ("agentcompact plugins: unexpected RuntimeError; run again with --debug "
                    "for the traceback and report it")
    with pytest.raises(RuntimeError):
        main(["plugins", "--debug"])


def test_an_os_error_names_the_file(tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--turns", "30", "--trigger", "12000", "--save",
                 str(tmp_path / "no" / "such" / "demo.json")]) == 2
    assert _one_line(capsys.readouterr().err).startswith(
        "agentcompact demo: No such file or directory: ")


@pytest.mark.parametrize("argv,expected", [
    (["demo", "--trigger", "100"], "leaves no room beside the newest turn"),
    (["demo", "--trigger", "6000"], "leaves no room beside the newest turn"),
    (["demo", "--trigger", "1000000"], "would never be compacted; give a smaller --trigger"),
    (["demo", "--turns", "0"], "--turns 0: give 1 to 2,000 turns"),
])
def test_demo_rejects_settings_that_show_nothing(argv: list[str], expected: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert expected in _one_line(capsys.readouterr().err)


def test_the_trigger_demo_suggests_works(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--trigger", "6000"]) == 2
    suggested = re.search(r"give --trigger (\d+) or more", capsys.readouterr().err)
    assert suggested, "the error names a trigger that works"
    assert main(["demo", "--trigger", suggested.group(1)]) == 0


def test_a_usage_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--bogus"])
    assert exit_.value.code == 2
    assert _one_line(capsys.readouterr().err) == (
        "agentcompact: unrecognized arguments: --bogus (see agentcompact --help)")


# --- export (extra "export") -------------------------------------------------------------


@pytest.fixture
def export_extra() -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("transformers")


def test_export_names_a_tokenizer_file_and_its_folder(export_extra: None, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "session.json"
    run.write_text(json.dumps([{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "hello"}]))
    file = tmp_path / "tok" / "tokenizer.json"
    file.parent.mkdir()
    file.write_text("{}")
    assert main(["export", str(run), "--out", str(tmp_path / "rows"), "--tokenizer",
                 str(file)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert f"tokenizer '{file}' is a file; give the folder holding it ({file.parent})" in line
    assert main(["export", str(run), "--out", str(tmp_path / "rows"), "--tokenizer",
                 str(tmp_path / "missing")]) == 1
    assert "does not exist" in _one_line(capsys.readouterr().err)


def test_export_of_an_empty_folder_fails(export_extra: None, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), "--out", str(tmp_path / "rows"),
                 "--tokenizer", "unused"]) == 1
    assert "holds no run: give a folder with the recorder's events.jsonl" in _one_line(
        capsys.readouterr().err)


def test_export_prints_no_transformers_advice(export_extra: None, tmp_path: Path) -> None:
    if not TOKENIZER.is_dir():
        pytest.skip(f"needs the shared tokenizer at {TOKENIZER}")
    run = tmp_path / "session.json"
    run.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                            {"role": "assistant", "content": "hello"}],
                               "reward": 1.0}))
    done = _cli("export", str(run), "--out", str(tmp_path / "rows"), "--tokenizer",
                str(TOKENIZER))
    assert done.returncode == 0, done.stderr
    assert "PyTorch was not found" not in done.stderr and "[transformers]" not in done.stderr


# --- proxy, run, mcp (extras "proxy", "mcp") ----------------------------------------------


@pytest.fixture
def busy_port() -> Iterator[int]:
    pytest.importorskip("uvicorn")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


@pytest.mark.network
@pytest.mark.parametrize("command", [["proxy"], ["run"]])
def test_a_busy_port_is_one_line_before_any_banner(command: list[str], busy_port: int) -> None:
    tail = ["--", sys.executable, "-c", "pass"] if command == ["run"] else []
    done = _cli(*command, "--port", str(busy_port), *tail)
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert line == (f"agentcompact {command[0]}: port {busy_port} on 127.0.0.1 is already in "
                    "use (another proxy or server?); stop it, or choose another port with "
                    "--port (0: any free port)")


def test_proxy_rejects_an_unknown_log_level(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("uvicorn")
    with pytest.raises(SystemExit):
        main(["proxy", "--log-level", "bogus"])
    line = _one_line(capsys.readouterr().err)
    assert "argument --log-level: unknown level 'bogus'; use one of DEBUG, INFO" in line


def test_run_help_gives_its_own_port_default(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("uvicorn")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--port PORT port (default 0: any free port)" in out and "8719" not in out


def test_the_expand_server_without_an_archive_names_what_it_needs() -> None:
    from agentcompact.errors import ConfigError
    from agentcompact.integrations._mcp_server import build_server

    with pytest.raises(ConfigError, match="needs an archive: a SQLite path"):
        build_server(False)  # no archive (as a strategy's archive=False): nothing to serve


def test_mcp_with_a_bad_store_url_is_one_line() -> None:
    pytest.importorskip("mcp")
    done = _cli("mcp", "--store", "rediss:/h:1")
    assert done.returncode == 2
    assert _one_line(done.stderr).startswith("agentcompact mcp: ")
