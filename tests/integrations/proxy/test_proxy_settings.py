"""The proxy's settings are checked at start (#36 item 8): a number no request could work
with, or a store URL that cannot be read, is one line naming the flag (and its variable)
and what it takes — not a proxy that starts and then fails every request."""

from __future__ import annotations

import argparse

import pytest

from agentcompact.errors import AgentCompactError, ConfigError
from agentcompact.integrations.proxy import ProxyConfig
from agentcompact.integrations.proxy._cli import _add_arguments, run
from agentcompact.integrations.proxy._config import engine_settings


@pytest.mark.parametrize(("field", "value", "names"), [
    ("max_sessions", -1, "--max-sessions (AGENTCOMPACT_MAX_SESSIONS) must be an integer >= 1"),
    ("max_sessions", 0, "--max-sessions"),
    ("connect_timeout", 0.0, "--connect-timeout (AGENTCOMPACT_CONNECT_TIMEOUT) must be a "
                             "finite number > 0"),
    ("read_timeout", -1.0, "--read-timeout"),
    ("read_timeout", float("nan"), "--read-timeout"),
    ("read_timeout", float("inf"), "--read-timeout"),
])
def test_a_number_no_request_could_work_with_is_refused(field: str, value: object,
                                                        names: str) -> None:
    with pytest.raises(ConfigError) as info:
        ProxyConfig(**{field: value})  # type: ignore[arg-type]
    assert names in str(info.value)


@pytest.mark.parametrize(("flag", "value", "names"), [
    ("trigger", 0, "--trigger (AGENTCOMPACT_TRIGGER) must be an integer >= 1"),
    ("trigger", 1.5, "--trigger (AGENTCOMPACT_TRIGGER) must be an integer"),
    ("target", 0, "--target (AGENTCOMPACT_TARGET) must be in (0, --trigger=100000]"),
])
def test_a_budget_flag_no_request_could_work_with_is_refused(flag: str, value: object,
                                                             names: str) -> None:
    with pytest.raises(ConfigError) as info:
        engine_settings({}, **{flag: value})  # type: ignore[arg-type]
    assert names in str(info.value)
    with pytest.raises(ConfigError, match="--trigger"):
        ProxyConfig.from_env({"AGENTCOMPACT_TRIGGER": "0"})


def test_the_environment_is_checked_the_same_way() -> None:
    with pytest.raises(ConfigError, match="--max-sessions"):
        ProxyConfig.from_env({"AGENTCOMPACT_MAX_SESSIONS": "-1"})
    with pytest.raises(ConfigError, match="--connect-timeout"):
        ProxyConfig.from_env({"AGENTCOMPACT_CONNECT_TIMEOUT": "0"})
    assert ProxyConfig.from_env({"AGENTCOMPACT_MAX_SESSIONS": "1"}).max_sessions == 1


def test_a_store_url_is_checked_with_the_config() -> None:
    with pytest.raises(AgentCompactError, match="scheme 'postgres'"):
        ProxyConfig(store="postgres://u:pw@h/db")
    with pytest.raises(AgentCompactError, match="needs a scheme"):
        ProxyConfig(store="redis//host")


@pytest.mark.parametrize(("argv", "names"), [
    (["--max-sessions", "-1"], "--max-sessions"),
    (["--trigger", "0"], "--trigger (AGENTCOMPACT_TRIGGER) must be an integer >= 1"),
    (["--store", "redis://127.0.0.1:1/0?tll=60"], "unknown option 'tll'"),
    (["--store", "redis://:hunter2@127.0.0.1:1/0?bogus=1"], "unknown option 'bogus'"),
])
def test_the_proxy_command_says_one_line_and_exits_2(
        argv: list[str], names: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    pytest.importorskip("redis", reason="the 'redis' extra is not installed")
    import uvicorn

    def served(*args: object, **kwargs: object) -> None:
        raise AssertionError("the proxy started with a setting no request can work with")

    monkeypatch.setattr(uvicorn, "run", served)
    monkeypatch.setenv("AGENTCOMPACT_STATE_DIR", str(tmp_path))
    parser = argparse.ArgumentParser()
    _add_arguments(parser)
    assert run(parser.parse_args(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert names in err and len(err.splitlines()) == 1 and "hunter2" not in err


def test_the_proxy_process_freezes_what_it_loaded_and_collects_young_objects_less_often(
) -> None:
    """``agentcompact proxy`` tunes its own process's collector (in a child process
    here: the test process's collector stays as it is)."""
    import subprocess
    import sys

    code = ("import gc; from agentcompact.integrations.proxy._cli import tune_gc, "
            "GC_THRESHOLDS; before = gc.get_threshold(); tune_gc(); "
            "print(before, gc.get_threshold() == GC_THRESHOLDS, gc.get_freeze_count() > 1000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out == ["(700,", "10,", "10)", "True", "True"]
