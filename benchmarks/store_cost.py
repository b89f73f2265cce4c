"""What a persistent or shared prefix store costs per proxied request, and what it keeps
over a restart.

**Cost.** Real Claude Code sessions (the three main ones, 116k-144k tokens, Anthropic
dialect) are replayed request by request (each model call point: the history so far)
through an ``Engine`` as the proxy drives it (the store's version read, then ``compact``),
cliff strategy, tiktoken, trigger 100k / target 50k (the proxy's defaults). The store is
wrapped in a timer summing the time spent inside its ``version`` / ``get`` / ``put``
per request, and inside the archive of the same URL (the cliff strategy's
``put_many`` of what a compaction drops), as the proxy's store holds both. Stores, all in
one run, sessions interleaved: ``memory`` (the baseline),
``sqlite`` (a temp file), ``redis`` (a ``redis-server`` started here on loopback, no
persistence), and the two shared ones as **replicas**: requests alternate between two
engines, each with its own store object on the same backend (as two proxy processes
would: every other request finds an entry the other replica put). Prints p50 / p99 of
the store time per request, and the p50 added over memory (target: <= 1 ms).

**Restart.** The same sessions, a restart after every ``--restart-every`` requests (a
new engine and a new store object from the same URL, as a restarted process opens it).
The provider's prompt cache is modelled as a hit on the longest common prefix (in
tokens) with the previous request of the session; the share of cached-prefix tokens over
the ``--after`` requests following each restart is printed for: no restart, restart on
SQLite, restart with a memory store (everything forgotten). Twice: with the cliff strategy
(deterministic: a fresh engine recomputes the same prefix, so even a memory store loses
nothing), and with the summary strategy against a summarizer that answers differently on
every call (the upstream simulator standing in for a sampling LLM).

**Proxy restart, default settings.** The same measure through real ``agentcompact proxy``
processes run with the default store (no ``--store``: the SQLite file in ``--state-dir``)
and the summary strategy against the sampling summarizer: each session's requests are
sent as Anthropic bodies, the process is stopped and started again over the same folder
every ``--restart-every`` requests, and the bodies the upstream simulator received are
compared: no restart, restart with the default store, restart with ``--store memory``
(``--no-proxy`` skips it).

    TIKTOKEN_CACHE_DIR=../shared/data/tiktoken python benchmarks/store_cost.py
        [--repeat 3] [--restart-every 40] [--after 10] [--no-proxy]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentcompact import Budget, Engine, PrefixEntry, PrefixStore, StrategySettings, get_dialect
from agentcompact._archive import MemoryArchive, SharedArchive
from agentcompact.integrations.proxy._speculation import Speculation
from agentcompact.stores import backend_from_url, store_from_url
from agentcompact.trajectory import load

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "trajectories"
CLAUDE = sorted((DATA / "claude-code").glob("*-*-*-*-*.jsonl"))
BUDGET = Budget(trigger_tokens=100_000, target_tokens=50_000)


class Timed:
    """A store, and the archive of its URL, with the time spent inside them summed
    (``spent``, seconds)."""

    def __init__(self, store: PrefixStore, archive: Any) -> None:
        self.store, self.spent = store, 0.0
        self.archive = TimedArchive(archive, self)

    @property
    def version(self) -> int | None:
        t0 = time.perf_counter()
        v = getattr(self.store, "version", None)
        self.spent += time.perf_counter() - t0
        return v

    def get(self, key: str) -> PrefixEntry | None:
        t0 = time.perf_counter()
        hit = self.store.get(key)
        self.spent += time.perf_counter() - t0
        return hit

    def put(self, key: str, entry: PrefixEntry) -> None:
        t0 = time.perf_counter()
        self.store.put(key, entry)
        self.spent += time.perf_counter() - t0


class TimedArchive:
    """The archive the cliff strategy writes its dropped originals to, timed into the
    store's ``spent``: the proxy's default store holds both."""

    def __init__(self, archive: Any, timed: Timed) -> None:
        self.archive, self.timed = archive, timed

    def put_many(self, items: Any) -> None:
        t0 = time.perf_counter()
        self.archive.put_many(items)
        self.timed.spent += time.perf_counter() - t0

    def get(self, handle: str) -> Any:
        return self.archive.get(handle)

    def search(self, query: str, limit: int = 10) -> Any:
        return self.archive.search(query, limit)


def timed(url: str) -> Timed:
    """A new store object and archive object on ``url`` (a new process's)."""
    if url.startswith("memory"):
        return Timed(store_from_url(url), MemoryArchive())
    return Timed(store_from_url(url), SharedArchive(backend_from_url(url)[0]))


def sessions() -> list[list[Any]]:
    out = []
    for path in CLAUDE:
        (traj,) = load(path)
        out.append(traj.messages)
    return out


def call_points(messages: list[Any]) -> list[int]:
    dialect = get_dialect("anthropic")
    return [i for i in range(1, len(messages) + 1)
            if i == len(messages) or (dialect.is_model_output(messages[i])
                                      and not dialect.is_model_output(messages[i - 1]))]


SPECULATION = Speculation()


def engine(store: PrefixStore, counter: Any, strategy: str = "cliff", **settings: Any
           ) -> Engine:
    return Engine(StrategySettings(strategy, **settings), "anthropic", BUDGET, counter=counter,
                  store=store)


def replay_cost(messages: list[Any], stores: list[Timed], counter: Any) -> list[float]:
    """Store seconds per request; request ``i`` served by ``stores[i % len]``'s engine."""
    engines = [engine(s, counter, options={"archive": s.archive})
               for s in stores]
    out = []
    for i, c in enumerate(call_points(messages)):
        e, s = engines[i % len(engines)], stores[i % len(stores)]
        s.spent = 0.0
        _ = SPECULATION.store_version(e)  # the proxy reads it before compacting
        e.compact(messages[:c])
        out.append(s.spent)
    return out


@contextmanager
def redis_server() -> Iterator[str | None]:
    exe = shutil.which("redis-server")
    if exe is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", tmp],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def cost(sessions_: list[list[Any]], urls: dict[str, Callable[[], str]], repeat: int,
         counter: Any) -> None:
    kinds = ["memory"] + [k for k in urls] + [f"{k} replicas" for k in urls]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(repeat):
        for messages in sessions_:
            for kind in kinds:  # interleaved: load changes hit every kind alike
                base = kind.split()[0]
                if base == "memory":
                    stores = [timed("memory:")]
                else:
                    url = urls[base]()
                    n = 2 if kind.endswith("replicas") else 1
                    stores = [timed(url) for _ in range(n)]
                times[kind] += replay_cost(messages, stores, counter)
    base50 = pct(times["memory"], 0.5)
    print(f"store time per request over {len(times['memory'])} requests "
          f"({len(sessions_)} Claude Code sessions x {repeat}), load {os.getloadavg()[0]:.1f}")
    print(f"{'store':<18}{'p50 ms':>9}{'p99 ms':>9}{'added p50':>11}{'ratio p50':>11}")
    for kind in kinds:
        p50, p99 = pct(times[kind], 0.5), pct(times[kind], 0.99)
        ratio = p50 / base50 if base50 else float("nan")
        print(f"{kind:<18}{p50:>9.3f}{p99:>9.3f}{p50 - base50:>+11.3f}{ratio:>11.1f}")


