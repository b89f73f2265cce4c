"""Real ``agentcompact proxy`` processes for the replica tests and the store benchmark."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.integrations.proxy.histories import anthropic_history

CLI = [sys.executable, "-m", "agentcompact", "proxy"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ProxyProcess:
    """``agentcompact proxy`` in a subprocess; ``start()`` waits for its status page."""

    def __init__(self, upstream: str, store: str | None, *, extra: Sequence[str] = (),
                 log: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.upstream, self.store, self.extra, self.log = upstream, store, list(extra), log
        self.env = env or {}
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ProxyProcess:
        env = dict(os.environ, PYTHONHASHSEED="0", **self.env)
        store = [] if self.store is None else ["--store", self.store]  # None: the default
        args = [*CLI, "--port", str(self.port), "--anthropic-upstream", self.upstream,
                "--openai-upstream", self.upstream, *store, "--quiet",
                "--log-level", "WARNING", *self.extra]
        if self.log is None:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, env=env)
        else:
            with open(self.log, "ab") as out:  # the child keeps its own descriptor
                self.proc = subprocess.Popen(args, stdout=out, stderr=out, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited with status {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/agentcompact/status", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("proxy did not answer its status page within 60 s")

    def status(self) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(self.url + "/agentcompact/status", timeout=5).json()
        return answer

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def session_turn(turns: int) -> dict[str, Any]:
    """An Anthropic request body of a coding session after ``turns`` tool rounds (what a
    client sends: the whole original history every time)."""
    return {"model": "claude-sim", "max_tokens": 32, "system": "You are a coding agent.",
            "messages": anthropic_history(turns)}


def send(proxy: ProxyProcess, body: dict[str, Any], session: str | None = None) -> None:
    headers = {"x-api-key": "sk-test", "anthropic-version": "2023-06-01"}
    if session is not None:
        headers["x-session-id"] = session
    answer = httpx.post(proxy.url + "/v1/messages", json=body, timeout=60, headers=headers)
    assert answer.status_code == 200, answer.status_code
