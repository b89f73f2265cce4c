"""Store URLs are checked whole at start (#36 items 8, 9): an unknown scheme or option, a
malformed URL or a value out of range is one ``StoreError`` naming the problem and the
accepted forms — never a store that says it is available while every request fails, never
a SQLite file named after a URL it could not read. Messages never repeat the URL (it may
hold a password)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentcompact import open_archive
from agentcompact._archive import ArchivedItem, handle_of
from agentcompact.errors import StoreError
from agentcompact.stores import SharedPrefixStore, check_store_url, store_from_url

from .conftest import RedisServer

PASSWORD = "hunter2-store-password"


@pytest.mark.parametrize(("url", "names"), [
    ("postgres://u:hunter2-store-password@h/db", "scheme 'postgres'"),
    ("redis//host", "needs a scheme"),
    ("rediss:/h:1", "(no host)"),
    ("redis://h:notaport", "port"),
    ("redis://h:6379/x", "database is a number"),
    ("sqlite://rel.db", "sqlite:///PATH"),
    ("sqlite:///", "sqlite:///PATH"),
    ("unix://", "unix:///PATH"),
    ("redis://h:1?bogus=1", "unknown option 'bogus'"),
    ("redis://h:1?tll=600", "unknown option 'tll'"),
    ("redis://h:1?tll=", "unknown option 'tll'"),
    ("redis://:hunter2-store-password@h:1?ttl=abc", "option ttl must be an integer >= 0"),
    ("redis://h:1?ttl=-5", "option ttl must be an integer >= 0"),
    ("redis://h:1?log_max=0", "option log_max must be an integer >= 1"),
    ("redis://h:1?timeout=0", "option timeout must be a number"),
    ("redis://h:1?cache_entries=-1", "option cache_entries must be an integer >= 1"),
    ("redis://h:1?retry_after=nan", "option retry_after must be a number >= 0"),
    ("sqlite:///s.db?max_entries=-1", "option max_entries must be an integer >= 1"),
    ("sqlite:///s.db?ttl=5", "unknown option(s) ['ttl']"),
])
def test_a_bad_store_url_is_refused_at_start_naming_the_problem(
        url: str, names: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("redis", reason="the 'redis' extra is not installed")
    monkeypatch.chdir(tmp_path)
    # open_archive reads a string with no scheme as a file path (its Python API); the mcp
    # command's --store takes URLs only (below)
    for make in (store_from_url, open_archive) if ":" in url else (store_from_url,):
        with pytest.raises(StoreError) as info:
            make(url)
        message = str(info.value)
        assert names in message and PASSWORD not in message
        assert "\n" not in message
    assert list(tmp_path.iterdir()) == []  # no file named after the URL


def test_the_accepted_forms_pass(tmp_path: Path) -> None:
    pytest.importorskip("redis", reason="the 'redis' extra is not installed")
    for url in ("memory", "memory:", f"sqlite:///{tmp_path}/s.db?max_entries=10",
                "redis://h:1/0?ttl=0&prefix=x:&socket_keepalive=true&retry_after=1",
                "rediss://:pw@h:6380/2?ssl_cert_reqs=none", "unix:///run/redis.sock?db=3"):
        check_store_url(url)
        store_from_url(url)
    assert not (tmp_path / "s.db").exists()  # opened on first use


def test_redis_options_refused_before_reaching_a_real_server(
        redis_server: RedisServer, redis_url: str) -> None:
    """Before: ``?bogus=1`` and ``?tll=`` built a store whose status said available while
    every call failed with a TypeError (fail-open, so every request compacted locally)."""
    for bad in ("bogus=1", "tll=60"):
        with pytest.raises(StoreError, match="unknown option"):
            store_from_url(f"{redis_url}?{bad}")
    store = store_from_url(f"{redis_url}?ttl=60&socket_keepalive=true")
    assert isinstance(store, SharedPrefixStore)
    assert store.version >= 0 and store.status()["available"]
    assert store.status()["failures"] == 0
    store.close()


def test_a_unix_socket_url_reaches_the_server(tmp_path: Path) -> None:
    """``unix:///path`` lost its ``//`` on the way to redis-py (which refused it)."""
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    pytest.importorskip("redis", reason="the 'redis' extra is not installed")
    sock = tmp_path / "redis.sock"
    proc = subprocess.Popen([shutil.which("redis-server") or "", "--port", "0",
                             "--unixsocket", str(sock), "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        import time

        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        archive = open_archive(f"unix://{sock}?db=1")
        assert archive is not None
        text = "unix socket original " * 40
        archive.put_many([ArchivedItem(handle_of(text), text)])
        status = archive.status()  # type: ignore[attr-defined]
        assert status["available"] and status["written"] == 1, status
        assert status["where"] == f"unix://{sock}"
        archive.close()  # type: ignore[attr-defined]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("url", ["postgres://u:hunter2-store-password@db.example/x",
                                 "redis//host", "rediss:/h:1", "redis://h:1?tll=5"])
def test_mcp_refuses_a_store_that_is_not_a_store_url(url: str, tmp_path: Path) -> None:
    """``agentcompact mcp --store postgres://…`` (or ``redis//host``) made a SQLite file
    named after the URL and answered every expand "unknown handle"."""
    pytest.importorskip("mcp", reason="the 'mcp' extra is not installed")
    out = subprocess.run([sys.executable, "-m", "agentcompact", "mcp", "--store", url],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode != 0
    assert "store URL" in out.stderr and PASSWORD not in out.stderr
    assert list(tmp_path.iterdir()) == []