def common_tokens(a: list[Any], b: list[Any], count: Callable[[list[Any]], int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return count(a[:n]) if n else 0


def restart_share(sessions_: list[list[Any]], every: int, after: int, counter: Any,
                  sqlite_url: Callable[[], str], strategy: dict[str, Any]) -> None:
    """Only restarts of a session already sending a compacted prefix are counted (before
    its first cliff a restart loses nothing, with any store)."""
    name = strategy.get("strategy", "cliff")
    print(f"\n{name}: provider-cached share of input tokens over the {after} requests after "
          f"a restart (every {every} requests) of a session sending a compacted prefix")
    measure = engine(store_from_url("memory:"), counter)
    starts = [_compacted_restarts(messages, every, counter) for messages in sessions_]
    for mode in ("no restart", "restart, sqlite", "restart, memory"):
        url = sqlite_url() if mode.endswith("sqlite") else "memory:"
        cached = total = compactions = 0
        for messages, restarts in zip(sessions_, starts):
            e, prev = engine(store_from_url(url), counter, **strategy), None
            for i, c in enumerate(call_points(messages)):
                if i and i % every == 0 and mode != "no restart":
                    e = engine(store_from_url(url), counter, **strategy)
                result = e.compact(messages[:c])
                compactions += bool(result.compacted)
                if prev is not None and any(s <= i < s + after for s in restarts):
                    cached += common_tokens(result.messages, prev, measure.count)
                    total += measure.count(result.messages)
                prev = result.messages
        print(f"  {mode:<18} {cached / max(total, 1):6.1%}  ({cached} of {total} tokens; "
              f"{compactions} compactions)")
    print(f"  ({sum(map(len, starts))} restarts counted)")


def _compacted_restarts(messages: list[Any], every: int, counter: Any) -> list[int]:
    """Restart points (multiples of ``every``) after the session's first compaction."""
    points = call_points(messages)
    probe = engine(store_from_url("memory:"), counter)
    first = next((i for i, c in enumerate(points) if probe.compact(messages[:c]).compacted),
                 len(points))
    return [i for i in range(every, len(points), every) if i > first]


def proxy_restart_share(sessions_: list[list[Any]], every: int, after: int, counter: Any,
                        tmp: str) -> None:
    """``restart_share`` through real proxy processes with their default store."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.scale.proxies
    from agentcompact.testing import Script, UpstreamSim, serve
    from tests.scale.proxies import ProxyProcess, send

    calls = iter(range(1 << 30))

    def sampled(body: dict[str, Any]) -> str:
        return f"Summary {next(calls)}: the user asked for a fix; files were read and edited."

    print(f"\nproxy (default store, summary strategy): provider-cached share of input tokens "
          f"over the {after} requests after a restart (every {every} requests) of a session "
          "sending a compacted prefix")
    measure = engine(store_from_url("memory:"), counter)
    starts = [_compacted_restarts(messages, every, counter) for messages in sessions_]
    folders = iter(range(1 << 30))
    with serve(UpstreamSim(Script(then=sampled))) as sim:
        env = {"AGENTCOMPACT_SUMMARIZER_BASE_URL": sim.base_url + "/v1",
               "AGENTCOMPACT_SUMMARIZER_MODEL": "sim-model"}
        for mode, store in (("no restart", None), ("restart, default", None),
                            ("restart, memory", "memory")):
            cached = total = restarts_s = 0.0
            for n, (messages, restarts) in enumerate(zip(sessions_, starts)):
                proxy = ProxyProcess(sim.base_url, store, env=env, extra=[
                    "--strategy", "summary", "--state-dir", f"{tmp}/proxy-{next(folders)}"])
                sim.sim.clear()  # type: ignore[union-attr]
                proxy.start()
                try:
                    for i, c in enumerate(call_points(messages)):
                        if i and i % every == 0 and mode != "no restart":
                            t0 = time.perf_counter()
                            proxy.stop()
                            proxy.start()
                            restarts_s += time.perf_counter() - t0
                        send(proxy, {"model": "claude-sim", "max_tokens": 32,
                                     "messages": messages[:c]}, session=f"session-{n}")
                finally:
                    proxy.stop()
                sent = [r.body["messages"] for r in sim.requests if r.path == "/v1/messages"]
                for i in range(1, len(sent)):
                    if any(s <= i < s + after for s in restarts):
                        cached += common_tokens(sent[i], sent[i - 1], measure.count)
                        total += measure.count(sent[i])
            print(f"  {mode:<18} {cached / max(total, 1):6.1%}  ({cached:.0f} of {total:.0f} "
                  f"tokens{f'; restarts took {restarts_s:.0f} s' if restarts_s else ''})")
    print(f"  ({sum(map(len, starts))} restarts counted)")


@contextmanager
def sampled_summarizer() -> Iterator[dict[str, Any]]:
    """The upstream simulator as a summarizer that answers differently on every call, as
    an LLM sampling at a temperature does."""
    import itertools

    from agentcompact.testing import Script, UpstreamSim, serve

    calls = itertools.count()

    def sampled(body: dict[str, Any]) -> str:
        return f"Summary {next(calls)}: the user asked for a fix; files were read and edited."

    with serve(UpstreamSim(Script(then=sampled))) as server:
        yield {"strategy": "summary", "base_url": server.base_url + "/v1",
               "model": "sim-model", "api_key": "sk-sim"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--restart-every", type=int, default=40)
    ap.add_argument("--after", type=int, default=10)
    ap.add_argument("--no-proxy", action="store_true", help="skip the proxy processes")
    args = ap.parse_args(argv)
    if not CLAUDE:
        print(f"no Claude Code sessions under {DATA}", file=sys.stderr)
        return 1
    from agentcompact._tokens import make_counter

    counter = make_counter("tiktoken")
    data = sessions()
    with tempfile.TemporaryDirectory() as tmp, redis_server() as redis:
        files = iter(range(1 << 30))

        def sqlite() -> str:
            return f"sqlite:///{tmp}/{next(files)}.db"

        def fresh_redis() -> str:
            import redis as redis_py

            assert redis is not None
            redis_py.Redis.from_url(redis).flushall()
            return redis

        urls: dict[str, Callable[[], str]] = {"sqlite": sqlite}
        if redis is not None:
            urls["redis"] = fresh_redis
        else:
            print("redis-server not installed: Redis not measured", file=sys.stderr)
        cost(data, urls, args.repeat, counter)
        restart_share(data, args.restart_every, args.after, counter, sqlite, {})
        with sampled_summarizer() as summary:
            restart_share(data, args.restart_every, args.after, counter, sqlite, summary)
        if not args.no_proxy:
            proxy_restart_share(data, args.restart_every, args.after, counter, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
