"""``agentcompact watch``: the view of a running proxy's status page."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
from rich.console import Console

from agentcompact import Budget
from agentcompact.integrations.proxy._watch import render

from .conftest import ProxyFactory
from .histories import anthropic_history
from .test_proxy_faults import MODEL, post


def _two_sessions(proxy: object) -> None:
    for session, turns in (("a", 20), ("b", 4)):
        body = {"model": MODEL, "max_tokens": 64, "messages": anthropic_history(turns),
                "metadata": {"user_id": f'{{"session_id":"{session}"}}'}}
        assert post(proxy, "/v1/messages", body).status_code == 200  # type: ignore[arg-type]


def test_render_shows_each_session_with_its_figures(start_proxy: ProxyFactory) -> None:
    proxy = start_proxy(budget=Budget(3000), counter="chars")
    _two_sessions(proxy)
    status = httpx.get(f"{proxy.base_url}/agentcompact/status").json()
    console = Console(record=True, width=160)
    console.print(render(status))
    text = console.export_text()
    for key, session in status["sessions"].items():
        assert key in text
        assert f"{session['tokens_in']:,}" in text and f"{session['tokens_out']:,}" in text
    assert f"{status['compactions']} compactions" in text and "cache share" in text


def test_watch_once_prints_the_snapshot_of_a_running_proxy(start_proxy: ProxyFactory) -> None:
    proxy = start_proxy(budget=Budget(3000), counter="chars")
    _two_sessions(proxy)
    done = subprocess.run([sys.executable, "-m", "agentcompact", "watch", "--once",
                           "--url", proxy.base_url],
                          env={**os.environ, "COLUMNS": "160"}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    status = httpx.get(f"{proxy.base_url}/agentcompact/status").json()
    assert all(key in done.stdout for key in status["sessions"])


def test_watch_names_a_proxy_that_is_not_there() -> None:
    done = subprocess.run([sys.executable, "-m", "agentcompact", "watch", "--once",
                           "--url", "http://127.0.0.1:9"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1 and "no proxy status at http://127.0.0.1:9" in done.stderr
